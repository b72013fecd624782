package daemon

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// TuneGC sets the garbage collector's percent and, when memLimit > 0, a soft memory limit, unless the user
// set GOGC or GOMEMLIMIT, which always win. The proxies allocate a buffer per packet or request while their
// live heap stays a few MiB, so Go's default collects every few MiB; a higher percent trades a few tens of
// MiB of heap for a measurable share of CPU, and the memory limit brings collection back under many
// connections.
func TuneGC(percent int, memLimit int64) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(percent)
	}
	if memLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memLimit)
	}
}

// GCPacer keeps the collector's headroom (the garbage let pile up between two collections) at Percent of
// the live heap, but never below Floor. Go's one fixed percent cannot do both: with many tunnels open the
// live heap is tens of MiB and a hundred percent of it is memory held for nothing, while a bulk transfer
// has a live heap of a few MiB, and a small percent of that would collect every few hundred KiB of data.
type GCPacer struct {
	Percent    int           // headroom as a percent of the live heap
	Floor      uint64        // least headroom, in bytes
	MaxPercent int           // the highest percent set, for a nearly empty heap
	Every      time.Duration // how often the live heap is read
}

// ServerGC paces the tunnel server. Measured side by side with Go's default (make bench,
// docs/performance.md): a fifth to a third less server memory with 1,000 tunnels open, less beside many
// slow readers, one stream as fast, eight streams 3-8% slower. The agent keeps Go's default: its pool keeps read buffers live,
// so during a bulk transfer a quarter of its live heap is little headroom, and the same pacer there cost
// bulk throughput in the same benchmark.
var ServerGC = GCPacer{Percent: 25, Floor: 8 << 20, MaxPercent: 400, Every: 500 * time.Millisecond}

// Run adjusts the collector's percent until ctx ends. GOGC in the environment is the user's choice and
// wins: Run then only waits.
func (p GCPacer) Run(ctx context.Context) error {
	if os.Getenv("GOGC") != "" {
		<-ctx.Done()
		return nil
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	last := -1
	t := time.NewTicker(p.Every)
	defer t.Stop()
	for {
		metrics.Read(sample)
		if pct := p.percentFor(sample[0].Value.Uint64()); pct != last {
			debug.SetGCPercent(pct)
			last = pct
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// percentFor is the percent that gives a live heap of live bytes the pacer's headroom.
func (p GCPacer) percentFor(live uint64) int {
	if live == 0 {
		return p.MaxPercent
	}
	return int(min(max(uint64(p.Percent), p.Floor*100/live), uint64(p.MaxPercent)))
}
