package harness

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Daemon is a konnect daemon's Run(ctx) started in-process by a test: the server or the agent, which the
// agent/ and egress/tunnel tests each run against the other side.
type Daemon struct {
	Cancel context.CancelFunc // begins the shutdown without waiting for it
	done   chan error
	grace  time.Duration
}

// RunDaemon calls run in a goroutine and stops it when the test ends. grace is the daemon's graceful
// timeout, which Stop allows, and ten seconds more.
func RunDaemon(t testing.TB, grace time.Duration, run func(context.Context) error) *Daemon {
	ctx, cancel := context.WithCancel(context.Background())
	d := &Daemon{Cancel: cancel, done: make(chan error, 1), grace: grace}
	go func() { d.done <- run(ctx) }()
	t.Cleanup(func() { _ = d.Stop(t) })
	return d
}

// Stop cancels Run and returns what it returned; nil once another Stop has taken that. The test fails if
// Run does not return in time.
func (d *Daemon) Stop(t testing.TB) error {
	d.Cancel()
	select {
	case err, ok := <-d.done:
		if ok {
			close(d.done)
		}
		return err
	case <-time.After(d.grace + 10*time.Second):
		t.Errorf("Run did not return within the graceful timeout %v", d.grace)
		return errors.New("timeout")
	}
}
