package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"k8s.io/klog/v2"
)

type fakeDaemon struct {
	startups int
	ran      bool
}

func (d *fakeDaemon) Run(context.Context) error { d.ran = true; return nil }
func (d *fakeDaemon) Close() error              { return nil }
func (d *fakeDaemon) Startup() Startup {
	d.startups++
	return Startup{Line: "Starting to serve on 127.0.0.1:8001", KV: []any{"addr", "127.0.0.1:8001", "health", "127.0.0.1:8002"}}
}

// RunCommand is the one place a daemon's start-up is reported: its Line on standard output, which scripts
// read, and one klog line "Serving" with its addresses.
func TestRunCommandReportsStartupOnce(t *testing.T) {
	var logs bytes.Buffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer func() {
		klog.SetOutput(nil)
		klog.LogToStderr(true)
	}()

	var out bytes.Buffer
	d := &fakeDaemon{}
	err := RunCommand(context.Background(), &out, func() (int, error) { return 1, nil },
		func(context.Context, int) (*fakeDaemon, error) { return d, nil })
	klog.Flush()
	if err != nil {
		t.Fatal(err)
	}
	if !d.ran || d.startups != 1 {
		t.Errorf("ran %v, Startup called %d times; want a run and one call", d.ran, d.startups)
	}
	if got := out.String(); got != "Starting to serve on 127.0.0.1:8001\n" {
		t.Errorf("standard output %q", got)
	}
	var serving []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"Serving"`) {
			serving = append(serving, line)
		}
	}
	if len(serving) != 1 || !strings.Contains(serving[0], `addr="127.0.0.1:8001" health="127.0.0.1:8002"`) {
		t.Errorf("klog lines \"Serving\": %q", serving)
	}

	// A daemon that fails in New reports nothing.
	out.Reset()
	logs.Reset()
	boom := errors.New("boom")
	err = RunCommand(context.Background(), &out, func() (int, error) { return 1, nil },
		func(context.Context, int) (*fakeDaemon, error) { return nil, boom })
	klog.Flush()
	if !errors.Is(err, boom) || out.Len() > 0 || strings.Contains(logs.String(), "Serving") {
		t.Errorf("New failed: err %v, output %q, logs %q", err, out.String(), logs.String())
	}
}

// readyDaemon becomes ready when told to, and fails its run when told to instead.
type readyDaemon struct {
	ready  atomic.Bool
	failed chan error
}

func (d *readyDaemon) Run(ctx context.Context) error {
	select {
	case err := <-d.failed:
		return err
	case <-ctx.Done():
		return nil
	}
}
func (d *readyDaemon) Close() error { return nil }
func (d *readyDaemon) Startup() Startup {
	return Startup{KV: []any{"socks", "127.0.0.1:1080"}, Waiting: "Listening; connecting to the SSH server", Ready: func() error {
		if d.ready.Load() {
			return nil
		}
		return errors.New("not yet")
	}}
}

// With Startup.Ready, "Serving" waits for it: a daemon that fails before it is ready (a refused host key)
// shows "Listening; connecting ..." and then its error, never "Serving".
func TestRunCommandServingOnceReady(t *testing.T) {
	var logs harness.SyncBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer func() {
		klog.SetOutput(nil)
		klog.LogToStderr(true)
	}()
	run := func(d *readyDaemon) chan error {
		errc := make(chan error, 1)
		go func() {
			errc <- RunCommand(context.Background(), io.Discard, func() (int, error) { return 1, nil },
				func(context.Context, int) (*readyDaemon, error) { return d, nil })
		}()
		return errc
	}
	waitLog := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for klog.Flush(); !strings.Contains(logs.String(), want); klog.Flush() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s in the log:\n%s", want, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	boom := errors.New("host key refused")
	d := &readyDaemon{failed: make(chan error, 1)}
	errc := run(d)
	waitLog(`"Listening; connecting to the SSH server" socks="127.0.0.1:1080"`)
	time.Sleep(3 * readyPoll)
	d.failed <- boom
	if err := <-errc; !errors.Is(err, boom) {
		t.Fatalf("RunCommand returned %v, want %v", err, boom)
	}
	klog.Flush()
	if strings.Contains(logs.String(), "Serving") {
		t.Fatalf("a daemon that never became ready logged Serving:\n%s", logs.String())
	}

	logs.Reset()
	d = &readyDaemon{failed: make(chan error, 1)}
	errc = run(d)
	waitLog("Listening; connecting")
	d.ready.Store(true)
	waitLog(`"Serving" socks="127.0.0.1:1080"`)
	d.failed <- nil
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), `"Serving"`); n != 1 {
		t.Fatalf("Serving logged %d times:\n%s", n, logs.String())
	}
}

// TestRunCommandNewStopsOnSIGTERM: newDaemon is given a context that SIGTERM ends, so that a start that
// waits (konnect socks's Match exec commands) stops with the signal rather than holding the process.
func TestRunCommandNewStopsOnSIGTERM(t *testing.T) {
	errStopped := errors.New("stopped")
	err := RunCommand(context.Background(), io.Discard, func() (int, error) { return 1, nil },
		func(ctx context.Context, _ int) (*fakeDaemon, error) {
			if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, errStopped
			case <-time.After(5 * time.Second):
				return nil, errors.New("the context did not end on SIGTERM")
			}
		})
	if !errors.Is(err, errStopped) {
		t.Fatalf("err = %v, want newDaemon's context ended", err)
	}
}
