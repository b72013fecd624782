package flow

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func size(b []byte) int { return len(b) }

// run starts q's writer and waits for the queue to end.
func run(q *Queue[[]byte], write func([][]byte) error) error {
	ended := make(chan error, 1)
	q.Start(write, func(err error) { ended <- err })
	return <-ended
}

// TestOrderBatchesAndAccounting: items come out in order, in batches of at most MaxBatch bytes, and every
// byte counted in is counted out.
func TestOrderBatchesAndAccounting(t *testing.T) {
	q := New(1<<20, time.Second, size)
	q.MaxBatch = 64 << 10
	queued := 0
	q.Hooks.Queued = func(d int) { queued += d }
	var want bytes.Buffer
	for i := range 200 {
		b := bytes.Repeat([]byte{byte(i)}, 4096)
		want.Write(b)
		if err := q.Push(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	q.Close()
	var got bytes.Buffer
	batches := 0
	err := run(q, func(batch [][]byte) error {
		batches++
		n := 0
		for _, b := range batch {
			n += len(b)
			got.Write(b)
		}
		if n > q.MaxBatch {
			t.Errorf("batch of %d bytes, more than MaxBatch", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("data mangled: %d of %d bytes", got.Len(), want.Len())
	}
	if want := (want.Len() + q.MaxBatch - 1) / q.MaxBatch; batches != want {
		t.Errorf("%d batches, want %d", batches, want)
	}
	if q.Len() != 0 || queued != 0 {
		t.Errorf("accounting left %d bytes (hooks: %d)", q.Len(), queued)
	}
	if err := q.Push(context.Background(), nil); !errors.Is(err, ErrClosed) {
		t.Errorf("push after close: %v", err)
	}
}

// TestStallWithoutProgress: a push into a full queue whose writer is stuck gives up after the stall timeout,
// fails the queue, and calls the Stalled hook.
func TestStallWithoutProgress(t *testing.T) {
	q := New(64<<10, 200*time.Millisecond, size)
	stalled := 0
	q.Hooks.Stalled = func() { stalled++ }
	if err := q.Push(context.Background(), make([]byte, 60<<10)); err != nil { // fits
		t.Fatal(err)
	}
	// The writer is stuck on the first item, which still counts until it is written.
	release := make(chan struct{})
	ran := make(chan error, 1)
	q.Start(func([][]byte) error { <-release; return nil }, func(err error) { ran <- err })
	began := time.Now()
	err := q.Push(context.Background(), make([]byte, 60<<10))
	if !errors.Is(err, ErrStalled) || time.Since(began) < 150*time.Millisecond {
		t.Fatalf("push into a full queue: %v after %v", err, time.Since(began))
	}
	if stalled != 1 {
		t.Errorf("Stalled hook called %d times", stalled)
	}
	close(release)
	if err := <-ran; !errors.Is(err, ErrStalled) {
		t.Errorf("the queue ended with %v, want ErrStalled", err)
	}
	if q.Len() != 0 {
		t.Errorf("a failed queue holds %d bytes", q.Len())
	}
}

// TestMovingPostponesTheStall: while the Moving hook says data still moves below a writer stuck in one
// write, a push into the full queue waits on; once it says nothing moved for a stall timeout, the push gives
// up.
func TestMovingPostponesTheStall(t *testing.T) {
	const stall = 100 * time.Millisecond
	q := New(64<<10, stall, size)
	asked := 0
	q.Hooks.Moving = func() bool { asked++; return asked <= 3 }
	if err := q.Push(context.Background(), make([]byte, 60<<10)); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	q.Start(func([][]byte) error { <-release; return nil }, nil)
	began := time.Now()
	err := q.Push(context.Background(), make([]byte, 60<<10))
	if !errors.Is(err, ErrStalled) || asked != 4 || time.Since(began) < 4*stall*3/4 {
		t.Fatalf("push into a full queue: %v after %v, Moving asked %d times; want ErrStalled after 4 stall timeouts", err, time.Since(began), asked)
	}
}

// TestSlowWriterIsNotStalled: a writer that keeps making progress, each step slower than nothing but well
// within the stall timeout, is waited for however long the whole takes.
func TestSlowWriterIsNotStalled(t *testing.T) {
	q := New(16<<10, 300*time.Millisecond, size)
	q.MaxBatch = 16 << 10
	q.Start(func([][]byte) error { time.Sleep(100 * time.Millisecond); return nil }, nil)
	began := time.Now()
	for range 12 { // about 1 s of pushes against a 300 ms stall timeout
		if err := q.Push(context.Background(), make([]byte, 16<<10)); err != nil {
			t.Fatalf("after %v: %v", time.Since(began), err)
		}
	}
	q.Fail(ErrClosed)
}

// TestSlowPiecesAreProgress: one batch that takes longer than the stall timeout, written in pieces at a
// steady pace, is progress: pushes wait for it instead of failing the queue.
func TestSlowPiecesAreProgress(t *testing.T) {
	q := New(1<<20, 200*time.Millisecond, size)
	q.Start(func(batch [][]byte) error {
		return Pieces(batch, func(piece [][]byte) error {
			time.Sleep(50 * time.Millisecond) // 16 pieces of a 1 MiB batch: 800 ms, four stall timeouts
			for _, b := range piece {
				if len(b) > Piece {
					t.Errorf("a piece holds %d bytes, more than Piece", len(b))
				}
			}
			return nil
		}, q.Progress)
	}, nil)
	if err := q.Push(context.Background(), make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	// The queue is full until the whole batch is written.
	if err := q.Push(context.Background(), make([]byte, 1<<20)); err != nil {
		t.Fatalf("a push behind a slow but steady writer: %v", err)
	}
	q.Fail(ErrClosed)
}

// TestPushEndsWithContextAndFail: a waiting push returns when its context ends, or when the queue fails.
func TestPushEndsWithContextAndFail(t *testing.T) {
	q := New(1, time.Minute, size)
	if err := q.Push(context.Background(), []byte("x")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := q.Push(ctx, []byte("y")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("push with an ended context: %v", err)
	}
	boom := errors.New("boom")
	go func() { time.Sleep(50 * time.Millisecond); q.Fail(boom) }()
	if err := q.Push(context.Background(), []byte("z")); !errors.Is(err, boom) {
		t.Fatalf("push into a failed queue: %v", err)
	}
}

// TestFailOverridesClose: a Close that is still flushing gives way to a failure, and the queue ends with it.
func TestFailOverridesClose(t *testing.T) {
	q := New(1<<20, time.Minute, size)
	_ = q.Push(context.Background(), []byte("a"))
	_ = q.Push(context.Background(), []byte("b"))
	q.Close()
	q.Fail(ErrStalled)
	if err := run(q, func([][]byte) error { t.Error("a failed queue wrote"); return nil }); !errors.Is(err, ErrStalled) {
		t.Errorf("ended with %v", err)
	}
	writeErr := errors.New("write failed")
	q = New(1<<20, time.Minute, size)
	_ = q.Push(context.Background(), []byte("a"))
	if err := run(q, func([][]byte) error { return writeErr }); !errors.Is(err, writeErr) {
		t.Errorf("ended after a failed write with %v", err)
	}
	if err := q.Push(context.Background(), []byte("b")); !errors.Is(err, writeErr) {
		t.Errorf("push after a failed write: %v", err)
	}
}

// TestIdleQueueHoldsNoWriter: the writer goroutine exits once the queue is empty, comes back for the next
// push, and an idle queue still ends, once, when it is closed.
func TestIdleQueueHoldsNoWriter(t *testing.T) {
	q := New(1<<20, time.Minute, size)
	written := make(chan []byte, 4)
	ended := make(chan error, 2)
	q.Start(func(batch [][]byte) error {
		for _, b := range batch {
			written <- b
		}
		return nil
	}, func(err error) { ended <- err })
	running := func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.running
	}
	for _, s := range []string{"a", "b"} {
		if err := q.Push(context.Background(), []byte(s)); err != nil {
			t.Fatal(err)
		}
		if got := <-written; string(got) != s {
			t.Fatalf("wrote %q, want %q", got, s)
		}
		deadline := time.Now().Add(5 * time.Second)
		for running() {
			if time.Now().After(deadline) {
				t.Fatal("the writer stayed on with nothing to write")
			}
			time.Sleep(time.Millisecond)
		}
	}
	q.Close()
	if err := <-ended; err != nil {
		t.Fatalf("an idle queue ended with %v on Close", err)
	}
	q.Fail(ErrStalled) // the queue has ended: nothing more to report
	select {
	case err := <-ended:
		t.Fatalf("end ran again, with %v", err)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestIdleRunsWhenDrained: Idle runs on the writer once everything queued is written, and an item pushed
// while it runs is still written, by the same writer.
func TestIdleRunsWhenDrained(t *testing.T) {
	q := New(1<<20, time.Second, size)
	var written, idles int
	var mu sync.Mutex
	pushed := false
	q.Idle = func() {
		mu.Lock()
		idles++
		first := !pushed
		pushed = true
		mu.Unlock()
		if first {
			if err := q.Push(context.Background(), []byte("second")); err != nil {
				t.Error(err)
			}
		}
	}
	done := make(chan struct{})
	q.Start(func(batch [][]byte) error {
		mu.Lock()
		written += len(batch)
		mu.Unlock()
		return nil
	}, func(error) { close(done) })
	if err := q.Push(context.Background(), []byte("first")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		w, i := written, idles
		mu.Unlock()
		if w == 2 && i == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d items written, Idle ran %d times; want 2 and 2", w, i)
		}
		time.Sleep(5 * time.Millisecond)
	}
	q.Close()
	<-done
}

// TestUnboundNeverWaits: an unbound queue (a connection under flow control) takes whatever is pushed while
// its writer is stuck, without waiting or stalling, and merges small items as they come, in order: what it
// counts stays what was pushed.
func TestUnboundNeverWaits(t *testing.T) {
	q := New(1<<10, 50*time.Millisecond, size)
	q.Merge = func(tail, v []byte, owned bool) ([]byte, bool) { return AppendSmall(tail, v, owned, Piece) }
	q.Hooks.Waited = func() { t.Error("a push waited") }
	q.Unbound()
	release := make(chan struct{})
	var got bytes.Buffer
	items := 0
	q.Start(func(batch [][]byte) error {
		<-release
		for _, b := range batch {
			items++
			got.Write(b)
		}
		return nil
	}, func(error) {})
	var want bytes.Buffer
	for i := range 1 << 16 {
		b := []byte{byte(i), byte(i >> 8)}
		want.Write(b)
		if err := q.Push(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	if q.Len() != want.Len() {
		t.Errorf("the queue counts %d bytes for %d pushed", q.Len(), want.Len())
	}
	close(release)
	q.Close()
	deadline := time.Now().Add(10 * time.Second)
	for q.Len() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if q.Len() != 0 || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("%d bytes left, %d of %d written in order", q.Len(), got.Len(), want.Len())
	}
	if items > want.Len()/Piece+2 {
		t.Errorf("%d pushes of 2 bytes were written as %d items", 1<<16, items)
	}
}
