// Package harness is the test support that konnect's integration tests, end-to-end tests and benchmarks
// share: processes that are stopped and reaped when the test ends (even when it fails), network
// namespaces, free loopback ports, loopback backends, a real OpenSSH sshd, and the upstream
// apiserver-network-proxy binaries that konnect must interoperate with. Certificates come from pki/pkitest.
package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is one long-running program. Its stdout and stderr go to a log file; it runs in its own process
// group, so that Stop reaches its children too.
type Proc struct {
	Name    string
	LogPath string   // appended to, also on Restart
	Argv    []string // the program and its arguments
	Via     []string // command prefix, e.g. NetnsExec(ns)
	Env     []string // added to the environment
	Keep    bool     // no Pdeathsig: the process outlives the test binary, for debugging

	t    testing.TB // of Start, for Restart
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid once done is closed
}

// Start runs bin with args; env is added to the test's environment. The log is dir/name.log. The process
// is killed when the test ends, and its log tail printed if the test failed.
func Start(t testing.TB, dir, name string, env []string, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, LogPath: filepath.Join(dir, name+".log"), Argv: append([]string{bin}, args...), Env: env, t: t}
	if err := p.Launch(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("log of %s (%s):\n%s", p.Name, strings.Join(p.Argv, " "), Tail(p.Log(), 4000))
		}
	})
	return p
}

// Pdeathsig fires when the thread that forked the child exits, not the process, and InNetns discards the
// threads it runs on. So every child is forked by spawner, on one locked thread that lives as long as the
// binary.
var (
	spawnc    = make(chan func())
	spawnOnce sync.Once
)

// SpawnerFunc names that goroutine for goleak.IgnoreTopFunction: it is meant to outlive the tests.
const SpawnerFunc = "github.com/konnect-dev/konnect/test/harness.spawner"

func spawner() {
	runtime.LockOSThread()
	for f := range spawnc {
		f()
	}
}

// Launch starts the process, or starts it again after it exited. Unless Keep is set, it dies with the
// binary that started it, even when a timeout panic skips the cleanups.
func (p *Proc) Launch() error {
	if p.done != nil && p.Running() {
		return fmt.Errorf("start %s: still running", p.Name)
	}
	lf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	defer lf.Close()
	argv := slices.Concat(p.Via, p.Argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !p.Keep {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	spawnOnce.Do(func() { go spawner() })
	errc := make(chan error, 1)
	spawnc <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		return fmt.Errorf("start %s (%s): %w", p.Name, p.Argv[0], err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	go func(done chan struct{}) {
		p.err = cmd.Wait()
		close(done)
	}(p.done)
	return nil
}

// Restart starts the same command again after it exited; a failure fails Start's test.
func (p *Proc) Restart() {
	p.t.Helper()
	if err := p.Launch(); err != nil {
		p.t.Fatal(err)
	}
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

// ErrExited is wrapped by Exited's errors; Poll gives up at once on it.
var ErrExited = errors.New("exited")

// Exited is nil while the process runs; then it says how the process ended, with the end of its log.
func (p *Proc) Exited() error {
	if p.Running() {
		return nil
	}
	return fmt.Errorf("%s %w (%v); log %s:\n%s", p.Name, ErrExited, p.err, p.LogPath, p.LogTail(30))
}

// Err is how the process ended: nil for exit status 0, and while it runs.
func (p *Proc) Err() error {
	if p.Running() {
		return nil
	}
	return p.err
}

// Stop sends sig to the process group and waits up to grace for the process to exit; then SIGKILL ends
// the group, children that ignored sig included. It returns how the process ended.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) error {
	if !p.Running() {
		return p.err
	}
	p.signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.signal(syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop within %v of %v; killed", p.Name, grace, sig)
	}
	p.signal(syscall.SIGKILL)
	return p.err
}

func (p *Proc) signal(sig syscall.Signal) { _ = syscall.Kill(-p.cmd.Process.Pid, sig) }

// Kill ends the process group at once, as a crash would, and reaps the process.
func (p *Proc) Kill() { _ = p.Stop(syscall.SIGKILL, time.Minute) }

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

// LogTail returns the last n lines of the log.
func (p *Proc) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
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

// Poll calls fn every interval until it returns nil or timeout passes; an error wrapping ErrExited ends
// it at once, since the process awaited is gone. The error names what was awaited.
func Poll(what string, timeout, interval time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrExited):
			return fmt.Errorf("waiting for %s: %w", what, err)
		case time.Now().After(deadline):
			return fmt.Errorf("timed out after %v waiting for %s: %w", timeout, what, err)
		}
		time.Sleep(interval)
	}
}

// Run executes a short command in network namespace ns (the host's when ns is "") and returns its
// stdout; the error carries its stderr.
func Run(ctx context.Context, ns string, argv ...string) (string, error) {
	if ns != "" {
		argv = slices.Concat(NetnsExec(ns), argv)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
