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
// the live heap, or at what the program allocates in Busy, whichever is more, but never below Floor. Go's
// one fixed percent cannot do both: with many tunnels open the live heap is tens of MiB and a hundred percent
// of it is memory held for nothing, while a bulk transfer allocates hundreds of MB a second on a live heap of
// a few MiB, and a small percent of that would collect every few hundred KiB of data. A floor high enough
// for the transfer would be held for nothing where little is allocated (slow readers, idle tunnels); the
// allocation rate tells the two apart.
type GCPacer struct {
	Percent    int           // headroom as a percent of the live heap
	Busy       time.Duration // headroom: what is allocated in this long, at the last reading's rate
	Floor      uint64        // least headroom, in bytes
	MaxPercent int           // the highest percent set
	Every      time.Duration // how often the live heap and the allocation rate are read
}

// ServerGC paces the tunnel server. Measured side by side with Go's default and with the pacer before it
// (make bench, docs/performance.md): a fifth to a third less server memory with 1,000 tunnels open, less
// beside slow readers, bulk transfers as fast. The agent keeps Go's default: its pool keeps read buffers
// live, so during a bulk transfer a quarter of its live heap is little headroom, and a pacer there cost
// bulk throughput in the same benchmark.
var ServerGC = GCPacer{Percent: 25, Busy: 50 * time.Millisecond, Floor: 4 << 20, MaxPercent: 1000, Every: 500 * time.Millisecond}

// runtimeHeapMinimum is the Go runtime's least heap goal at a percent of 100; it scales with the percent.
const runtimeHeapMinimum = 4 << 20

// Run adjusts the collector's percent until ctx ends. GOGC in the environment is the user's choice and
// wins: Run then only waits.
func (p GCPacer) Run(ctx context.Context) error {
	if os.Getenv("GOGC") != "" {
		<-ctx.Done()
		return nil
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(sample)
	lastAllocs, lastRead := sample[3].Value.Uint64(), time.Now()
	last := -1
	t := time.NewTicker(p.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		metrics.Read(sample)
		now, allocs := time.Now(), sample[3].Value.Uint64()
		rate := float64(allocs-lastAllocs) / now.Sub(lastRead).Seconds()
		lastAllocs, lastRead = allocs, now
		roots := sample[1].Value.Uint64() + sample[2].Value.Uint64()
		if pct := p.percentFor(sample[0].Value.Uint64(), roots, rate); pct != last {
			debug.SetGCPercent(pct)
			last = pct
		}
	}
}

// percentFor is the percent that gives a live heap of live bytes, whose goroutine stacks and globals hold
// roots bytes, allocating rate bytes a second, the pacer's headroom. The runtime lets garbage pile up to the
// percent of live and roots together, and to no less than runtimeHeapMinimum scaled by the percent in all:
// both are allowed for, so that the heap's goal comes out at live plus the headroom.
func (p GCPacer) percentFor(live, roots uint64, rate float64) int {
	if live == 0 {
		// Nothing collected yet: Go's default. A high percent would put off the first collection for tens of
		// MiB, through the least heap goal.
		return 100
	}
	headroom := max(live*uint64(p.Percent)/100, p.Floor, uint64(max(rate, 0)*p.Busy.Seconds()))
	pct := min(headroom*100/(live+roots), (live+headroom)*100/runtimeHeapMinimum, uint64(p.MaxPercent))
	return int(max(pct, 1))
}
