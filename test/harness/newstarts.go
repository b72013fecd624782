package harness

import (
	"io"
	"testing"

	"go.uber.org/goleak"
)

// NewStartsNothing checks the daemons' shared promise (Options → Config → New → Run): newDaemon, a daemon's
// New, binds and prepares but starts no goroutine, since Run does; and Close of a daemon that never ran
// leaves none behind.
func NewStartsNothing(t testing.TB, newDaemon func() (io.Closer, error)) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	d, err := newDaemon()
	if err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("New started goroutines (New binds, Run starts): %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("goroutines left after Close of a daemon that never ran: %v", err)
	}
}
