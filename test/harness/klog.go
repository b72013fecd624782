package harness

import (
	"flag"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// CaptureKlog sends klog's output, at the highest verbosity, to a buffer until the test ends, and returns a
// function that reads it. klog's output is process-wide: a test that uses it must not run in parallel.
func CaptureKlog(t testing.TB) func() string {
	t.Helper()
	return CaptureKlogAt(t, 10)
}

// CaptureKlogAt is CaptureKlog at verbosity v: 0 for what a daemon logs by default.
func CaptureKlogAt(t testing.TB, v int) func() string {
	t.Helper()
	// A flag set of its own reaches klog's settings whether or not the test binary registered klog's flags.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "v": strconv.Itoa(v)} {
		old := fs.Lookup(name).Value.String()
		if err := fs.Set(name, v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fs.Set(name, old) })
	}
	var mu sync.Mutex
	var buf strings.Builder
	klog.SetOutput(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}))
	t.Cleanup(func() { klog.SetOutput(os.Stderr) })
	return func() string {
		klog.Flush()
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
