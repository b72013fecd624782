// Package flow keeps one tunnelled connection from holding up the others that share its agent's stream (ANP
// issue 180). The server reads one stream per agent, and the agent one stream per server, for every
// connection between them; if that reader waited on one slow peer (kube-apiserver's reader on the server, a
// backend on the agent), every connection on the stream would wait too.
//
// Two mechanisms, for two kinds of peer:
//
//   - Per-connection flow control (window.go, protocol.go; specified in docs/flow-control.md), when both ends
//     are konnect: a sender puts no more of a connection on the stream than its receiver granted, and the
//     receiver grants more as the connection's consumer drains. The stream's reader never waits, and a
//     connection costs its receiver at most its window.
//   - With a peer that does not speak it (upstream's proxy-server or proxy-agent), a bounded Queue per
//     connection: the stream's reader pushes into it and moves on, and the connection's own writer drains it
//     at the peer's pace. A push into a full queue waits, as a TCP sender waits for a slow receiver, for as
//     long as the writer keeps making progress; a queue whose writer makes no progress for the stall timeout
//     gives up, and only that connection is closed.
//
// Under flow control the Queue stays, as the connection's writer, but the window bounds it instead of a limit
// (Unbound): its pushes never wait. Small payloads are merged as they are queued (Merge, AppendSmall), so
// that a window of tiny packets costs about its bytes.
package flow

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Defaults of the server's and the agent's --connection-buffer-bytes and --connection-stall-timeout.
const (
	DefaultLimit        = 8 << 20
	DefaultStallTimeout = 5 * time.Second
)

var (
	// ErrStalled: the queue stayed full, with no progress, for the stall timeout.
	ErrStalled = errors.New("reader stalled: its queue stayed full with no progress, so the connection was closed and the shared stream keeps flowing")
	// ErrClosed: the connection is closed, or closing, and takes no more data.
	ErrClosed = errors.New("connection closed")
)

// Hooks let the owner count what the queue does. Each may be nil.
type Hooks struct {
	Queued  func(delta int) // bytes entered (positive) or left (negative) the queue
	Waited  func()          // a push found the queue full and began to wait
	Stalled func()          // a push gave up and failed the queue with ErrStalled; called once
	// Moving, asked when a push has waited the stall timeout with no progress from the writer, says whether
	// data still moves below the writer: a TCP send buffer that drains to a slow reader wakes a blocked
	// write only once about a third of it is free, which at 100 KB/s can take longer than the timeout. True
	// starts the stall clock again.
	Moving func() bool
}

// Queue holds items of type T for one connection's writer.
type Queue[T any] struct {
	limit int
	stall time.Duration
	size  func(T) int

	// MaxBatch is the most bytes handed to the writer at once (at least one item); 0 means everything queued.
	// Smaller batches report progress more often, which is what tells a slow writer from a stalled one.
	MaxBatch int
	Hooks    Hooks
	// Idle, if set, runs on the writer goroutine each time it has written everything queued, before it
	// stops. It may take its time: a push meanwhile waits for this writer, which goes on once Idle returns.
	Idle func()
	// Merge, if set, may combine an item pushed with the last one queued, which the writer has not taken
	// yet: it returns the combined item and true, or false to queue v on its own. owned says that tail is
	// an item Merge returned, whose storage it may reuse. It runs with the queue locked. Merging small
	// items as they come keeps what a queue holds close to what it counts: a window of 1-byte packets
	// would otherwise cost the heap a hundred times its size.
	Merge func(tail, v T, owned bool) (T, bool)

	write func([]T) error
	end   func(error)
	batch []T // the writer's, reused between batches

	mu      sync.Mutex
	items   []T
	bytes   int
	merged  bool          // the last item is one Merge returned
	unbound bool          // Unbound was called: pushes never wait
	err     error         // set once: ErrClosed by Close, or why the queue failed
	closing bool          // Close was called: the writer flushes, then stops
	running bool          // a writer goroutine is on
	idled   bool          // the writer ran Idle since it last wrote
	ended   bool          // end has been called
	space   chan struct{} // the writer made progress, or the queue ended
}

