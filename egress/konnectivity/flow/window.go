package flow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults of the server's and the agent's --flow-control-window-bytes and --flow-control-max-window-bytes.
//
// A connection starts with DefaultWindow. Its window doubles, up to DefaultMaxWindow, when its consumer takes
// a whole window within growEvery, or (on a long path, where a window takes longer than that to come
// round) when the consumer has drained nearly everything while the sender is nearly out of credit: then
// the window, not the consumer, is what holds the connection back. It halves again, at most every
// shrinkEvery (shrinkBelowEvery below where it started), while the consumer leaves more than half of it
// waiting, down to a quarter of where it started (but not below MinWindow): a reader that takes 64 KB/s
// needs a few KiB in flight, not the 64 KiB a connection is given before anything is known of its reader.
// A slow reader therefore costs the other side about a quarter of the window it started with, and the
// connections of one stream hold together no more than their starting windows plus a Budget.
const (
	DefaultWindow    = 64 << 10
	DefaultMaxWindow = 4 << 20
	// MinWindow and MaxWindow bound both settings. Below MinWindow the grants outnumber the data; MaxWindow is
	// the most one connection may make its peer hold.
	MinWindow = 16 << 10
	MaxWindow = 64 << 20
)

// The periods of a window's growth and shrinking: see above. Above where it started, a window halves at most
// once a second, so that a reader held back by a long path rather than by its own pace (whose window halves
// and grows again by turns) is not held back every few round trips. Below, where only readers that lag
// are, it halves four times a second, so that one reaches its least within a second.
const (
	growEvery        = 50 * time.Millisecond
	shrinkEvery      = time.Second
	shrinkBelowEvery = 250 * time.Millisecond
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
	initial  int64
	least    int64 // the smallest it shrinks to: a quarter of initial, but not below MinWindow, nor above initial
	max      int64
	budget   *Budget // shared with the other connections of the stream; nil: none
	charged  int64   // what this connection holds of budget: its commitment beyond initial
	released bool    // the connection is over: nothing more is granted, nor taken from budget
	granted  int64   // credit given to the sender since the start, its initial window included
	received int64
	consumed int64
	resized  time.Time // when size last changed
	period   time.Time // when the current growEvery period began
	turnover int64     // bytes consumed in it
	now      func() time.Time
}

// NewWindow returns the receiving side of a connection whose sender starts with initial bytes of credit; the
// window grows up to largest, as far as budget allows (nil: no bound beyond largest).
func NewWindow(initial, largest int, budget *Budget) *Window {
	start := int64(initial)
	return &Window{size: start, initial: start, least: max(start/4, min(start, MinWindow)), max: int64(largest),
		budget: budget, granted: start, now: time.Now}
}

// Budget bounds what the connections of one stream may cost together beyond the windows they started with.
// A connection's cost is what it was granted and has not consumed: what waits for its consumer plus what its
// sender may still send. Many slow readers on one agent may each have made their window grow while their
// clients filled their own buffers; the budget keeps what they hold together to their starting windows plus
// the budget, however their windows grow and shrink.
type Budget struct {
	mu   sync.Mutex
	left int64
}

// StreamBudget is the growth budget of one stream's connections: the largest window, enough for one bulk
// transfer at full speed; several at once share it.
func StreamBudget(max int) int { return max }

// NewBudget returns a budget of n bytes.
func NewBudget(n int) *Budget { return &Budget{left: int64(n)} }

// take takes up to n bytes, and returns how many it took.
func (b *Budget) take(n int64) int64 {
	if b == nil {
		return n
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, b.left)
	b.left -= n
	return n
}

func (b *Budget) give(n int64) {
	if b == nil || n == 0 {
		return
	}
	b.mu.Lock()
	b.left += n
	b.mu.Unlock()
}

// Left is what is left of the budget; a nil budget has none.
func (b *Budget) Left() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.left)
}

