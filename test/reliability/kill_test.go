//go:build integration

package reliability

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
)

// killIterations is how often each kill test interrupts a run; the budget bounds the time on a slow machine.
const (
	killIterations = 30
	killBudget     = 45 * time.Second
)

// seed returns the random seed of a test (KONNECT_RELIABILITY_SEED reproduces a run) and logs it.
func seed(t *testing.T) *rand.Rand {
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("KONNECT_RELIABILITY_SEED"); v != "" {
		var err error
		if s, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("KONNECT_RELIABILITY_SEED: %v", err)
		}
	}
	t.Logf("seed %d (set KONNECT_RELIABILITY_SEED to repeat)", s)
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// killAfter runs konnect with args and sends SIGKILL after delay. It reports whether the process was
// killed (false: it finished first) and its exit code when it finished.
func killAfter(t *testing.T, delay time.Duration, args ...string) (killed bool, code int) {
	t.Helper()
	sent, killed, code := signalAfter(t, syscall.SIGKILL, delay, args...)
	return sent && killed, code
}

// signalAfter runs konnect with args and sends sig after delay. It reports whether sig was sent (false: the
// run finished first), whether the signal killed the process, and its exit code when it exited.
func signalAfter(t *testing.T, sig syscall.Signal, delay time.Duration, args ...string) (sent, killed bool, code int) {
	t.Helper()
	cmd := exec.Command(konnectBin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent/kubeconfig")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return false, false, ee.ExitCode()
		}
		return false, false, 0
	case <-time.After(delay):
	}
	_ = cmd.Process.Signal(sig)
	err := <-done
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true, true, -1
		}
		return true, false, ee.ExitCode()
	}
	return true, false, 0
}