// New returns a queue that takes limit bytes without waiting, as measured by size, and gives up on a writer
// that makes no progress for stall.
func New[T any](limit int, stall time.Duration, size func(T) int) *Queue[T] {
	return &Queue[T]{limit: limit, stall: stall, size: size, space: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (q *Queue[T]) queued(delta int) {
	if q.Hooks.Queued != nil && delta != 0 {
		q.Hooks.Queued(delta)
	}
}

// Push queues v. While the queue holds limit bytes or more it waits; it gives up with ErrStalled, and
// fails the queue, once the writer has made no progress for the stall timeout. An item bigger than limit
// still goes into an empty queue, so that nothing is refused for its size. Push returns ctx's error if ctx
// ends first, and the queue's error once it is closed or failed.
func (q *Queue[T]) Push(ctx context.Context, v T) error {
	n := q.size(v)
	var timer *time.Timer
	for {
		q.mu.Lock()
		if q.err != nil {
			err := q.err
			q.mu.Unlock()
			stopTimer(timer)
			return err
		}
		if q.unbound || q.bytes == 0 || q.bytes+n <= q.limit {
			added := q.add(v, n)
			q.kick()
			q.mu.Unlock()
			stopTimer(timer)
			q.queued(added)
			return nil
		}
		q.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(q.stall)
			if q.Hooks.Waited != nil {
				q.Hooks.Waited()
			}
		}
		select {
		case <-q.space:
			// Progress (or the end of the queue, which the next round sees): the stall clock starts again.
			timer.Reset(q.stall)
		case <-timer.C:
			if q.Hooks.Moving != nil && q.Hooks.Moving() {
				timer.Reset(q.stall)
				continue
			}
			if q.fail(ErrStalled) && q.Hooks.Stalled != nil {
				q.Hooks.Stalled()
			}
			return ErrStalled
		case <-ctx.Done():
			stopTimer(timer)
			return ctx.Err()
		}
	}
}

// add queues v, of size n, merged into the last item if Merge takes it, and returns how much the queue's
// count grew. q.mu is held.
func (q *Queue[T]) add(v T, n int) int {
	if last := len(q.items) - 1; q.Merge != nil && last >= 0 {
		tail := q.items[last]
		before := q.size(tail)
		if m, ok := q.Merge(tail, v, q.merged); ok {
			q.items[last], q.merged = m, true
			added := q.size(m) - before
			q.bytes += added
			return added
		}
	}
	q.items = append(q.items, v)
	q.merged = false
	q.bytes += n
	return n
}

// Unbound lifts the queue's limit: pushes no longer wait, so they never stall either. It is for a
// connection under flow control, whose window bounds what may be queued; Merge then bounds what its items
// cost beyond their bytes.
func (q *Queue[T]) Unbound() {
	q.mu.Lock()
	q.unbound = true
	q.mu.Unlock()
	signal(q.space)
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// Fail ends the queue with err, drops what is queued, and stops the writer. The first failure wins; it
// also overrides a Close whose flush has not finished.
func (q *Queue[T]) Fail(err error) { q.fail(err) }

// fail is Fail, and reports whether err is now the queue's error.
func (q *Queue[T]) fail(err error) (set bool) {
	q.mu.Lock()
	if q.err == nil || q.closing {
		q.err, q.closing, set = err, false, true
	}
	dropped := q.bytes
	clear(q.items)
	q.items, q.bytes = q.items[:0], 0
	q.kick()
	q.mu.Unlock()
	q.queued(-dropped)
	signal(q.space)
	return set
}

// Close lets the writer send what is queued and then stop; later pushes fail with ErrClosed.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	if q.err == nil {
		q.err, q.closing = ErrClosed, true
	}
	q.kick()
	q.mu.Unlock()
	signal(q.space)
}

// Progress tells waiting pushes that the writer moved data within a batch, which restarts their stall
// clock. A batch may be large: a megabyte takes ten seconds to a reader that keeps taking 100 KB/s, and such
// a reader is slow, not stalled. Only a writer that moves nothing for the stall timeout is stalled.
func (q *Queue[T]) Progress() { signal(q.space) }

// MergeBelow is the payload size from which an item is queued as it is: merging it would cost a copy for a
// count of items that is already low.
const MergeBelow = 16 << 10

