package sockscmd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// konnectProcessEnv is konnectProcess with extra environment variables.
func konnectProcessEnv(t *testing.T, env []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"=1", "SSH_AUTH_SOCK="), env...)
	var out bytes.Buffer
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
	emptyHome := t.TempDir()

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
			[]string{"no SSH identity to offer root@" + srv.Addr(), "no -i", filepath.Join(emptyHome, ".ssh", "id_ed25519")}},
		{"key others may read", nil, []string{"-i", open, srv.Addr()},
			[]string{"permissions 0644 for identity file " + open, "UNPROTECTED PRIVATE KEY FILE", "--allow-unprotected-key"}},
	} {
		t.Run(c.name, func(t *testing.T) {
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
