package daemon

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestGCPacerPercent(t *testing.T) {
	p := GCPacer{Percent: 25, Busy: 50 * time.Millisecond, Floor: 4 << 20, MaxPercent: 1000}
	for _, tc := range []struct {
		live, roots uint64
		rate        float64 // bytes allocated a second
		want        int
	}{
		{0, 0, 200e6, 100},          // nothing collected yet: Go's default
		{1 << 10, 0, 0, 100},        // the runtime's least goal, 4 MiB at 100, is the floor already
		{2 << 20, 0, 0, 150},        // 4 MiB of headroom on 2 MiB: a goal of 6 MiB, the least goal's 150%
		{8 << 20, 0, 0, 50},         // the floor: idle or slow tunnels allocate little
		{16 << 20, 0, 0, 25},        // from here on, a quarter of what is live
		{400 << 20, 0, 0, 25},       // many tunnels: 100 MiB of headroom, not 400
		{16 << 20, 16 << 20, 0, 12}, // stacks as large as the heap: the percent applies to both
		{4 << 20, 0, 200e6, 238},    // a bulk transfer: 10 MB, what it allocates in 50 ms
		{16 << 20, 0, 200e6, 59},    // the same beside many tunnels
		{1 << 20, 0, 400e6, 501},    // 20 MB on 1 MiB: the least goal is what binds
		{1 << 20, 0, 4e9, 1000},     // capped
		{400 << 20, 0, 200e6, 25},   // a quarter of the live heap is more than 50 ms of allocation
		{8 << 20, 0, 16 << 20, 50},  // 16 MiB a second (slow readers): the floor
		{8 << 20, 0, 1 << 30, 639},  // 1 GiB a second: 51 MiB
		{1 << 30, 1 << 40, 0, 1},    // never 0, which would collect without end
	} {
		if got := p.percentFor(tc.live, tc.roots, tc.rate); got != tc.want {
			t.Errorf("live %d, roots %d, allocating %.0f bytes/s: percent %d, want %d", tc.live, tc.roots, tc.rate, got, tc.want)
		}
	}
}

// gogc is the collector's percent now.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// The pacer sets the collector's percent while it runs and returns when ctx ends; with GOGC in the
// environment it leaves the percent alone.
func TestGCPacerRun(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	// A floor of a TiB asks for more than MaxPercent, whatever this test process holds: the percent is 37.
	p := GCPacer{Percent: 25, Floor: 1 << 40, MaxPercent: 37, Every: 10 * time.Millisecond}
	run := func(t *testing.T, wait func() bool) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		deadline := time.Now().Add(5 * time.Second)
		for !wait() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after ctx ended")
		}
	}

	t.Run("sets the percent", func(t *testing.T) {
		runtime.GC() // the live heap is what the last collection found: none yet would read as empty
		run(t, func() bool { return gogc() == 37 })
		if got := gogc(); got != 37 {
			t.Fatalf("percent %d, want 37", got)
		}
	})
	t.Run("GOGC wins", func(t *testing.T) {
		t.Setenv("GOGC", "100")
		debug.SetGCPercent(100)
		start := time.Now()
		run(t, func() bool { return time.Since(start) > 100*time.Millisecond })
		if got := gogc(); got != 100 {
			t.Fatalf("percent %d with GOGC=100 set, want it left alone", got)
		}
	})
}