// AppendSmall is the merge rule for payloads (a Merge hook's): v joins tail when v is below MergeBelow,
// tail is below it too or was made by AppendSmall (owned), and together they fit in max bytes. It returns
// the merged payload, which reuses tail's storage if owned (a tail that is not owned may alias a buffer
// others read, and is copied), and whether it merged.
func AppendSmall(tail, v []byte, owned bool, max int) ([]byte, bool) {
	if len(v) >= MergeBelow || !owned && len(tail) >= MergeBelow || len(tail)+len(v) > max {
		return nil, false
	}
	if !owned {
		tail = append(make([]byte, 0, 2*(len(tail)+len(v))), tail...)
	}
	return append(tail, v...), true
}

// Piece is the most a writer hands to its peer between two calls of Progress: a reader that takes less than
// Piece bytes per stall timeout is taken for a stalled one.
const Piece = 64 << 10

// Pieces calls write with bufs in order, in groups of at most Piece bytes (a larger buffer is cut), and
// progress after each group that write took.
func Pieces(bufs [][]byte, write func([][]byte) error, progress func()) error {
	var group [][]byte
	n := 0
	for _, b := range bufs {
		for len(b) > 0 {
			k := min(len(b), Piece-n)
			group, n, b = append(group, b[:k]), n+k, b[k:]
			if n < Piece {
				continue
			}
			if err := write(group); err != nil {
				return err
			}
			progress()
			group, n = group[:0], 0
		}
	}
	if n == 0 {
		return nil
	}
	if err := write(group); err != nil {
		return err
	}
	progress()
	return nil
}

// Len is how many bytes wait for the writer.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}

// Start gives the queue its writer. While items wait, one goroutine hands them to write in order, in
// batches of at most MaxBatch bytes, and it exits once the queue is empty: an idle connection holds no
// goroutine, and a server holds thousands of them. end runs once, on that goroutine, when the queue ends:
// with nil once a Close has been flushed, or with why the queue failed (Fail, a stall, or write's error,
// which fails the queue). write must not keep the slice. Start is called once.
func (q *Queue[T]) Start(write func([]T) error, end func(error)) {
	q.mu.Lock()
	q.write, q.end = write, end
	q.kick()
	q.mu.Unlock()
}

// kick starts the writer if there is work for it: items, or an end to report. q.mu is held.
func (q *Queue[T]) kick() {
	if q.write == nil || q.running || q.ended || (len(q.items) == 0 && q.err == nil) {
		return
	}
	q.running = true
	go q.drain()
}

// drain is the writer goroutine: it writes until the queue is empty, or ends it.
func (q *Queue[T]) drain() {
	for {
		q.mu.Lock()
		if q.err != nil && !q.closing {
			q.finish(q.err)
			return
		}
		k, n := 0, 0
		for k < len(q.items) {
			m := q.size(q.items[k])
			if k > 0 && q.MaxBatch > 0 && n+m > q.MaxBatch {
				break
			}
			n += m
			k++
		}
		if k == 0 {
			if q.closing {
				q.finish(nil)
				return
			}
			if q.Idle != nil && !q.idled {
				// Still running, so that a push meanwhile leaves its item to this writer.
				q.idled = true
				q.mu.Unlock()
				q.Idle()
				continue
			}
			q.running, q.idled = false, false
			q.mu.Unlock()
			return
		}
		q.idled = false
		q.batch = append(q.batch[:0], q.items[:k]...)
		rest := copy(q.items, q.items[k:])
		clear(q.items[rest:])
		q.items = q.items[:rest]
		q.mu.Unlock()

		err := q.write(q.batch)
		clear(q.batch)
		q.mu.Lock()
		if q.err == nil || q.closing {
			// Still counted until written; a Fail meanwhile has already zeroed the count.
			q.bytes -= n
		} else {
			n = 0
		}
		q.mu.Unlock()
		q.queued(-n)
		signal(q.space)
		if err != nil {
			q.fail(err)
		}
	}
}

// finish ends the queue for the writer: q.mu is held, and released before end runs.
func (q *Queue[T]) finish(err error) {
	q.running, q.ended = false, true
	q.batch = nil
	q.mu.Unlock()
	if q.end != nil {
		q.end(err)
	}
}
