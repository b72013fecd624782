// Package harness is the test support that konnect's integration tests share: processes that are stopped
// and reaped when the test ends (even when it fails), free loopback ports, loopback backends, and the
// upstream apiserver-network-proxy binaries that konnect must interoperate with. Certificates come from
// pki/pkitest; an OpenSSH server from socks/sshdial/sshdtest.
package harness

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Proc is one long-running program started by a test. Its stdout and stderr go to a log file; it runs in
// its own process group, and dies with the test binary even when a timeout panic skips the cleanups.
type Proc struct {
	Name    string
	LogPath string
	t       testing.TB
	argv    []string
	env     []string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // valid once done is closed
}

// Start runs bin with args; env is added to the test's environment. The log is dir/name.log, appended to
// on Restart. The process is killed when the test ends, and its log tail printed if the test failed.
func Start(t testing.TB, dir, name string, env []string, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, LogPath: filepath.Join(dir, name+".log"), t: t, argv: append([]string{bin}, args...), env: env}
	p.start()
	t.Cleanup(func() {
		p.Stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("log of %s (%s):\n%s", p.Name, strings.Join(p.argv, " "), Tail(p.Log(), 4000))
		}
	})
	return p
}

func (p *Proc) start() {
	p.t.Helper()
	lf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatalf("start %s: %v", p.Name, err)
	}
	defer lf.Close()
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.Name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	go func(done chan struct{}) {
		p.err = cmd.Wait()
		close(done)
	}(p.done)
}

// Restart starts the same command again after it exited.
func (p *Proc) Restart() {
	p.t.Helper()
	if p.Running() {
		p.t.Fatalf("restart %s: still running", p.Name)
	}
	p.start()
}

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends sig and waits, 30 seconds at most, for the process to exit; then SIGKILL ends its whole group.
func (p *Proc) Stop(sig syscall.Signal) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return
	case <-time.After(30 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Kill ends the process at once, as a crash would, and reaps it.
func (p *Proc) Kill() { p.Stop(syscall.SIGKILL) }

// Wait waits for the process to exit by itself and returns its exit code; ok is false on timeout.
func (p *Proc) Wait(timeout time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return 0, false
	}
	var exitErr *exec.ExitError
	if errors.As(p.err, &exitErr) {
		return exitErr.ExitCode(), true
	}
	return 0, true
}

// Log returns everything the process wrote so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Tail returns the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return "...\n" + s[len(s)-n:]
	}
	return s
}
