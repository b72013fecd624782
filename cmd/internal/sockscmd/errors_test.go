//go:build integration

package sockscmd

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// konnectProcessEnv is konnectProcess with extra environment variables.
func konnectProcessEnv(t *testing.T, env []string, args ...string) (*exec.Cmd, *harness.SyncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"=1", "SSH_AUTH_SOCK="), env...)
	var out harness.SyncBuffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, &out
}

// Mistakes at start-up end `konnect socks` at once, with one clear error: a wrong key, a wrong port, no
// identity at all, a key others may read. Each is printed once, without the SSH library's prefixes.
func TestProcessStartMistakesEndTheCommand(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	wrong, _ := harness.SSHKeyPair(t, dir, "id_wrong", "")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	open := filepath.Join(dir, "id_open")
	pem, _ := os.ReadFile(key)
	os.WriteFile(open, pem, 0o600)
	os.Chmod(open, 0o644)
	closed := harness.FreePort(t)
	// As ssh, konnect looks for its default keys in the home directory of the passwd entry, whatever $HOME
	// says: the case of no identity at all needs none there.
	emptyHome := t.TempDir()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	var defaultKey string
	for _, k := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
		f := filepath.Join(u.HomeDir, ".ssh", k)
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			defaultKey = f
		}
	}

	for _, c := range []struct {
		name string
		env  []string
		args []string
		want []string // in the one error line
	}{
		{"key the server refuses", nil, []string{"-i", wrong, srv.Addr()},
			[]string{"ssh authentication to root@" + srv.Addr() + " failed", wrong + " (ED25519 SHA256:"}},
		{"port nobody listens on", nil, []string{"-i", key, "-p", strconv.Itoa(closed), "127.0.0.1"},
			[]string{fmt.Sprintf("cannot connect to root@127.0.0.1:%d", closed), "connection refused", "--retry-first"}},
		{"no identity at all", []string{"HOME=" + emptyHome}, []string{srv.Addr()},
			[]string{"no SSH identity to offer root@" + srv.Addr(), "no -i", filepath.Join(u.HomeDir, ".ssh", "id_ed25519")}},
		{"key others may read", nil, []string{"-i", open, srv.Addr()},
			[]string{"permissions 0644 for identity file " + open, "UNPROTECTED PRIVATE KEY FILE", "--allow-unprotected-key"}},
		{"host not in known_hosts", nil, []string{"-i", key, "--known-hosts", filepath.Join(dir, "absent"), srv.Addr()},
			[]string{"is not known: ED25519 SHA256:", "(or run once with --accept-new):"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "no identity at all" && defaultKey != "" {
				t.Skipf("this user has a default key, %s, which konnect offers", defaultKey)
			}
			args := append([]string{"-D", "127.0.0.1:0", "--known-hosts", kh, "-F", "none", "-l", "root"}, c.args...)
			cmd, out := konnectProcessEnv(t, c.env, args...)
			err := waitExit(t, cmd, 20*time.Second)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit = %v, want a failure; output:\n%s", err, out)
			}
			var errLines []string
			for _, line := range strings.Split(out.String(), "\n") {
				if strings.Contains(line, c.want[0]) {
					errLines = append(errLines, line)
				}
			}
			if len(errLines) != 1 || !strings.HasPrefix(errLines[0], "Error: ") {
				t.Fatalf("the error is printed %d times, want once as \"Error: ...\"; output:\n%s", len(errLines), out)
			}
			for _, want := range c.want {
				if !strings.Contains(errLines[0], want) {
					t.Errorf("error does not say %q: %s", want, errLines[0])
				}
			}
			for _, bad := range []string{"ssh: ssh:", "handshake failed", "Error: ssh: "} {
				if strings.Contains(out.String(), bad) {
					t.Errorf("output reads %q:\n%s", bad, out)
				}
			}
		})
	}

	t.Run("retry-first waits for the server", func(t *testing.T) {
		addr := harness.ClosedAddr(t)
		health := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
		cmd, out := konnectProcess(t, "-D", "127.0.0.1:0", "--health-listen", health, "--known-hosts", kh, "-F", "none",
			"-l", "root", "-i", key, "--retry-first", "--accept-new", addr)
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			t.Fatalf("konnect socks --retry-first exited: %v\n%s", err, out)
		case <-time.After(3 * time.Second):
		}
		harness.StartSSHDWith(t, harness.SSHDOptions{Addr: addr}, pub)
		harness.Eventually(t, 60*time.Second, "konnect socks ready", func() error {
			resp, err := http.Get("http://" + health + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("/readyz %d", resp.StatusCode)
			}
			return nil
		})
		cmd.Process.Kill()
		<-exited
	})
}

