//go:build integration

package sshdial

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/sys/unix"
)

const secondFactor = "s3cond-factor"

// twoFactorSSHD restarts f's sshd so that a login needs the key and then method (password or
// keyboard-interactive): "AuthenticationMethods publickey,METHOD". The second factor goes through PAM, to a
// service of the test's own whose only check is a script that compares the answer with secondFactor, so
// that no account's password is set. sshd names its PAM service after its program name, so it runs through
// a symlink with that name; the service file in /etc/pam.d is removed when the test ends.
func twoFactorSSHD(t *testing.T, f *fixture, method string) {
	t.Helper()
	twoFactorSSHDWith(t, f, method, secondFactor)
}

// twoFactorSSHDWith is twoFactorSSHD with answer as the second factor.
func twoFactorSSHDWith(t *testing.T, f *fixture, method, answer string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sshd's PAM authentication of another service needs root, to write its /etc/pam.d file")
	}
	for _, m := range []string{"/lib/x86_64-linux-gnu/security/pam_exec.so", "/usr/lib/x86_64-linux-gnu/security/pam_exec.so"} {
		if _, err := os.Stat(m); err == nil {
			break
		} else if m == "/usr/lib/x86_64-linux-gnu/security/pam_exec.so" {
			t.Fatalf("pam_exec.so (libpam-modules) is missing: %v", err)
		}
	}
	service := fmt.Sprintf("konnect-test-sshd-%d-%d", os.Getpid(), time.Now().UnixNano())
	check := filepath.Join(f.sshd.Dir, "check-answer")
	// pam_exec passes the answer on stdin, NUL-terminated.
	script := "#!/bin/bash\nIFS= read -r -d '' answer\n[ \"$answer\" = '" + answer + "' ]\n"
	if err := os.WriteFile(check, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	pamFile := filepath.Join("/etc/pam.d", service)
	t.Cleanup(func() { os.Remove(pamFile) })
	// pam_permit after the check gives pam_setcred a module that succeeds; sshd drops the login otherwise.
	pam := "auth required pam_exec.so expose_authtok quiet " + check + "\nauth optional pam_permit.so\n" +
		"account required pam_permit.so\n" +
		"session required pam_permit.so\npassword required pam_deny.so\n"
	if err := os.WriteFile(pamFile, []byte(pam), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(f.sshd.Dir, service)
	if err := os.Symlink(harness.SSHDPath, link); err != nil {
		t.Fatal(err)
	}
	// -o wins over the config file, which says UsePAM no and no passwords.
	argv := []string{link}
	for _, o := range []string{"UsePAM=yes", "PermitRootLogin=yes", "PasswordAuthentication=yes",
		"KbdInteractiveAuthentication=yes", "AuthenticationMethods=publickey," + method} {
		argv = append(argv, "-o", o)
	}
	f.sshd.Proc.Argv = append(argv, f.sshd.Proc.Argv[1:]...)
	f.sshd.Restart()
}

// childConfig is what the helper process connects to. Verbose logs every line the dialer has, at every
// level, on stderr.
type childConfig struct {
	Destination, Key, KnownHosts string
	Verbose                      bool
}

// childResult is what the helper process reports on stdout.
type childResult struct {
	Err string
}

// TestInteractiveChild is the konnect side of the terminal tests, run in a process of its own whose stdin
// is a pseudo-terminal (or not a terminal at all): it connects with cfg from $KONNECT_TEST_CHILD_CONFIG and
// the default, terminal, prompts, and reports on stdout.
func TestInteractiveChild(t *testing.T) {
	raw := os.Getenv("KONNECT_TEST_CHILD_CONFIG")
	if raw == "" {
		t.Skip("run by the terminal tests")
	}
	var c childConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Destination: c.Destination, IdentityFiles: []string{c.Key}, KnownHostsFile: c.KnownHosts,
		ConfigFile: "none", AgentSocket: "none", ConnectTimeout: 5 * time.Second}
	if c.Verbose {
		cfg.Log = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: maxVerbosity})
	}
	report := func(r childResult) {
		b, _ := json.Marshal(r)
		fmt.Println("RESULT " + string(b))
	}
	d, err := New(cfg)
	if err != nil {
		report(childResult{Err: err.Error()})
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.After(60 * time.Second)
	for d.Ready() != nil {
		select {
		case err := <-done:
			done <- nil
			report(childResult{Err: fmt.Sprint(err)})
			return
		case <-deadline:
			report(childResult{Err: "not connected within 60s"})
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	// A login that sshd drops at once (its session set-up failed) is no login.
	time.Sleep(500 * time.Millisecond)
	if err := d.Ready(); err != nil {
		report(childResult{Err: "connected, then lost: " + err.Error()})
		return
	}
	report(childResult{})
}

// runChild starts TestInteractiveChild, connecting to f's sshd; stdin and stderr are tty, a pseudo-terminal's follower,
// or /dev/null when tty is nil. It returns a function that waits for the child's result.
func runChild(t *testing.T, f *fixture, tty *os.File) func() childResult {
	t.Helper()
	return runChildWith(t, childConfig{Destination: f.sshd.Addr(), Key: f.key, KnownHosts: f.knownHosts}, tty)
}

// runChildWith is runChild with the child's configuration.
func runChildWith(t *testing.T, c childConfig, tty *os.File) func() childResult {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInteractiveChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KONNECT_TEST_CHILD_CONFIG="+string(b))
	var stderr strings.Builder
	if tty != nil {
		cmd.Stdin, cmd.Stderr = tty, tty
	} else {
		cmd.Stderr = &stderr
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var res childResult
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return func() childResult {
		once.Do(func() {
			got := make(chan childResult, 1)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if line, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
						var r childResult
						if err := json.Unmarshal([]byte(line), &r); err != nil {
							r.Err = "bad result line " + line
						}
						got <- r
						return
					}
				}
				got <- childResult{Err: "child ended without a result; stderr:\n" + stderr.String()}
			}()
			select {
			case res = <-got:
			case <-time.After(90 * time.Second):
				t.Fatal("the child gave no result within 90s")
			}
		})
		return res
	}
}