// fastest returns the shortest wall time of n runs: on a loaded machine the median overstates the run
// time, and most kills would then land after the run finished.
func fastest(n int, run func(i int)) time.Duration {
	var d []time.Duration
	for i := range n {
		start := time.Now()
		run(i)
		d = append(d, time.Since(start))
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[0]
}

// initRunTime is the shortest of five runs of konnect init into fresh directories below base.
func initRunTime(t *testing.T, base string) time.Duration {
	t.Helper()
	return fastest(5, func(i int) {
		dir := filepath.Join(base, "measure-"+strconv.Itoa(i))
		if r := konnect(t, time.Minute, initArgs(dir)...); r.code != 0 {
			t.Fatalf("init: %s", r)
		}
	})
}

func initArgs(dir string) []string {
	return []string{"init", "--dir", dir, "--control-plane-address", "127.0.0.1",
		"--apiserver-url", "https://127.0.0.1:6443",
		// A fixed socket path keeps the written configuration the same in a copy of the directory.
		"--uds-name", "/run/konnect-reliability/konnectivity-server.socket"}
}

// initMTLS runs konnect init, then adds the agents' client certificate (konnect init phase certs
// --agent-auth mtls): the daemons here authenticate agents by certificate.
func initMTLS(t testing.TB, dir string) {
	t.Helper()
	if r := konnect(t, time.Minute, initArgs(dir)...); r.code != 0 {
		t.Fatalf("init: %s", r)
	}
	if r := konnect(t, time.Minute, append([]string{"init", "phase", "certs", "--agent-auth", "mtls"}, initArgs(dir)[1:]...)...); r.code != 0 {
		t.Fatalf("init phase certs --agent-auth mtls: %s", r)
	}
}

// caKeyWithoutCert is the refusal konnect init once gave when a kill left a CA key without its certificate;
// the test names that regression precisely if it ever comes back.
const caKeyWithoutCert = "refusing to replace a CA key"

// checkAfterKill checks the invariants that must hold after any interruption, and that a rerun
// completes without changing any file the interrupted run had finished.
func checkAfterKill(t *testing.T, dir string, stats map[string]int) (ok, caKeyOnly bool) {
	t.Helper()
	failed := false
	errorf := func(format string, args ...any) {
		t.Helper()
		failed = true
		t.Errorf(format, args...)
	}
	st := inspectPKI(dir)
	for _, p := range st.problems {
		errorf("after kill: %s", p)
	}
	stats["temp files left"] += len(st.temps)
	for name, s := range st.pairs {
		if s == pairKeyOnly {
			stats["key without certificate: "+name]++
		}
	}
	before := snapshot(t, dir)
	r := konnect(t, time.Minute, initArgs(dir)...)
	if r.code != 0 {
		if strings.Contains(r.stderr, caKeyWithoutCert) {
			stats["rerun refused: CA key without certificate"]++
			errorf("rerun after kill -9 does not complete: the kill left a CA key without its certificate and init refuses it (product bug, see TestKillDuringInit/ca-key-left-by-kill):\n%s", r)
			return false, true
		}
		errorf("rerun after kill -9 failed:\n%s", r)
		return false, false
	}
	after := snapshot(t, dir)
	// Every file the killed run had completed is kept byte for byte by the rerun; the only exception is
	// a leaf key left without its certificate, which the rerun replaces.
	for path, b := range before {
		// The lock the killed run held (the kernel released it) is the rerun's to take and remove.
		if tempFile.MatchString(filepath.Base(path)) || b.sum == "" || path == ".konnect.lock" {
			continue
		}
		a, found := after[path]
		name := strings.TrimSuffix(filepath.Base(path), ".key")
		if strings.HasPrefix(path, "pki/") && st.pairs[name] == pairKeyOnly && issuers[name] != "" {
			continue
		}
		if !found || a.sum != b.sum {
			errorf("rerun changed %s, which the killed run had left (torn or replaced file)", path)
		}
	}
	final := inspectPKI(dir)
	for _, p := range final.problems {
		errorf("after rerun: %s", p)
	}
	for _, n := range []string{"ca", "front-proxy-ca", "front-proxy-client", "konnectivity-server-client", "konnectivity-server"} {
		if final.pairs[n] != pairComplete {
			errorf("after rerun: %s is not complete", n)
		}
	}
	if err := checkServerConf(dir); err != nil {
		errorf("after rerun: %v", err)
	}
	return !failed, false
}

// TestKillDuringInit kills konnect init with SIGKILL at random points, repeatedly: on a fresh directory
// and on one where the CAs exist and the leaves are being recreated. Afterwards every pair is complete
// and valid, a key waiting for its certificate, or absent; a rerun completes and keeps everything the
// killed run finished; an existing CA never changes.
func TestKillDuringInit(t *testing.T) {
	rng := seed(t)
	base := shortDir(t)
	d := initRunTime(t, base)
	t.Logf("konnect init takes %s (fastest of 5); kills are spread over [0, %s]", d, d*5/4)
	stats := map[string]int{}
	start := time.Now()
	for i := 0; i < killIterations && time.Since(start) < killBudget; i++ {
		dir := filepath.Join(base, "run-"+strconv.Itoa(i))
		// Fresh directory: everything, the CAs included, is created by the killed run.
		killed, code := killAfter(t, time.Duration(rng.Int64N(int64(d*5/4))), initArgs(dir)...)
		stats["runs"]++
		if killed {
			stats["killed"]++
		} else if code != 0 {
			t.Fatalf("iteration %d: init exited %d without being killed", i, code)
		}
		if ok, caKeyOnly := checkAfterKill(t, dir, stats); caKeyOnly {
			continue // reported; the other invariants are still checked in the next iterations
		} else if !ok {
			t.Fatalf("iteration %d (fresh directory) failed; stats %v", i, stats)
		}
		cas := caSums(t, dir)
		// Existing CAs: remove the leaves and everything derived, and kill the run that recreates them.
		for n, iss := range issuers {
			if iss != "" {
				os.Remove(filepath.Join(dir, "pki", n+".crt"))
				os.Remove(filepath.Join(dir, "pki", n+".key"))
			}
		}
		os.Remove(filepath.Join(dir, "konnectivity-server.conf"))
		os.RemoveAll(filepath.Join(dir, "manifests"))
		os.RemoveAll(filepath.Join(dir, "konnectivity-agent"))
		killed, _ = killAfter(t, time.Duration(rng.Int64N(int64(d*5/4))), initArgs(dir)...)
		stats["runs"]++
		if killed {
			stats["killed"]++
		}
		if got := caSums(t, dir); got != cas {
			t.Fatalf("iteration %d: a CA changed during a killed run:\nbefore %s\nafter  %s", i, cas, got)
		}
		if ok, _ := checkAfterKill(t, dir, stats); !ok {
			t.Fatalf("iteration %d (existing CAs) failed; stats %v", i, stats)
		}
		if got := caSums(t, dir); got != cas {
			t.Fatalf("iteration %d: a CA changed during the rerun:\nbefore %s\nafter  %s", i, cas, got)
		}
	}
	t.Logf("figures: %v", stats)

	// A kill right after the first write of a fresh run (ca.key) leaves the CA key alone. Nothing was
	// ever signed with it, yet the rerun refuses it, so an unattended retry never completes.
	t.Run("ca-key-left-by-kill", func(t *testing.T) {
		dir := filepath.Join(shortDir(t), "k")
		if r := konnect(t, time.Minute, initArgs(dir)...); r.code != 0 {
			t.Fatalf("init: %s", r)
		}
		ents, _ := os.ReadDir(filepath.Join(dir, "pki"))
		for _, e := range ents {
			if e.Name() != "ca.key" {
				os.Remove(filepath.Join(dir, "pki", e.Name()))
			}
		}
		for _, e := range []string{"konnectivity-server.conf", "egress-selector-configuration.yaml", "kube-apiserver.flags", "manifests", "konnectivity-agent"} {
			os.RemoveAll(filepath.Join(dir, e))
		}
		r := konnect(t, time.Minute, initArgs(dir)...)
		if r.code != 0 {
			t.Errorf("rerun after a kill that left only pki/ca.key (the first file a fresh init writes) does not complete:\n%s", r)
		}
	})
}

// caSums is a checksum line of every CA file present.
func caSums(t *testing.T, dir string) string {
	snap := snapshot(t, filepath.Join(dir, "pki"))
	var parts []string
	for _, f := range []string{"ca.crt", "ca.key", "front-proxy-ca.crt", "front-proxy-ca.key"} {
		parts = append(parts, f+"="+snap[f].sum)
	}
	return strings.Join(parts, " ")
}

// TestKillDuringCertsRenew kills konnect certs renew all at random points. Keys never change, every
// certificate is the old one or a new valid one, the CAs are untouched, and a rerun completes.
// TestInterruptDuringInit: konnect init interrupted with SIGINT or SIGTERM at any moment (Ctrl-C, a
// timeout's kill) exits with 128 + the signal's number, as a shell reports it, or ends before it has
// written anything, and leaves neither a temporary file nor its lock file behind; a rerun completes.
// Without its own handling Go ends the process at the signal, wherever it is: 28 runs of 30 left the lock
// file behind, and now and then a temporary file beside a key.
func TestInterruptDuringInit(t *testing.T) {
	rng := seed(t)
	base := shortDir(t)
	d := initRunTime(t, base)
	stats := map[string]int{}
	start := time.Now()
	for i := 0; i < killIterations && time.Since(start) < killBudget; i++ {
		dir := filepath.Join(base, "run-"+strconv.Itoa(i))
		sig := []syscall.Signal{syscall.SIGINT, syscall.SIGTERM}[i%2]
		sent, killed, code := signalAfter(t, sig, time.Duration(rng.Int64N(int64(d*5/4))), initArgs(dir)...)
		stats["runs"]++
		switch {
		case !sent && code != 0:
			t.Fatalf("iteration %d: init exited %d without being interrupted", i, code)
		case !sent:
		case killed:
			// Before main catches signals (the packages' start-up takes a few milliseconds), the signal
			// ends the process as it would any Go program; nothing has been written by then.
			stats["ended before main"]++
		case code == 0:
			stats["finished before the signal took effect"]++
		case code != 128+int(sig):
			t.Fatalf("iteration %d: init exited %d after %s, want %d", i, code, sig, 128+int(sig))
		default:
			stats["interrupted"]++
		}
		if st := inspectPKI(dir); len(st.temps) > 0 {
			t.Errorf("iteration %d: temporary files left: %v", i, st.temps)
		}
		left := []string{}
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && !e.IsDir() && (e.Name() == ".konnect.lock" || tempFile.MatchString(e.Name())) {
				left = append(left, p)
			}
			return nil
		})
		if len(left) > 0 {
			t.Errorf("iteration %d: left behind after %s: %v", i, sig, left)
		}
		if r := konnect(t, time.Minute, initArgs(dir)...); r.code != 0 {
			t.Fatalf("iteration %d: rerun after %s failed:\n%s", i, sig, r)
		}
	}
	t.Logf("figures: %v", stats)
	if stats["interrupted"] == 0 {
		t.Errorf("no run exited with 128 + the signal's number in %d (%v): none caught the signal, or it always came too early or too late", stats["runs"], stats)
	}
}

