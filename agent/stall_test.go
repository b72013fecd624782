package agent

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// sinkServer accepts connections and hands them to handle.
func sinkServer(t *testing.T, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go handle(c)
		}
	}()
	return ln.Addr().String()
}

// TestStalledBackendDoesNotStallOthers: one backend stops reading while the client keeps writing to it.
// The other connection on the same agent stream keeps working, and the stalled one is closed after
// StallTimeout (ANP issue 180: upstream's agent blocks its whole stream for good).
func TestStalledBackendDoesNotStallOthers(t *testing.T) {
	_, srv, ra := agentOnServer(t, func(c *Config) {
		c.ConnectionBuffer = 1 << 20
		c.StallTimeout = time.Second
	})
	echo := harness.StartEcho(t)
	stalled := sinkServer(t, func(net.Conn) {}) // never reads
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	live, err := srv.dial(ctx, echo.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	stuck, err := srv.dial(ctx, stalled)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()

	// Flood the stalled connection: far more than its queue and the kernel's socket buffers hold.
	chunk := make([]byte, 256<<10)
	var written atomic.Int64
	go func() {
		for range 256 { // 64 MiB
			if _, err := stuck.Write(chunk); err != nil {
				return
			}
			written.Add(int64(len(chunk)))
		}
	}()
	stuckClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stuck) // returns when the agent closes it
		close(stuckClosed)
	}()

	var worst time.Duration
	msg := []byte("still alive?")
	buf := make([]byte, len(msg))
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		start := time.Now()
		if _, err := live.Write(msg); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
		_ = live.SetReadDeadline(time.Now().Add(ra.cfg.StallTimeout + 2*time.Second))
		if _, err := io.ReadFull(live, buf); err != nil {
			t.Fatalf("round trip %d on the healthy connection: %v (stalled one got %d bytes written)", i, err, written.Load())
		}
		worst = max(worst, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-stuckClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled connection was not closed")
	}
	if worst > ra.cfg.StallTimeout+2*time.Second {
		t.Fatalf("healthy connection waited %v, more than the stall timeout %v", worst, ra.cfg.StallTimeout)
	}
	if n := counterValue(ra.m.overflows); n != 1 {
		t.Fatalf("overflow counter %v, want 1", n)
	}
	t.Logf("worst round trip on the healthy connection: %v; %d MiB written to the stalled one", worst, written.Load()>>20)
}

// TestSlowBackendIsNotClosed: a backend that reads slowly but steadily is throttled, not cut off.
func TestSlowBackendIsNotClosed(t *testing.T) {
	_, srv, _ := agentOnServer(t, func(c *Config) {
		c.ConnectionBuffer = 256 << 10
		c.StallTimeout = 500 * time.Millisecond
	})

	const size = 8 << 20
	got := make(chan int64, 1)
	slow := sinkServer(t, func(c net.Conn) {
		var n int64
		buf := make([]byte, 64<<10)
		for n < size {
			m, err := c.Read(buf)
			n += int64(m)
			if err != nil {
				break
			}
			time.Sleep(5 * time.Millisecond) // ~10 MB/s at most
		}
		got <- n
		c.Write([]byte("done"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := srv.dial(ctx, slow)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	for off := 0; off < size; off += 1 << 20 {
		if _, err := c.Write(data[off : off+1<<20]); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case n := <-got:
		if n != size {
			t.Fatalf("slow backend got %d of %d bytes", n, size)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("slow backend did not get everything")
	}
	ack := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, ack); err != nil {
		t.Fatalf("connection to the slow backend was closed: %v", err)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestSteadyReaderBehindFullSocketIsNotClosed: a backend that keeps reading, at 200 KB/s, while the client
// writes far more than that is slow, not stalled, and keeps its connection for many stall timeouts. The
// agent's write into its socket blocks for longer than the stall timeout although the reader makes progress:
// Linux wakes a writer blocked on a full TCP send buffer only once about a third of it has drained, and the
// buffer grows to megabytes. Counting only completed writes, the agent cut such a reader off as "stopped
// reading" after one stall timeout.
func TestSteadyReaderBehindFullSocketIsNotClosed(t *testing.T) {
	const stall = time.Second
	_, srv, ra := agentOnServer(t, func(c *Config) {
		c.ConnectionBuffer = 256 << 10
		c.StallTimeout = stall
	})
	var read atomic.Int64
	stop := make(chan struct{})
	slow := sinkServer(t, func(c net.Conn) {
		defer c.Close() // at stop: what the agent still holds for it then goes nowhere, at once
		buf := make([]byte, 16<<10)
		for {
			m, err := c.Read(buf)
			read.Add(int64(m))
			if err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(80 * time.Millisecond): // 200 KB/s
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := srv.dial(ctx, slow)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The client writes in the background: once the agent's queue is full, its writes wait too.
	go func() {
		chunk := make([]byte, 256<<10)
		for ctx.Err() == nil {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	const watch = 8 * stall
	deadline := time.Now().Add(watch)
	for time.Now().Before(deadline) {
		if n := counterValue(ra.m.overflows); n != 0 {
			t.Fatalf("the agent closed a backend that kept reading (%d bytes so far at 200 KB/s) as stalled", read.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	if n := read.Load(); n < int64(watch/time.Second)*100_000 {
		t.Fatalf("the backend read %d bytes in %v; it reads 200 KB/s", n, watch)
	}
}