// openPTY returns a pseudo-terminal's leader and follower.
func openPTY(t *testing.T) (leader, follower *os.File) {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	leader = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	follower, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leader.Close(); follower.Close() })
	return leader, follower
}

// screen collects what a terminal shows.
type screen struct {
	mu   sync.Mutex
	text strings.Builder
}

func (s *screen) read(r io.Reader) {
	b := make([]byte, 1024)
	for {
		n, err := r.Read(b)
		s.mu.Lock()
		s.text.Write(b[:n])
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text.String()
}

// waitFor waits until the screen shows want, after what it showed at from.
func (s *screen) waitFor(t *testing.T, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if i := strings.Index(s.String()[from:], want); i >= 0 {
			return from + i + len(want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal did not show %q within 30s; it shows:\n%s", want, s.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// terminalLogin runs konnect against a two-factor sshd with a pseudo-terminal as its stdin, answers the
// prompt it shows, and checks that it connects, and that the answer was not echoed.
func terminalLogin(t *testing.T, method, prompt, sshdAccepted string) {
	f := newFixture(t)
	twoFactorSSHD(t, f, method)
	leader, follower := openPTY(t)
	var scr screen
	go scr.read(leader)
	result := runChild(t, f, follower)
	at := scr.waitFor(t, 0, prompt)
	if _, err := leader.Write([]byte(secondFactor + "\n")); err != nil {
		t.Fatal(err)
	}
	if r := result(); r.Err != "" {
		t.Fatalf("konnect did not connect: %s\nterminal:\n%s\nsshd log:\n%s", r.Err, scr.String(), f.sshd.Log())
	}
	if strings.Contains(scr.String(), secondFactor) {
		t.Errorf("the answer was echoed on the terminal:\n%s", scr.String())
	}
	if strings.Contains(scr.String()[at:], prompt) {
		t.Errorf("asked twice:\n%s", scr.String())
	}
	for _, want := range []string{"Partial publickey", sshdAccepted} {
		if !strings.Contains(f.sshd.Log(), want) {
			t.Errorf("sshd log does not show %q:\n%s", want, f.sshd.Log())
		}
	}
}

func TestSecondFactorPasswordOnTerminal(t *testing.T) {
	terminalLogin(t, "password", localUser()+"@127.0.0.1's password: ", "Accepted password")
}

func TestSecondFactorKeyboardInteractiveOnTerminal(t *testing.T) {
	// PAM's own prompt, passed on by sshd as the keyboard-interactive question.
	terminalLogin(t, "keyboard-interactive", "Password: ", "Accepted keyboard-interactive/pam")
}

// Without a terminal (konnect run as a service) the start fails at once, saying that the key was accepted
// and what the server wants, instead of waiting for an answer that cannot come.
func TestSecondFactorWithoutTerminal(t *testing.T) {
	f := newFixture(t)
	twoFactorSSHD(t, f, "password")
	r := runChild(t, f, nil)()
	t.Logf("error: %s", r.Err)
	for _, want := range []string{"accepted the key " + f.key, "requires more: password", "no terminal"} {
		if !strings.Contains(r.Err, want) {
			t.Errorf("error %q does not say %q", r.Err, want)
		}
	}
	if strings.Contains(r.Err, "accepted none") {
		t.Errorf("error %q says no key was accepted", r.Err)
	}
}

// A refused answer ends in an AuthError that names the accepted key and the refused method, after
// NumberOfPasswordPrompts tries; and the SSH config file's PasswordAuthentication no keeps konnect from
// asking at all.
func TestSecondFactorRefused(t *testing.T) {
	f := newFixture(t)
	twoFactorSSHD(t, f, "password")
	run := func(t *testing.T, sshConfig string) (asked []string, err error) {
		cfg := f.config()
		if sshConfig != "" {
			cfg.ConfigFile = filepath.Join(t.TempDir(), "config")
			os.WriteFile(cfg.ConfigFile, []byte("Host *\n"+sshConfig), 0o600)
		}
		cfg.Ask = func(q string, echo bool) (string, error) {
			if echo {
				t.Errorf("asked %q with echo", q)
			}
			asked = append(asked, q)
			return "wrong", nil
		}
		_, done := start(t, cfg)
		return asked, waitErr(t, done)
	}
	prompt := localUser() + "@127.0.0.1's password: "
	t.Run("wrong answers", func(t *testing.T) {
		asked, err := run(t, "")
		want := []string{prompt, "Permission denied, please try again.\n" + prompt, "Permission denied, please try again.\n" + prompt}
		if strings.Join(asked, "|") != strings.Join(want, "|") {
			t.Errorf("asked %q, want %q", asked, want)
		}
		var ae *AuthError
		if !errors.As(err, &ae) {
			t.Fatalf("err = %v, want an AuthError", err)
		}
		for _, s := range []string{"accepted the key " + f.key, "requires more: password", "refused the answers to password"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
	})
	t.Run("NumberOfPasswordPrompts", func(t *testing.T) {
		if asked, _ := run(t, "NumberOfPasswordPrompts 1\n"); len(asked) != 1 {
			t.Errorf("asked %d times, want 1", len(asked))
		}
	})
	for _, setting := range []string{"NumberOfPasswordPrompts 0", "BatchMode yes"} {
		t.Run(setting, func(t *testing.T) {
			asked, err := run(t, setting+"\n")
			if len(asked) != 0 {
				t.Errorf("asked %q although %s", asked, setting)
			}
			var ae *AuthError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), "accepted the key "+f.key) || !strings.Contains(err.Error(), setting) {
				t.Errorf("err = %v, want an AuthError naming the accepted key and %s", err, setting)
			}
		})
	}
	t.Run("PasswordAuthentication no", func(t *testing.T) {
		asked, err := run(t, "PasswordAuthentication no\n")
		if len(asked) != 0 {
			t.Errorf("asked %q although PasswordAuthentication is no", asked)
		}
		if !strings.Contains(err.Error(), "accepted the key "+f.key) || !strings.Contains(err.Error(), "PasswordAuthentication") {
			t.Errorf("error %q does not name the accepted key and the setting", err)
		}
	})
}

// A reconnection asks again; with nobody to answer, each attempt fails, Ready says why, and Run goes on
// trying instead of stopping or hanging, until an answer comes.
func TestSecondFactorReconnect(t *testing.T) {
	f := newFixture(t)
	twoFactorSSHD(t, f, "password")
	var mu sync.Mutex
	asked, present := 0, true
	cfg := f.config()
	cfg.MinBackoff, cfg.MaxBackoff = 100*time.Millisecond, 200*time.Millisecond
	cfg.Ask = func(q string, echo bool) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		asked++
		if !present {
			return "", errNoTerminal
		}
		return secondFactor, nil
	}
	d, done := start(t, cfg)
	waitReady(t, d, done)
	mu.Lock()
	present = false
	mu.Unlock()
	f.sshd.Restart()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var ie *InteractiveAuthError
		if err := d.Ready(); errors.As(err, &ie) {
			if !strings.Contains(err.Error(), "accepted the key "+f.key) {
				t.Errorf("error %q does not name the accepted key", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready() = %v after 15s, want an InteractiveAuthError", d.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Run ended when nobody could answer a reconnection: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	mu.Lock()
	present = true
	before := asked
	mu.Unlock()
	waitReady(t, d, done)
	if before < 2 {
		t.Errorf("asked %d times before the reconnection, want the first login and at least one reconnection", before)
	}
}