// shrinkPeriod is how soon after its last resize the window may halve.
func (w *Window) shrinkPeriod() time.Duration {
	if w.size > w.initial {
		return shrinkEvery
	}
	return shrinkBelowEvery
}

// Release gives what the connection holds of its budget back: the connection is over. It is idempotent,
// and a Consume after it (a writer that was still writing when the connection ended) grants nothing and
// takes no budget, which no later Release would give back.
func (w *Window) Release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.budget.give(w.charged)
	w.charged, w.released = 0, true
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
// what is owed is too small to be worth a message (a quarter of the window), or while the connection has
// more outstanding than its window (it shrank) or than its budget allows. Up to the window it started with,
// a connection needs no budget: a sender with no credit left is always owed a grant once what it sent has
// been consumed down to three quarters of its window. After Release it returns 0.
func (w *Window) Consume(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.released {
		return 0
	}
	w.consumed += int64(n)
	// What the connection holds beyond its first window shrank as it was consumed: give that back.
	if over := max(w.granted-w.consumed-w.initial, 0); over < w.charged {
		w.budget.give(w.charged - over)
		w.charged = over
	}
	buffered := w.received - w.consumed
	t := w.now()
	if t.Sub(w.period) >= growEvery {
		w.period, w.turnover = t, 0
	}
	w.turnover += int64(n)
	switch {
	case w.size < w.max && (w.turnover >= w.size ||
		buffered <= w.size/4 && w.granted-w.received < w.size/4 && t.Sub(w.resized) >= growEvery):
		// A whole window was consumed within growEvery, or the consumer has taken nearly everything while
		// the sender is nearly out of credit (on a long path, where a window takes longer than growEvery to
		// come round): either way the window, not the consumer, holds the connection back.
		// Only growth beyond the first window is paid from the budget: a window that shrank below it gets
		// back there whatever the other connections hold.
		grown := min(2*w.size, w.max)
		if extra := max(grown, w.initial) - max(w.size, w.initial); w.budget == nil || int64(w.budget.Left()) >= extra {
			w.size, w.resized, w.period, w.turnover = grown, t, t, 0
		}
	case buffered > w.size/2 && w.size > w.least && t.Sub(w.resized) >= w.shrinkPeriod():
		w.size, w.resized = max(w.size/2, w.least), t
	}
	grant := w.consumed + w.size - w.granted
	if grant < w.size/4 {
		return 0
	}
	// What the grant commits beyond the first window is paid from the budget, as far as it goes. What the
	// first window needs is never short, so a sender that is owed a quarter of it always gets it.
	if need := w.size - w.initial - w.charged; need > 0 {
		got := w.budget.take(need)
		if grant -= need - got; grant < w.initial/4 {
			w.budget.give(got)
			return 0
		}
		w.charged += got
	}
	w.granted += grant
	return int(grant)
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

// Wait returns the credit available, waiting while there is none, and how long it waited: the time the
// receiver's window, not the data, held the sender back. It fails with ctx's error, or with the error Close
// was given.
func (c *Credit) Wait(ctx context.Context) (int, time.Duration, error) {
	var since time.Time
	waited := func() time.Duration {
		if since.IsZero() {
			return 0
		}
		return time.Since(since)
	}
	for {
		c.mu.Lock()
		avail, err := c.avail, c.err
		c.mu.Unlock()
		if err != nil {
			return 0, waited(), err
		}
		if avail > 0 {
			return int(min(avail, int64(MaxWindow))), waited(), nil
		}
		if since.IsZero() {
			since = time.Now()
		}
		select {
		case <-c.wake:
		case <-ctx.Done():
			return 0, waited(), ctx.Err()
		}
	}
}

// Use spends n bytes of credit, which an earlier Wait returned.
func (c *Credit) Use(n int) {
	c.mu.Lock()
	c.avail -= int64(n)
	c.mu.Unlock()
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
