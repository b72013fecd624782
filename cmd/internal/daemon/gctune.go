package daemon

import (
	"os"
	"runtime/debug"
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
