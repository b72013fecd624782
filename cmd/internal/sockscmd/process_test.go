//go:build integration

package sockscmd

import (
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// konnectProcess runs `konnect socks args...` as its own process (this test binary, see TestMain) with
// stdin on /dev/null, so there is no terminal.
func konnectProcess(t *testing.T, args ...string) (*exec.Cmd, *harness.SyncBuffer) {
	t.Helper()
	return konnectProcessEnv(t, nil, args...)
}

func waitExit(t *testing.T, cmd *exec.Cmd, within time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		cmd.Process.Kill()
		<-done
		t.Fatalf("konnect socks did not exit within %s", within)
	}
	return nil
}

func TestProcessEncryptedKeyWithoutTerminal(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_enc", "passphrase")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	cmd, out := konnectProcess(t, "-D", "127.0.0.1:0", "-i", key, "--known-hosts", kh, "-F", "none", srv.Addr())
	err := waitExit(t, cmd, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("exit = %v, want a failure; output:\n%s", err, out)
	}
	for _, want := range []string{key + " is encrypted and there is no terminal", "ssh-add " + key} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
}

func TestProcessNoSecretsInLogsAndCleanExit(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	const password = "Zq8-very-secret-proxy-password"
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte(password+"\n"), 0o600)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	health := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	cmd, out := konnectProcess(t, "-v", "10", "-D", addr, "--health-listen", health, "-i", key, "--known-hosts", kh,
		"-F", "none", "--proxy-user", "dev", "--proxy-password-file", pw, srv.Addr())
	// The child is this test binary (with -race when the suite runs under it), so allow for a slow start,
	// and show its output if it never becomes ready.
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + health + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("konnect socks not ready within 60s; its output:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	port := backend(t)
	url := "http://localhost:" + port + "/s"
	if got, err := curl(t, "--socks5-hostname", addr, "--proxy-user", "dev:"+password, url); err != nil || got != "backend /s" {
		t.Fatalf("with credentials: %v %q", err, got)
	}
	curl(t, "--socks5-hostname", addr, "--proxy-user", "dev:wrong-"+password, url)
	curl(t, "--proxy", "http://"+addr, "--proxy-user", "dev:wrong-"+password, url)

	cmd.Process.Signal(syscall.SIGTERM)
	if err := waitExit(t, cmd, 15*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM = %v, want 0; output:\n%s", err, out)
	}
	logs := out.String()
	if !strings.Contains(logs, "SSH connection established") || !strings.Contains(logs, "authentication failed") {
		t.Fatalf("logs are missing expected lines (is -v honoured?):\n%s", logs)
	}
	keyPEM, _ := os.ReadFile(key)
	secrets := []string{password}
	for _, line := range strings.Split(string(keyPEM), "\n") {
		if len(line) > 20 && !strings.HasPrefix(line, "-----") {
			secrets = append(secrets, line)
		}
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			t.Fatalf("a secret appears in the logs: %q", s)
		}
	}
}

// The start-up log says "Serving" only once the SSH connection is up: a refused host key shows "Listening;
// connecting to the SSH server" and then the error. ssh's -N and -C are taken (-C with a notice), and -q
// leaves only the error.
func TestProcessStartupLogAndSSHHabits(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	unknown := filepath.Join(dir, "known_hosts.empty")
	os.WriteFile(unknown, nil, 0o600)

	fails := func(t *testing.T, args ...string) string {
		t.Helper()
		cmd, out := konnectProcess(t, append([]string{"-D", "127.0.0.1:0", "-i", key, "--known-hosts", unknown, "-F", "none"}, append(args, srv.Addr())...)...)
		var ee *exec.ExitError
		if err := waitExit(t, cmd, 30*time.Second); !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("exit = %v, want a failure; output:\n%s", err, out)
		}
		return out.String()
	}
	t.Run("refused host key", func(t *testing.T) {
		out := fails(t)
		if !strings.Contains(out, `"Listening; connecting to the SSH server"`) || !strings.Contains(out, "Error: ") || strings.Contains(out, `"Serving"`) {
			t.Fatalf("want Listening, then the error, and no Serving:\n%s", out)
		}
	})
	t.Run("-q", func(t *testing.T) {
		out := fails(t, "-q", "-N")
		if !strings.Contains(out, "Error: ") || regexp.MustCompile(`(?m)^[IW]\d{4} `).MatchString(out) {
			t.Fatalf("-q: want the error alone:\n%s", out)
		}
	})
	t.Run("connected, -N -C", func(t *testing.T) {
		health := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
		cmd, out := konnectProcess(t, "-N", "-C", "-D", "127.0.0.1:0", "--health-listen", health, "-i", key, "--known-hosts", kh, "-F", "none", srv.Addr())
		deadline := time.Now().Add(60 * time.Second)
		for {
			resp, err := http.Get("http://" + health + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("konnect socks not ready within 60s")
			}
			time.Sleep(50 * time.Millisecond)
		}
		// "Serving" follows the connection within RunCommand's poll.
		harness.EventuallyTrue(t, 10*time.Second, `"Serving" logged`, func() bool { return strings.Contains(out.String(), `"Serving"`) })
		cmd.Process.Signal(syscall.SIGTERM)
		if err := waitExit(t, cmd, 15*time.Second); err != nil {
			t.Fatalf("exit after SIGTERM = %v, want 0; output:\n%s", err, out)
		}
		logs := out.String()
		listening, established, serving := strings.Index(logs, `"Listening; connecting to the SSH server"`), strings.Index(logs, "SSH connection established"), strings.Index(logs, `"Serving"`)
		if listening < 0 || established < listening || serving < established {
			t.Errorf("want Listening, SSH connection established, then Serving:\n%s", logs)
		}
		if !strings.Contains(logs, "-C (--compression): ignored") {
			t.Errorf("no notice that -C is ignored:\n%s", logs)
		}
	})
}
