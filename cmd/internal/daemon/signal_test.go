package daemon

import (
	"context"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// After the first signal the watcher waits for a second one; the cancel func must still release it, or every
// RunCommand that was stopped by a signal leaves a goroutine behind (in tests that run many, one each).
func TestSignalContextReleasesItsGoroutine(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	ctx, cancel := SignalContext(context.Background())
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("SIGTERM did not cancel the context")
	}
	cancel()
	goleak.VerifyNone(t, ignore)
}
