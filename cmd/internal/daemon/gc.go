package daemon

import (
	"context"
	"runtime/debug"
	"time"
)

// ReleaseMemoryWhen returns freed memory to the operating system once, settle after ready first reports
// true (checked every poll), so that a daemon that sits idle after start-up does not keep the heap its
// start-up needed (TLS handshakes, certificate parsing, the first gRPC buffers) in its RSS. It returns
// when that is done or ctx ends; run it on its own goroutine.
func ReleaseMemoryWhen(ctx context.Context, ready func() bool, poll, settle time.Duration) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for !ready() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	s := time.NewTimer(settle)
	defer s.Stop()
	select {
	case <-ctx.Done():
		return
	case <-s.C:
	}
	debug.FreeOSMemory()
}
