//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one long-running program inside a network namespace. Its stdout
// and stderr go to a log file; it runs in its own process group so that stop
// reaches its children too.
type proc struct {
	name    string
	ns      string
	argv    []string
	logPath string

	// grace is how long cleanup waits after SIGTERM before SIGKILL.
	grace time.Duration

	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid after done is closed
	res  *resource
}

// Pdeathsig fires when the *thread* that forked the child exits, and
// dialIn discards the threads it runs on. So every child is forked from one
// locked thread that lives as long as the test binary.
var spawnReq = make(chan spawnCall)

type spawnCall struct {
	cmd *exec.Cmd
	err chan error
}

func init() {
	go func() {
		runtime.LockOSThread()
		for r := range spawnReq {
			r.err <- r.cmd.Start()
		}
	}()
}

func spawn(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	spawnReq <- spawnCall{cmd, errc}
	return <-errc
}

var (
	logsMu  sync.Mutex
	allLogs []*proc // every process ever started, for log dumps
	logSeq  = map[string]int{}
)

// startProc starts argv in namespace ns. The process is stopped when the
// test (or, for shared clusters, the run) ends.
func startProc(name, ns, logDir string, argv ...string) (*proc, error) {
	return startProcVia([]string{"ip", "netns", "exec", ns}, name, ns, logDir, argv...)
}

// startHostMountProc is startProc for containerd and kubelet: they join only the network namespace
// (nsenter --net) and keep the host's mount namespace, because `ip netns exec` makes a new mount
// namespace in which /sys/fs/cgroup is empty, and both must see the same cgroups and mounts.
func startHostMountProc(name, ns, logDir string, argv ...string) (*proc, error) {
	return startProcVia([]string{"nsenter", "--net=" + filepath.Join("/run/netns", ns), "--"}, name, ns, logDir, argv...)
}

func startProcVia(via []string, name, ns, logDir string, argv ...string) (*proc, error) {
	logsMu.Lock()
	logSeq[name]++
	seq := logSeq[name]
	logsMu.Unlock()
	logPath := filepath.Join(logDir, fmt.Sprintf("%s.%d.log", name, seq))
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	full := append(append([]string(nil), via...), argv...)
	fmt.Fprintf(lf, "# %s\n", strings.Join(full, " "))
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !keepEnv {
		// If the test binary dies hard, the kernel kills the child too.
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := spawn(cmd); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &proc{name: name, ns: ns, argv: argv, logPath: logPath, cmd: cmd, done: make(chan struct{}), grace: 10 * time.Second}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	p.res = track("process "+name, func() { p.stop(p.grace) })
	logsMu.Lock()
	allLogs = append(allLogs, p)
	logsMu.Unlock()
	return p, nil
}

// startProcT is startProc for one test: failure is fatal, and the process
// is stopped when the test ends.
func startProcT(t *testing.T, name, ns, logDir string, argv ...string) *proc {
	t.Helper()
	p, err := startProc(name, ns, logDir, argv...)
	if err != nil {
		t.Fatal(err)
	}
	v, loaded := testProcs.LoadOrStore(t, &procList{})
	l := v.(*procList)
	if !loaded {
		t.Cleanup(func() { l.stopAll(t); testProcs.Delete(t) })
	}
	l.mu.Lock()
	l.ps = append(l.ps, p)
	l.mu.Unlock()
	return p
}

// testProcs holds each test's processes; they are stopped together, in
// parallel, because draining daemons each take seconds.
var testProcs sync.Map // *testing.T -> *procList

type procList struct {
	mu sync.Mutex
	ps []*proc
}

func (l *procList) stopAll(t *testing.T) {
	if keepEnv {
		return
	}
	l.mu.Lock()
	ps := l.ps
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			p.res.release()
			if d := time.Since(start); d > 5*time.Second {
				t.Logf("%s took %v to stop", p.name, d.Round(100*time.Millisecond))
			}
		}()
	}
	wg.Wait()
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the whole process group.
func (p *proc) signal(sig syscall.Signal) {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// stop sends SIGTERM and, after grace, SIGKILL. It reports how the process ended.
func (p *proc) stop(grace time.Duration) error {
	if p.exited() {
		return p.err
	}
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.signal(syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", p.name, grace)
	}
	// The group may hold children that ignored SIGTERM.
	p.signal(syscall.SIGKILL)
	return p.err
}

// kill ends the process group at once, as a crash would.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// tail returns the last n lines of the log.
func (p *proc) tail(n int) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 4*n {
			lines = lines[len(lines)-n:]
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (p *proc) logContains(s string) bool {
	b, err := os.ReadFile(p.logPath)
	return err == nil && bytes.Contains(b, []byte(s))
}

func dumpAllLogs(w io.Writer) {
	logsMu.Lock()
	ps := append([]*proc(nil), allLogs...)
	logsMu.Unlock()
	for _, p := range ps {
		state := "running"
		if p.exited() {
			state = fmt.Sprintf("exited: %v", p.err)
		}
		fmt.Fprintf(w, "\n===== %s (netns %s, %s) %s =====\n%s\n", p.name, p.ns, state, p.logPath, p.tail(40))
	}
}

// dumpLogsOnFailure prints the tail of every component's log when t fails.
// Register it first so that it runs last, after the other cleanups have
// stopped the processes (their shutdown lines are then in the logs too).
func dumpLogsOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			var b strings.Builder
			dumpAllLogs(&b)
			t.Logf("logs of every component (last 40 lines each):%s", b.String())
		}
	})
}

// run executes a short command in namespace ns (or the host when ns is "")
// and returns its stdout; the error carries stderr.
func run(ctx context.Context, ns string, argv ...string) (string, error) {
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// poll calls fn until it returns nil or timeout passes; the last error is
// returned with what was being waited for.
func poll(what string, timeout, interval time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s: %w", timeout, what, err)
		}
		time.Sleep(interval)
	}
}

// errExited reports a process that died while we waited for it.
func (p *proc) errExited() error {
	if p.exited() {
		return fmt.Errorf("%s exited (%v); log %s:\n%s", p.name, p.err, p.logPath, p.tail(30))
	}
	return nil
}

var errNotYet = errors.New("not yet")
