package daemon

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

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
		func(int) (*fakeDaemon, error) { return d, nil })
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
		func(int) (*fakeDaemon, error) { return nil, boom })
	klog.Flush()
	if !errors.Is(err, boom) || out.Len() > 0 || strings.Contains(logs.String(), "Serving") {
		t.Errorf("New failed: err %v, output %q, logs %q", err, out.String(), logs.String())
	}
}
