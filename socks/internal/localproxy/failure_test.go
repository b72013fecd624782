package localproxy

import (
	"testing"
	"time"
)

// Failed requests are logged at the default level, a burst and then one per second, and the next line says
// how many were left out.
func TestFailureLogIsRateLimited(t *testing.T) {
	var l FailureLog
	now := time.Unix(1000, 0)
	written := 0
	for range 100 {
		if ok, _ := l.allow(now); ok {
			written++
		}
		now = now.Add(time.Millisecond)
	}
	if written != failureLogBurst {
		t.Fatalf("100 failures in 0.1s wrote %d lines, want %d", written, failureLogBurst)
	}
	now = now.Add(failureLogEvery)
	ok, suppressed := l.allow(now)
	if !ok || suppressed != 100-failureLogBurst {
		t.Fatalf("a failure a second later: written %v, suppressed %d, want true and %d", ok, suppressed, 100-failureLogBurst)
	}
}