// serverPodCurrent reports an error unless the digest annotation of the server's static pod in dir matches the
// files it mounts: else kubelet keeps the server on the files it started with.
func serverPodCurrent(dir string) error {
	path := filepath.Join(dir, "manifests", manifests.ServerPodFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	pod, err := kubeapiserver.DecodePod(data, path)
	if err != nil {
		return err
	}
	digest, err := manifests.FilesDigest(manifests.PodMountedFiles(pod))
	if err != nil {
		return err
	}
	if got := pod.Annotations[manifests.FilesDigestAnnotation]; got != digest {
		return fmt.Errorf("%s: annotation %s is %q, the files it mounts %q", path, manifests.FilesDigestAnnotation, got, digest)
	}
	return nil
}

func TestKillDuringCertsRenew(t *testing.T) {
	rng := seed(t)
	dir := filepath.Join(shortDir(t), "k")
	initMTLS(t, dir)
	renew := []string{"certs", "renew", "all", "--dir", dir}
	d := fastest(5, func(int) {
		if r := konnect(t, time.Minute, renew...); r.code != 0 {
			t.Fatalf("renew: %s", r)
		}
	})
	t.Logf("konnect certs renew all takes %s (fastest of 5); kills are spread over [0, %s]", d, d*5/4)
	keys := map[string]string{}
	for p, s := range snapshot(t, dir) {
		if strings.HasSuffix(p, ".key") {
			keys[p] = s.sum
		}
	}
	cas := caSums(t, dir)
	stats := map[string]int{}
	start := time.Now()
	for i := 0; i < killIterations && time.Since(start) < killBudget; i++ {
		killed, code := killAfter(t, time.Duration(rng.Int64N(int64(d*5/4))), renew...)
		stats["runs"]++
		if killed {
			stats["killed"]++
		} else if code != 0 {
			t.Fatalf("iteration %d: renew exited %d without being killed", i, code)
		}
		check := func(when string) {
			st := inspectPKI(dir)
			for _, p := range st.problems {
				t.Errorf("iteration %d %s: %s", i, when, p)
			}
			stats["temp files left"] += len(st.temps)
			for n, s := range st.pairs {
				if s != pairComplete && (n == "ca" || n == "front-proxy-ca" || keys["pki/"+n+".key"] != "") {
					t.Errorf("iteration %d %s: %s is not complete", i, when, n)
				}
			}
			snap := snapshot(t, dir)
			for p, sum := range keys {
				if snap[p].sum != sum {
					t.Errorf("iteration %d %s: key %s changed or was lost", i, when, p)
				}
			}
			if got := caSums(t, dir); got != cas {
				t.Errorf("iteration %d %s: a CA changed", i, when)
			}
			if err := checkServerConf(dir); err != nil {
				t.Errorf("iteration %d %s: %v", i, when, err)
			}
		}
		check("after kill")
		if r := konnect(t, time.Minute, renew...); r.code != 0 {
			t.Errorf("iteration %d: rerun of renew failed:\n%s", i, r)
		}
		check("after rerun")
		// A kill between the certificates and the pod leaves the pod behind; the rerun catches up.
		if err := serverPodCurrent(dir); err != nil {
			t.Errorf("iteration %d after rerun: %v", i, err)
		}
		if r := konnect(t, time.Minute, "certs", "check-expiration", "--dir", dir, "-o", "json"); r.code != 0 || strings.Contains(r.stdout, ".tmp-") {
			t.Errorf("iteration %d: check-expiration after the kill lists temporary files or fails:\n%s", i, r)
		}
		if t.Failed() {
			t.Fatalf("stopping after iteration %d; stats %v", i, stats)
		}
	}
	left := inspectPKI(dir).temps
	t.Logf("figures: %v; temporary files in pki/ at the end: %d", stats, len(left))
}
