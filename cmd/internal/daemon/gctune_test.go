package daemon

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestGCPacerPercent(t *testing.T) {
	p := GCPacer{Percent: 25, Floor: 8 << 20, MaxPercent: 400}
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, 400},        // nothing live yet
		{1 << 10, 400},  // the floor would ask for far more
		{2 << 20, 400},  // 8 MiB of headroom on 2 MiB
		{4 << 20, 200},  // the floor: a bulk transfer's few MiB are collected every 8 MiB, not every 1
		{16 << 20, 50},  // the floor still
		{32 << 20, 25},  // from here on, a quarter of what is live
		{400 << 20, 25}, // many tunnels: 100 MiB of headroom, not 400
	} {
		if got := p.percentFor(tc.live); got != tc.want {
			t.Errorf("live %d: percent %d, want %d", tc.live, got, tc.want)
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
	// A floor of one byte leaves the percent at Percent, whatever this test process holds.
	p := GCPacer{Percent: 37, Floor: 1, MaxPercent: 400, Every: 10 * time.Millisecond}
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
