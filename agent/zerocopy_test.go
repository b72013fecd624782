package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/wire"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/mem"
)

// poison is what poisonPool writes over every buffer put back.
const poison = 0xEE

// poisonPool overwrites each buffer put back into it, so that whoever still reads a buffer after giving it
// back reads poison, or whatever the buffer's next owner wrote.
//
// It also counts the buffers that a connection's read loop took and gRPC put back, and their bytes: those
// went out without a copy, as wire.OwnedData that the codec handed to gRPC whole. A read that was copied
// instead is put back by the agent (or, had the codec copied an owned buffer, by the codec), so the count
// tells that the zero-copy path ran, at no cost to the agent itself.
//
// TestMain installs it as wire.Pool before any test runs, switched off: swapping wire.Pool during a test races
// with goroutines of earlier tests that upstream's server does not wait for. A test switches it on and off.
type poisonPool struct {
	mem.BufferPool
	on            atomic.Bool
	mu            sync.Mutex
	read          map[*[]byte]bool // taken by a read loop and not yet put back
	zeroCopy      int              // of those, put back by gRPC
	zeroCopyBytes int
}

// readLoop is the function whose Gets poisonPool tracks.
var readLoop = runtime.FuncForPC(reflect.ValueOf((*conn).readLoop).Pointer()).Name()

// testPool is wire.Pool in this package's tests (TestMain).
var testPool = newPoisonPool(wire.Pool)

func newPoisonPool(p mem.BufferPool) *poisonPool {
	return &poisonPool{BufferPool: p, read: map[*[]byte]bool{}}
}

// poisonDuring switches p on, with its counts at zero, until t ends.
func (p *poisonPool) poisonDuring(t *testing.T) {
	p.mu.Lock()
	p.read, p.zeroCopy, p.zeroCopyBytes = map[*[]byte]bool{}, 0, 0
	p.mu.Unlock()
	p.on.Store(true)
	t.Cleanup(func() { p.on.Store(false) })
}

func (p *poisonPool) Get(n int) *[]byte {
	bp := p.BufferPool.Get(n)
	if p.on.Load() && callerName() == readLoop {
		p.mu.Lock()
		p.read[bp] = true
		p.mu.Unlock()
	}
	return bp
}

func (p *poisonPool) Put(bp *[]byte) {
	if !p.on.Load() {
		p.BufferPool.Put(bp)
		return
	}
	caller := callerName()
	p.mu.Lock()
	if p.read[bp] {
		delete(p.read, bp)
		if strings.HasPrefix(caller, "google.golang.org/grpc/") {
			p.zeroCopy++
			p.zeroCopyBytes += len(*bp)
		}
	}
	p.mu.Unlock()
	b := (*bp)[:cap(*bp)]
	for i := range b {
		b[i] = poison
	}
	p.BufferPool.Put(bp)
}

// callerName is the function that called the pool.
func callerName() string {
	pc, _, _, ok := runtime.Caller(2)
	if !ok {
		return ""
	}
	return runtime.FuncForPC(pc).Name()
}

// patternByte is byte i of connection k's download. It is never the poison, and differs from every other
// connection's at each offset (k < 128).
func patternByte(k, i int) byte {
	b := byte(i*7+i>>9) & 0x7f
	return b ^ byte(k)&0x7f
}

// patternServer sends each connection `size` bytes of its pattern. The client first names the pattern
// (connection number, 8 bytes). Writes come in sizes from a few bytes to 256 KiB, so that the agent's reads
// take both the copy path and the zero-copy path.
func patternServer(tb testing.TB, size int) string {
	return harness.Serve(tb, func(c net.Conn) {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		k := int(binary.BigEndian.Uint64(hdr[:]))
		rng := rand.New(rand.NewPCG(uint64(k), 1))
		buf := make([]byte, 256<<10)
		for off := 0; off < size; {
			n := min(size-off, 1+rng.IntN(len(buf)))
			if rng.IntN(4) == 0 {
				n = min(n, 1+rng.IntN(8<<10))
			}
			for j := range n {
				buf[j] = patternByte(k, off+j)
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
			off += n
		}
	}).Addr
}

// TestZeroCopyBuffersNotReusedEarly downloads through a konnect server and agent on many connections at
// once, with every buffer of wire.Pool poisoned as it is put back. The agent sends large reads in the
// buffer it read them into and gRPC puts that buffer back once written: a buffer put back (and reused)
// before gRPC wrote it would show at a client as poison or as another connection's bytes. The test also
// checks that most of the download did go out that way: otherwise the poison would prove nothing.
func TestZeroCopyBuffersNotReusedEarly(t *testing.T) {
	const (
		conns = 24
		size  = 6 << 20
	)
	pool := testPool
	pool.poisonDuring(t)

	pki := newTestPKI(t)
	ks := startKonnectServer(t, pki, "k1", 1, "grpc")
	startAgent(t, pki.config(ks.srv.AgentAddr()))
	harness.EventuallyTrue(t, 10*time.Second, "agent connected", func() bool { return ks.connectedAgents() == 1 })
	source := patternServer(t, size)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var g errgroup.Group
	for k := range conns {
		g.Go(func() error {
			c, err := ks.fe.Dial(ctx, source)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			var hdr [8]byte
			binary.BigEndian.PutUint64(hdr[:], uint64(k))
			if _, err := c.Write(hdr[:]); err != nil {
				return err
			}
			r := bufio.NewReaderSize(c, 64<<10)
			buf := make([]byte, 64<<10)
			off := 0
			for off < size {
				n, err := r.Read(buf[:min(len(buf), size-off)])
				for j, b := range buf[:n] {
					if want := patternByte(k, off+j); b != want {
						what := "stale or foreign data"
						if b == poison {
							what = "poison"
						}
						return fmt.Errorf("connection %d: byte %d is %#x (%s), want %#x", k, off+j, b, what, want)
					}
				}
				off += n
				if err != nil {
					return fmt.Errorf("connection %d: read after %d bytes: %w", k, off, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	pool.mu.Lock()
	reads, sent := pool.zeroCopy, pool.zeroCopyBytes
	pool.mu.Unlock()
	t.Logf("%d reads (%d bytes of %d) sent without a copy", reads, sent, conns*size)
	// Nearly all reads are large: the source writes small pieces only now and then.
	if sent < conns*size/2 {
		t.Fatalf("only %d of %d bytes went out in the buffer they were read into: the zero-copy path did not run", sent, conns*size)
	}
}
