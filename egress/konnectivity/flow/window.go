package flow

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Defaults of the server's and the agent's --flow-control-window-bytes and --flow-control-max-window-bytes.
//
// A connection starts with DefaultWindow and its window doubles, up to DefaultMaxWindow, each time its
// consumer drains everything while the sender is nearly out of credit: then the window, not the consumer, is
// what holds the connection back. A slow reader never drains faster than data arrives, so its window stays
// where it started, and that is all the memory it costs the other side.
const (
	DefaultWindow    = 64 << 10
	DefaultMaxWindow = 4 << 20
	// MinWindow and MaxWindow bound both settings. Below MinWindow the grants outnumber the data; MaxWindow is
	// the most one connection may make its peer hold.
	MinWindow = 16 << 10
	MaxWindow = 64 << 20
)

var (
	// ErrWindowExceeded: the peer sent more data for a connection than it had been granted.
	ErrWindowExceeded = errors.New("flow control: the peer sent more than its window allowed")
	// ErrCreditOverflow: the peer granted credit beyond the largest window it announced.
	ErrCreditOverflow = errors.New("flow control: the peer granted more than its announced window")
)

// Window is the receiving side of one connection: it checks that the sender keeps within what it was
// granted, and says how much to grant back as the connection's consumer drains.
type Window struct {
	mu       sync.Mutex
	size     int64 // the window now: the most that may be granted and not yet consumed
	max      int64
	granted  int64 // credit given to the sender since the start, its initial window included
	received int64
	consumed int64
}

// NewWindow returns the receiving side of a connection whose sender starts with initial bytes of credit; the
// window grows up to max.
func NewWindow(initial, max int) *Window {
	return &Window{size: int64(initial), max: int64(max), granted: int64(initial)}
}

// Receive accounts n bytes that arrived from the sender. It fails once the sender has sent more than it was
// granted; the connection must then be closed, since its sender does not honour the protocol.
func (w *Window) Receive(n int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.received += int64(n)
	if w.received > w.granted {
		return fmt.Errorf("%w: %d bytes received, %d granted", ErrWindowExceeded, w.received, w.granted)
	}
	return nil
}

// Consume accounts n bytes handed to the consumer and returns the credit to grant the sender now, or 0 while
// what is owed is too small to be worth a message (a quarter of the window). Whatever is withheld is at most
// a quarter of the window, so a sender always has credit left, or is owed a grant.
func (w *Window) Consume(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.consumed += int64(n)
	if w.received == w.consumed && w.granted-w.received < w.size/4 && w.size < w.max {
		w.size = min(2*w.size, w.max)
	}
	grant := w.consumed + w.size - w.granted
	if grant < w.size/4 {
		return 0
	}
	w.granted += grant
	return int(grant)
}

// Buffered is how many bytes arrived and were not consumed yet.
func (w *Window) Buffered() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(w.received - w.consumed)
}

// Size is the window now.
func (w *Window) Size() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(w.size)
}

// Credit is the sending side of one connection: how many bytes the receiver has room for. One goroutine
// sends (Wait, then Use); grants arrive from another (Add).
type Credit struct {
	mu    sync.Mutex
	avail int64
	max   int64
	err   error
	wake  chan struct{}
}

// NewCredit returns the sending side of a connection whose receiver announced an initial window and a
// largest window of max bytes.
func NewCredit(initial, max int) *Credit {
	return &Credit{avail: int64(initial), max: int64(max), wake: make(chan struct{}, 1)}
}

// Add takes a grant of n bytes. A grant that is not positive, or that would leave more credit than the
// receiver's largest window, breaks the protocol: it fails with ErrCreditOverflow and changes nothing.
func (c *Credit) Add(n int64) error {
	c.mu.Lock()
	if n <= 0 || c.avail+n > c.max {
		avail := c.avail
		c.mu.Unlock()
		return fmt.Errorf("%w: a grant of %d bytes on top of %d, with a largest window of %d", ErrCreditOverflow, n, avail, c.max)
	}
	c.avail += n
	c.mu.Unlock()
	signal(c.wake)
	return nil
}

// Wait returns the credit available, waiting while there is none. It fails with ctx's error, or with the
// error Close was given.
func (c *Credit) Wait(ctx context.Context) (int, error) {
	for {
		c.mu.Lock()
		avail, err := c.avail, c.err
		c.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if avail > 0 {
			return int(min(avail, int64(MaxWindow))), nil
		}
		select {
		case <-c.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Use spends n bytes of credit, which an earlier Wait returned.
func (c *Credit) Use(n int) {
	c.mu.Lock()
	c.avail -= int64(n)
	c.mu.Unlock()
}

// Available is the credit left.
func (c *Credit) Available() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.avail)
}

// Close wakes a waiting sender with err, and makes every later Wait fail with it.
func (c *Credit) Close(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	signal(c.wake)
}
