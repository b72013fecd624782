package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
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
type poisonPool struct{ mem.BufferPool }

func (p poisonPool) Put(bp *[]byte) {
	b := (*bp)[:cap(*bp)]
	for i := range b {
		b[i] = poison
	}
	p.BufferPool.Put(bp)
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
// before gRPC wrote it would show at a client as poison or as another connection's bytes.
func TestZeroCopyBuffersNotReusedEarly(t *testing.T) {
	const (
		conns = 24
		size  = 6 << 20
	)
	orig := wire.Pool
	wire.Pool = poisonPool{orig}
	t.Cleanup(func() { wire.Pool = orig }) // runs last, once server and agent are stopped

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
}
