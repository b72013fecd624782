//go:build integration

package sockscmd

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/proxy"
)

// benchBytes is what one bulk round moves through the proxy, from a backend to the client.
const benchBytes = 256 << 20

// BenchmarkVsOpenSSH compares konnect socks with OpenSSH's `ssh -D` against the same sshd on loopback, in
// one run, alternating the two (A B A B ...) after a warm-up:
//
//	go test -run '^$' -bench VsOpenSSH -benchtime 1x ./cmd/internal/sockscmd
//
// It reports MB/s for a 256 MiB download and p50/p99 connect latency (SOCKS5 connect to a fresh
// destination connection plus its first byte), and the ratios konnect/ssh. Three pairings: each side's
// default cipher (konnect prefers aes128-gcm, OpenSSH chacha20-poly1305), and both sides on the same cipher.
func BenchmarkVsOpenSSH(b *testing.B) {
	harness.RequireSSH(b, "ssh")
	rounds := 5
	if v, _ := strconv.Atoi(os.Getenv("KONNECT_BENCH_ROUNDS")); v > 0 {
		rounds = v
	}
	dir := b.TempDir()
	key, pub := harness.SSHKeyPair(b, dir, "id_client", "")
	srv := harness.StartSSHD(b, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	bulk := bulkBackend(b)
	small := smallBackend(b)

	for _, pair := range []struct {
		name          string
		konnectCipher string // "" = konnect's default
		sshCipher     string // "" = OpenSSH's default
	}{
		{"defaults", "", ""},
		{"both-chacha20", "chacha20-poly1305@openssh.com", "chacha20-poly1305@openssh.com"},
		{"both-aes128gcm", "aes128-gcm@openssh.com", "aes128-gcm@openssh.com"},
	} {
		b.Run(pair.name, func(b *testing.B) {
			kAddr, kPid := startKonnect(b, srv, key, kh, pair.konnectCipher)
			oAddr, oPid := startOpenSSH(b, srv, key, kh, pair.sshCipher)
			// Warm-up: one short transfer each.
			download(b, kAddr, bulk, 16<<20)
			download(b, oAddr, bulk, 16<<20)
			var kMBs, oMBs []float64
			var kLat, oLat []time.Duration
			var kCPU, oCPU, kSSHD, oSSHD time.Duration
			sshdCPU := func() (d time.Duration) {
				for _, pid := range srv.Pids() {
					d += harness.CPUTime(pid)
				}
				return d
			}
			timed := func(pid int, cpu, sshd *time.Duration, f func()) {
				c0, s0 := harness.CPUTime(pid), sshdCPU()
				f()
				*cpu += harness.CPUTime(pid) - c0
				*sshd += sshdCPU() - s0
			}
			for i := 0; i < b.N*rounds; i++ {
				timed(kPid, &kCPU, &kSSHD, func() { kMBs = append(kMBs, download(b, kAddr, bulk, benchBytes)) })
				timed(oPid, &oCPU, &oSSHD, func() { oMBs = append(oMBs, download(b, oAddr, bulk, benchBytes)) })
				kLat = append(kLat, connectLatency(b, kAddr, small, 50)...)
				oLat = append(oLat, connectLatency(b, oAddr, small, 50)...)
			}
			gib := float64(b.N*rounds*benchBytes) / (1 << 30)
			perGiB := func(d time.Duration) float64 { return d.Seconds() / gib }
			km, om := median(kMBs), median(oMBs)
			b.ReportMetric(km, "konnect-MB/s")
			b.ReportMetric(om, "ssh-D-MB/s")
			b.ReportMetric(km/om, "throughput-ratio")
			b.ReportMetric(perGiB(kCPU), "konnect-cpu-s/GiB")
			b.ReportMetric(perGiB(oCPU), "ssh-D-cpu-s/GiB")
			kp50, kp99 := percentile(kLat, 50), percentile(kLat, 99)
			op50, op99 := percentile(oLat, 50), percentile(oLat, 99)
			b.ReportMetric(float64(kp50.Microseconds()), "konnect-p50-µs")
			b.ReportMetric(float64(kp99.Microseconds()), "konnect-p99-µs")
			b.ReportMetric(float64(op50.Microseconds()), "ssh-D-p50-µs")
			b.ReportMetric(float64(op99.Microseconds()), "ssh-D-p99-µs")
			b.Logf("%s: client CPU per GiB konnect %.2fs, ssh -D %.2fs; sshd CPU per GiB serving konnect %.2fs, serving ssh -D %.2fs",
				pair.name, perGiB(kCPU), perGiB(oCPU), perGiB(kSSHD), perGiB(oSSHD))
			b.Logf("%s: konnect %.0f MB/s (min %.0f max %.0f), ssh -D %.0f MB/s (min %.0f max %.0f), ratio %.2fx; connect p50 %s vs %s, p99 %s vs %s",
				pair.name, km, slices.Min(kMBs), slices.Max(kMBs), om, slices.Min(oMBs), slices.Max(oMBs), km/om, kp50, op50, kp99, op99)
		})
	}
}

// startKonnect runs `konnect socks` as a separate process, like a user would, and returns its SOCKS address
// and pid.
func startKonnect(b *testing.B, srv *harness.SSHD, key, kh, cipher string) (string, int) {
	port := harness.FreePort(b)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	health := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(b)))
	args := []string{"-D", addr, "--health-listen", health, "-i", key, "--known-hosts", kh, "-F", "none"}
	if cipher != "" {
		args = append(args, "--cipher", cipher)
	}
	cmd := exec.Command(os.Args[0], append(args, srv.Addr())...)
	cmd.Env = append(os.Environ(), childEnv+"=1", "SSH_AUTH_SOCK=")
	// Runtime settings for the konnect process alone, for experiments.
	for _, v := range []string{"GOMAXPROCS", "GOGC"} {
		if s := os.Getenv("KONNECT_CHILD_" + v); s != "" {
			cmd.Env = append(cmd.Env, v+"="+s)
		}
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start konnect socks: %v", err)
	}
	b.Cleanup(func() {
		// SIGTERM first: konnect shuts down cleanly (and flushes a profile if one is being taken).
		cmd.Process.Signal(syscall.SIGTERM)
		t := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
		cmd.Wait()
		t.Stop()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if resp, err := http.Get("http://" + health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return addr, cmd.Process.Pid
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("konnect socks not ready on %s", health)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startOpenSSH(b *testing.B, srv *harness.SSHD, key, kh, cipher string) (string, int) {
	port := harness.FreePort(b)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{"-N", "-F", "/dev/null", "-D", addr, "-i", key, "-p", strconv.Itoa(srv.Port),
		"-o", "UserKnownHostsFile=" + kh, "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
		"-o", "IdentitiesOnly=yes", "-o", "ExitOnForwardFailure=yes"}
	if cipher != "" {
		args = append(args, "-c", cipher)
	}
	cmd := exec.Command("ssh", append(args, "root@127.0.0.1")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.TempDir()}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start ssh -D: %v", err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			b.Fatalf("ssh -D did not listen on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bulkBackend sends as many bytes as the client asks for (an 8-byte decimal count, then EOF) and closes.
func bulkBackend(b *testing.B) string {
	chunk := make([]byte, 1<<20)
	return harness.Serve(b, func(c net.Conn) {
		var hdr [12]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n, _ := strconv.Atoi(string(hdr[:]))
		for n > 0 {
			w, err := c.Write(chunk[:min(n, len(chunk))])
			if err != nil {
				return
			}
			n -= w
		}
	}).Addr
}

// smallBackend writes one byte and closes.
func smallBackend(b *testing.B) string {
	return harness.Serve(b, func(c net.Conn) { c.Write([]byte{1}) }).Addr
}

// download fetches n bytes from the bulk backend through the SOCKS5 proxy and returns MB/s.
func download(b *testing.B, proxyAddr, backend string, n int) float64 {
	d, err := proxy.SOCKS5("tcp", proxyAddr, nil, proxy.Direct)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	c, err := d.Dial("tcp", backend)
	if err != nil {
		b.Fatalf("dial via %s: %v", proxyAddr, err)
	}
	defer c.Close()
	fmt.Fprintf(c, "%012d", n)
	got, err := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
	if err != nil || got != int64(n) {
		b.Fatalf("download via %s: %d of %d bytes: %v", proxyAddr, got, n, err)
	}
	return float64(n) / 1e6 / time.Since(t0).Seconds()
}

// connectLatency opens count connections one after another and times each up to the first byte.
func connectLatency(b *testing.B, proxyAddr, backend string, count int) []time.Duration {
	d, err := proxy.SOCKS5("tcp", proxyAddr, nil, proxy.Direct)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]time.Duration, 0, count)
	var one [1]byte
	for i := 0; i < count; i++ {
		t0 := time.Now()
		c, err := d.Dial("tcp", backend)
		if err != nil {
			b.Fatalf("dial via %s: %v", proxyAddr, err)
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			b.Fatalf("read via %s: %v", proxyAddr, err)
		}
		out = append(out, time.Since(t0))
		c.Close()
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func percentile(v []time.Duration, p int) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}
