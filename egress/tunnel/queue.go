package tunnel

import (
	"errors"
	"sync"
	"time"
)

// errStalled is returned once a frontend reader left its queue full for longer than the stall timeout.
var errStalled = errors.New("frontend reader stalled: its buffer stayed full, connection closed so the agent stream keeps flowing")

// errQueueClosed is returned by push after close.
var errQueueClosed = errors.New("frontend connection closed")

// sendQueue decouples one frontend connection from the agent stream that feeds it (ANP issue 180). The
// agent stream's single reader pushes and moves on; a writer goroutine per connection drains at the
// frontend's pace. Memory is bounded by limit: a push into a full queue waits, and if the queue stays full for
// stall, the connection is given up (onStall) rather than holding up every other connection on the agent.
type sendQueue[T any] struct {
	limit int
	stall time.Duration
	size  func(T) int
	// onStall runs once, on the pushing goroutine, when a push waited longer than stall.
	onStall func()
	// metrics, when set, count queued bytes and stalls.
	metrics *metrics
	// merge, when set, may combine the first items of a batch into one (fewer, larger writes when a peer
	// sent many small packets); it returns the combined item and how many items it covers (at least 1).
	merge func([]T) (T, int)

	mu     sync.Mutex
	items  []T
	bytes  int
	err    error // set once: the writer failed, the queue stalled, or it was closed
	closed bool
	wake   chan struct{} // writer waits here for items
	space  chan struct{} // pushers wait here for room
}

func newSendQueue[T any](limit int, stall time.Duration, size func(T) int, onStall func()) *sendQueue[T] {
	return &sendQueue[T]{
		limit: limit, stall: stall, size: size, onStall: onStall,
		wake: make(chan struct{}, 1), space: make(chan struct{}, 1),
	}
}

func (q *sendQueue[T]) count(f func(*metrics)) {
	if q.metrics != nil {
		f(q.metrics)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// push queues v. It waits while the queue holds limit bytes or more, and gives up after stall.
func (q *sendQueue[T]) push(v T) error {
	n := q.size(v)
	var timer *time.Timer
	for {
		q.mu.Lock()
		if q.err != nil {
			err := q.err
			q.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return err
		}
		// An item bigger than limit still goes in alone, so that nothing is ever refused for its size.
		if q.bytes == 0 || q.bytes+n <= q.limit {
			q.items = append(q.items, v)
			q.bytes += n
			q.mu.Unlock()
			signal(q.wake)
			if timer != nil {
				timer.Stop()
			}
			q.count(func(m *metrics) { m.queuedBytes.Add(float64(n)) })
			return nil
		}
		q.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(q.stall)
			q.count(func(m *metrics) { m.stalledWaits.Inc() })
		}
		select {
		case <-q.space:
		case <-timer.C:
			q.fail(errStalled)
			q.count(func(m *metrics) { m.stalledClosed.Inc() })
			if q.onStall != nil {
				q.onStall()
			}
			return errStalled
		}
	}
}

// fail stops the queue with err (the first error wins) and drops what is queued.
func (q *sendQueue[T]) fail(err error) {
	q.mu.Lock()
	if q.err == nil || q.err == errQueueClosed {
		q.err = err
		q.closed = false
	}
	dropped := 0
	for _, v := range q.items {
		dropped += q.size(v)
	}
	q.items = nil
	q.bytes -= dropped
	q.mu.Unlock()
	q.count(func(m *metrics) { m.queuedBytes.Sub(float64(dropped)) })
	signal(q.wake)
	signal(q.space)
}

// close lets the writer send what is queued and then stop; later pushes fail.
func (q *sendQueue[T]) close() {
	q.mu.Lock()
	q.closed = true
	if q.err == nil {
		q.err = errQueueClosed
	}
	q.mu.Unlock()
	signal(q.wake)
	signal(q.space)
}

// run is the writer: it sends queued items in order with send until the queue is closed and empty, send
// fails, or done is closed. It returns the send error, if any.
func (q *sendQueue[T]) run(done <-chan struct{}, send func(T) error) error {
	var batch []T
	for {
		q.mu.Lock()
		batch, q.items = q.items, batch[:0]
		closed, failed := q.closed, q.err != nil && !q.closed
		q.mu.Unlock()
		if failed {
			return nil
		}
		if len(batch) == 0 {
			if closed {
				return nil
			}
			select {
			case <-q.wake:
			case <-done:
				q.fail(errQueueClosed)
				return nil
			}
			continue
		}
		for i := 0; i < len(batch); {
			v, k := batch[i], 1
			if q.merge != nil {
				v, k = q.merge(batch[i:])
			}
			err := send(v)
			n := 0
			for _, u := range batch[i : i+k] {
				n += q.size(u)
			}
			i += k
			q.mu.Lock()
			q.bytes -= n
			failed := q.err != nil && !q.closed
			q.mu.Unlock()
			q.count(func(m *metrics) { m.queuedBytes.Sub(float64(n)) })
			signal(q.space)
			if err != nil || failed {
				// Account for what will never be sent.
				rest := 0
				for _, r := range batch[i:] {
					rest += q.size(r)
				}
				q.mu.Lock()
				q.bytes -= rest
				q.mu.Unlock()
				q.count(func(m *metrics) { m.queuedBytes.Sub(float64(rest)) })
				clear(batch)
				if err != nil {
					q.fail(err)
				}
				return err
			}
		}
		clear(batch)
	}
}
