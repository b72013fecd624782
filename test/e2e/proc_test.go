//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// proc is a harness.Proc inside a network namespace, tracked so that a signal or a timeout stops it too.
type proc struct {
	*harness.Proc
	ns    string
	grace time.Duration // how long cleanup waits after SIGTERM before SIGKILL
	res   *resource
}

var (
	logsMu  sync.Mutex
	allLogs []*proc // every process ever started, for log dumps
	logSeq  = map[string]int{}
)

// startProc starts argv in namespace ns. The process is stopped when the
// test (or, for shared clusters, the run) ends.
func startProc(name, ns, logDir string, argv ...string) (*proc, error) {
	return startProcVia(harness.NetnsExec(ns), name, ns, logDir, argv...)
}

// startHostMountProc is startProc for containerd and kubelet: they join only the network namespace
// and keep the host's mount namespace, because both must see the same cgroups and mounts.
func startHostMountProc(name, ns, logDir string, argv ...string) (*proc, error) {
	return startProcVia(harness.NsenterNet(ns), name, ns, logDir, argv...)
}

func startProcVia(via []string, name, ns, logDir string, argv ...string) (*proc, error) {
	logsMu.Lock()
	logSeq[name]++
	seq := logSeq[name]
	logsMu.Unlock()
	hp := &harness.Proc{Name: name, LogPath: filepath.Join(logDir, fmt.Sprintf("%s.%d.log", name, seq)), Argv: argv, Via: via, Keep: keepEnv}
	if err := os.WriteFile(hp.LogPath, []byte("# "+strings.Join(slices.Concat(via, argv), " ")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := hp.Launch(); err != nil {
		return nil, err
	}
	p := &proc{Proc: hp, ns: ns, grace: 10 * time.Second}
	p.res = track("process "+name, func() { _ = p.Stop(syscall.SIGTERM, p.grace) })
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
				t.Logf("%s took %v to stop", p.Name, d.Round(100*time.Millisecond))
			}
		}()
	}
	wg.Wait()
}

func dumpAllLogs(w io.Writer) {
	logsMu.Lock()
	ps := append([]*proc(nil), allLogs...)
	logsMu.Unlock()
	for _, p := range ps {
		state := "running"
		if !p.Running() {
			state = fmt.Sprintf("exited: %v", p.Err())
		}
		fmt.Fprintf(w, "\n===== %s (netns %s, %s) %s =====\n%s\n", p.Name, p.ns, state, p.LogPath, p.LogTail(40))
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

var errNotYet = errors.New("not yet")