// connect sends CONNECT target to the proxy at addr and returns the answer's status and body (curl shows
// neither for a failed CONNECT).
func connect(t *testing.T, addr, target string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A failed request names the hop that failed, in konnect socks' own name, with a SOCKS5 reply and an HTTP
// status of its own: the SSH server down (reply 1, HTTP 503) or the destination refusing as the SSH server
// reports it (reply 5, HTTP 502). Failures are logged at the default level, rate-limited.
func TestProcessFailedRequestsNameTheHop(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	health := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	cmd, out := konnectProcess(t, "-D", addr, "--health-listen", health, "-i", key, "--known-hosts", kh, "-F", "none",
		"-l", "root", "--connect-timeout", "2s", srv.Addr())
	ready := func() bool {
		resp, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	harness.EventuallyTrue(t, 60*time.Second, "konnect socks ready", ready)
	port := backend(t)
	closed := harness.FreePort(t)
	server := "SSH server root@" + srv.Addr()

	// The destination refuses: the SSH server says so.
	refused := fmt.Sprintf("127.0.0.1:%d", closed)
	if got, _ := curl(t, "--socks5-hostname", addr, "http://"+refused+"/"); !strings.Contains(got, "(5)") {
		t.Errorf("SOCKS5 to a closed port: %q, want reply 5 (connection refused)", got)
	}
	wantRefused := "konnect socks: cannot reach " + refused + ": connection refused (as reported by the " + server + ")\n"
	if got, _ := curl(t, "--proxy", "http://"+addr, "-w", "%{http_code}", "http://"+refused+"/"); got != wantRefused+"502" {
		t.Errorf("HTTP proxy to a closed port: %q, want %q and 502", got, wantRefused)
	}
	if code, body := connect(t, addr, refused); code != 502 || body != wantRefused {
		t.Errorf("CONNECT to a closed port: %d %q, want 502 %q", code, body, wantRefused)
	}

	// The SSH server is down; the destination is up.
	srv.Stop()
	harness.EventuallyTrue(t, 20*time.Second, "readiness to fail", func() bool { return !ready() })
	up := "localhost:" + port
	if got, _ := curl(t, "--socks5-hostname", addr, "http://"+up+"/"); !strings.Contains(got, "(1)") {
		t.Errorf("SOCKS5 with sshd down: %q, want reply 1 (general failure)", got)
	}
	want := "konnect socks: cannot reach " + up + ": " + server + " is unreachable: "
	if got, _ := curl(t, "--proxy", "http://"+addr, "-w", "%{http_code}", "http://"+up+"/"); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "503") {
		t.Errorf("HTTP proxy with sshd down: %q, want %q... and 503", got, want)
	}
	if code, body := connect(t, addr, up); code != 503 || !strings.HasPrefix(body, want) {
		t.Errorf("CONNECT with sshd down: %d %q, want 503 %q...", code, body, want)
	}
	srv.Restart()
	// The background retry backs off up to 30 s while sshd is down; nothing here dials to cut it short.
	harness.EventuallyTrue(t, 45*time.Second, "ready again", ready)

	// Failures in a burst: a few lines, then one per second with the count of those left out.
	for range 30 {
		curl(t, "--socks5-hostname", addr, "http://"+refused+"/")
	}
	time.Sleep(1100 * time.Millisecond)
	curl(t, "--socks5-hostname", addr, "http://"+refused+"/")

	cmd.Process.Kill()
	cmd.Wait()
	logs := out.String()
	var failures []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "Proxy request failed") {
			failures = append(failures, line)
		}
	}
	for _, want := range []string{`kind="socks5"`, `kind="http connect"`, `kind="http"`, `answer="reply 5"`, `answer="reply 1"`, "answer=503", "answer=502", `dest="` + refused + `"`} {
		found := false
		for _, l := range failures {
			found = found || strings.Contains(l, want)
		}
		if !found {
			t.Errorf("no failure logged with %s at the default level; failures:\n%s", want, strings.Join(failures, "\n"))
		}
	}
	if n := len(failures); n >= 7+31 {
		t.Errorf("%d failure lines for 38 failed requests: not rate-limited", n)
	}
	if !strings.Contains(logs, "suppressedBefore=") {
		t.Errorf("no line says how many failures were left out:\n%s", strings.Join(failures, "\n"))
	}
}
