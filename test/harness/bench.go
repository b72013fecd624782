package harness

import (
	"syscall"
	"testing"
	"time"
)

// ReportCPU adds the process's CPU time per MB moved (client, server and agent together, when they share
// the test binary): on a shared, noisy machine it varies much less than wall-clock throughput. Defer the
// function it returns.
func ReportCPU(b *testing.B, bytesPerOp int64) func() {
	start := cpuTime()
	return func() {
		mb := float64(bytesPerOp) * float64(b.N) / 1e6
		b.ReportMetric(float64((cpuTime()-start).Microseconds())/mb, "cpu-µs/MB")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
