package agent

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/egress/konnectivity/wire"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// closeFlushTimeout bounds how long data already queued for a backend may take to drain after the server
// asked to close the connection. konnectivity-client waits 10 s for the CLOSE_RSP.
const closeFlushTimeout = 5 * time.Second

// writeBatch is the most the queue hands the backend writer at once; it writes flow.Piece at a time.
const writeBatch = 256 << 10

// Read buffers grow with the traffic: a connection starts with 4 KiB (idle and interactive connections, the
// common case, hold no more), moves up a tier each time a read fills its buffer, and back down once reads
// are small again. Read buffers come from wire.Pool, whose power-of-two size classes the tiers fit. A read
// of wire.ZeroCopyMin bytes or more is sent in the buffer it was read into, which goes to gRPC and back to
// wire.Pool once written, and the next read takes a fresh one; a smaller read is copied into its message and
// its buffer is read into again. The tiers above 4 KiB still stay dataOverhead short of a size class, although
// the payload no longer shares a buffer with its protobuf framing: upstream's server receives each message
// into a buffer of gRPC's default pool, whose classes (32 KiB, 1 MiB, the largest) it clears whole, so a
// whole DATA message, payload plus a few bytes of protobuf, must fit one.
const (
	midReadBuffer = 32<<10 - dataOverhead
	dataOverhead  = 128 // protobuf framing of a DATA packet, with room to spare
)

// readTiers are the buffer sizes a connection moves through, up to max.
func readTiers(max int) []int {
	tiers := []int{MinReadBuffer}
	if max > midReadBuffer {
		tiers = append(tiers, midReadBuffer)
	}
	if max > MinReadBuffer {
		tiers = append(tiers, max)
	}
	return tiers
}

// conn is one tunnelled connection: a backend dialled for a server's DIAL_REQ.
//
// Data from the server goes through the conn's queue (package flow) and is written by the queue's own
// writer goroutine, so that a backend that reads slowly does not block the session's receive loop, which serves
// every other connection on the same stream (ANP issue 180). With flow control, the server sends no more
// than window lets it, so the queue never fills, and the agent reads from the backend only while credit
// says the server has room.
type conn struct {
	s  *session
	id int64
	nc net.Conn
	q  *flow.Queue[[]byte]

	window *flow.Window // data from the server; nil without flow control
	credit *flow.Credit // data to the server; nil without flow control
	// broken: the server broke flow control on this connection, which is closing; what it still sends for
	// it is dropped without another count. The receive loop's own.
	broken bool

	mu       sync.Mutex
	closing  bool // the server sent CLOSE_REQ: flush the queue, then close
	closed   bool
	done     chan struct{}
	heard    chan struct{} // closed when the first DATA from the server arrives
	heardOne sync.Once
	// activity counts reads from and writes to the backend, so that a drain can tell a quiet connection.
	activity atomic.Uint64

	// sendMu orders this connection's DATA before its CLOSE_RSP: once finished is set, no DATA follows.
	sendMu   sync.Mutex
	finished bool
	pkt      client.Packet
	data     client.Data
	owned    wire.OwnedData
	once     sync.Once
}

func newConn(s *session, id int64, nc net.Conn) *conn {
	c := &conn{s: s, id: id, nc: nc, done: make(chan struct{}), heard: make(chan struct{})}
	limit := s.a.cfg.ConnectionBuffer
	if s.flow != nil {
		own := s.a.cfg.flowOffer()
		c.window = flow.NewWindow(own.Window, own.Max, s.budget)
		c.credit = flow.NewCredit(s.flow.Window, s.flow.Max)
		// The window bounds what is queued, but bytes count as consumed while their batch is still being
		// written: room for one more batch keeps a push from ever waiting.
		limit = own.Max + writeBatch
	}
	c.q = flow.New(limit, s.a.cfg.StallTimeout, func(b []byte) int { return len(b) })
	c.q.MaxBatch = writeBatch
	// Small DATA is merged as it is queued: a window of tiny packets then costs about its bytes, not a slice
	// and an allocation each, and goes to the backend in few writes.
	c.q.Merge = func(tail, b []byte, owned bool) ([]byte, bool) { return flow.AppendSmall(tail, b, owned, flow.Piece) }
	c.q.Hooks.Stalled = c.stalled
	acks := flow.NewAckWatch(nc)
	c.q.Hooks.Waited, c.q.Hooks.Moving = acks.Mark, acks.Moved
	c.data.ConnectID = id
	c.pkt.Type = client.PacketType_DATA
	c.pkt.Payload = &client.Packet_Data{Data: &c.data}
	return c
}

// enqueue hands data from the server to the backend writer. Up to Config.ConnectionBuffer bytes are taken
// without waiting; beyond that the receive loop waits for this backend as long as it makes progress, as a
// TCP sender would. A backend that makes none for Config.StallTimeout is stalled, and only its connection
// is closed.
func (c *conn) enqueue(b []byte) {
	c.heardOne.Do(func() { close(c.heard) })
	if c.broken {
		return
	}
	if c.window != nil {
		if err := c.window.Receive(len(b)); err != nil {
			c.brokeFlowControl(flowWindowExceeded, err)
			return
		}
	}
	// An error means the connection is closing, and data for it has nowhere to go.
	_ = c.q.Push(c.s.ctx, b)
}

// granted takes the server's grant of n more bytes for this connection.
func (c *conn) granted(n int64) {
	if c.credit == nil {
		return
	}
	if err := c.credit.Add(n); err != nil {
		c.brokeFlowControl(flowCreditOverflow, err)
	}
}

// brokeFlowControl closes a connection whose server broke the flow-control protocol on it, so that the
// agent never buffers more for it than the window it granted. It runs on the receive loop.
func (c *conn) brokeFlowControl(reason string, err error) {
	if c.broken {
		return
	}
	c.broken = true
	c.s.a.m.flowViolation(reason)
	klog.ErrorS(err, "Closing a connection on which the server broke flow control", "serverID", c.s.serverID, "connectionID", c.id)
	c.s.wg.Add(1)
	go func() {
		defer c.s.wg.Done()
		c.finish("konnect agent: " + err.Error())
	}()
}

// stalled runs on the receive loop when enqueue gave up on a backend.
func (c *conn) stalled() {
	c.s.a.m.overflows.Inc()
	klog.InfoS("Backend stopped reading; closing the connection", "serverID", c.s.serverID,
		"connectionID", c.id, "limitBytes", c.s.a.cfg.ConnectionBuffer, "stallTimeout", c.s.a.cfg.StallTimeout)
	// finish sends on the stream, and the receive loop must not wait on it. The session's teardown, which
	// runs after that loop, waits for it.
	c.s.wg.Add(1)
	go func() {
		defer c.s.wg.Done()
		c.finish("konnect agent: backend stopped reading")
	}()
}

// closeRequested handles CLOSE_REQ: what is queued is still written (bounded by closeFlushTimeout), then
// the connection closes and CLOSE_RSP is sent.
func (c *conn) closeRequested() {
	c.mu.Lock()
	if c.closed || c.closing {
		c.mu.Unlock()
		return
	}
	c.closing = true
	c.mu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	c.q.Close()
}

// writeBatch writes a batch from the queue to the backend, a piece at a time, so that a backend that reads
// slowly but steadily is not taken for a stalled one.
func (c *conn) writeBatch(batch [][]byte) error {
	return flow.Pieces(batch, func(piece [][]byte) error {
		bufs := net.Buffers(piece)
		n, err := bufs.WriteTo(c.nc) // writev: one syscall per piece
		c.activity.Add(1)
		c.s.a.m.bytesFromServer.Add(float64(n))
		if c.window != nil {
			c.s.grants.Add(c.id, c.window.Consume(int(n)))
		}
		return err
	}, c.q.Progress)
}

// writerEnded runs once the queue has ended, on its writer goroutine.
func (c *conn) writerEnded(err error) {
	defer c.s.wg.Done()
	switch {
	case errors.Is(err, flow.ErrStalled), errors.Is(err, flow.ErrClosed):
		// enqueue or finish is closing the connection.
		return
	case err != nil && !c.isClosed():
		klog.V(2).InfoS("Write to backend failed", "serverID", c.s.serverID, "connectionID", c.id, "err", err)
	}
	// Flushed after CLOSE_REQ (err is nil), or the backend failed.
	c.finish("")
}

func (c *conn) readLoop() {
	defer c.s.wg.Done()
	tiers := c.s.a.tiers
	tier := 0
	// bp is the buffer the next read goes into; nil at the start, after a read went out in its buffer, and
	// after a change of tier. A buffer is taken once a read can start: a connection waiting for credit after
	// sending its last read holds none.
	var bp *[]byte
	defer func() {
		if bp != nil {
			wire.Pool.Put(bp)
		}
	}()
	first := true
	for {
		size := tiers[tier]
		limit := size
		if c.credit != nil {
			// Read no more than the server has room for: what waits stays in the backend's socket, where
			// TCP holds its sender back, and costs this agent nothing.
			k, waited, err := c.credit.Wait(c.s.ctx)
			if waited > 0 {
				c.s.a.m.creditWait.Add(waited.Seconds())
			}
			if err != nil {
				c.finish("")
				return
			}
			limit = min(size, k)
		}
		// The buffer fits what may be read: a read that goes out in its buffer holds that buffer until gRPC
		// has written it, so a read that credit cut short must not hold a whole tier's.
		if bp != nil && cap(*bp) < limit {
			wire.Pool.Put(bp)
			bp = nil
		}
		if bp == nil {
			bp = wire.Pool.Get(limit)
		}
		buf := (*bp)[:limit]
		n, err := c.nc.Read(buf)
		if c.credit != nil {
			c.credit.Use(n)
		}
		if n > 0 {
			c.activity.Add(1)
			if first {
				first = false
				c.holdFirstData()
			}
			var owned *[]byte
			if n >= wire.ZeroCopyMin {
				*bp = buf[:n]
				owned, bp = bp, nil // given away, even if the send fails: never touched again
			}
			if !c.sendData(buf[:n], owned) {
				return
			}
			next := tier
			switch {
			case n == size && tier < len(tiers)-1:
				next++
			case tier > 0 && n < tiers[tier-1]/2:
				next--
			}
			if next != tier {
				if bp != nil {
					wire.Pool.Put(bp)
					bp = nil
				}
				tier = next
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !c.isClosed() {
				klog.V(2).InfoS("Read from backend failed", "serverID", c.s.serverID, "connectionID", c.id, "err", err)
			}
			c.finish("")
			return
		}
	}
}

// holdFirstData holds the connection's first DATA until the server has sent something on it, or for
// konnectivity.FirstDataHold: konnectivity-client loses data that follows its DIAL_RSP too closely.
func (c *conn) holdFirstData() {
	select {
	case <-c.heard:
		return
	default:
	}
	t := time.NewTimer(konnectivity.FirstDataHold)
	defer t.Stop()
	select {
	case <-c.heard:
	case <-t.C:
	case <-c.done:
	}
}

// sendData sends b as DATA. With bp nil, b is copied into the message and stays the caller's. Otherwise b
// is *bp, a buffer from wire.Pool, sent without a copy: the buffer is given away, and the caller must not
// touch it again, whatever the outcome. gRPC returns it to wire.Pool once it is written. Both kinds share
// this one path so that the finished check, which orders DATA before CLOSE_RSP, and the metric cannot drift
// apart.
func (c *conn) sendData(b []byte, bp *[]byte) bool {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.finished {
		if bp != nil {
			wire.Pool.Put(bp) // not handed over yet: still ours to return
		}
		return false
	}
	// The packet is reused: SendMsg has marshalled it by the time it returns. The metric below reads only
	// len(b), a local copy, not the buffer, which may be gRPC's by then.
	c.data.Data = b
	var err error
	if bp == nil {
		err = c.s.send(&c.pkt)
	} else {
		c.owned = wire.OwnedData{Packet: &c.pkt, Buf: bp}
		err = c.s.sendOwned(&c.owned)
		c.owned = wire.OwnedData{}
	}
	c.data.Data = nil
	if err != nil {
		return false
	}
	c.s.a.m.bytesToServer.Add(float64(len(b)))
	return true
}

// quiet reports whether nothing waits to be written to the backend and the connection is not closing.
func (c *conn) quiet() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.q.Len() == 0 && !c.closing && !c.closed
}

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// finish closes the backend and tells the server with CLOSE_RSP (errMsg empty for a normal close). It runs
// once, whoever calls it first: reader (backend EOF), writer (CLOSE_REQ flushed, write error), overflow, or
// session teardown.
func (c *conn) finish(errMsg string) {
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.q.Fail(flow.ErrClosed)
		if c.credit != nil {
			c.credit.Close(flow.ErrClosed)
			c.window.Release()
			c.s.grants.Forget(c.id)
		}
		close(c.done)
		_ = c.nc.Close()
		c.s.removeConn(c.id)

		c.sendMu.Lock()
		c.finished = true
		c.sendMu.Unlock()
		_ = c.s.send(&client.Packet{
			Type: client.PacketType_CLOSE_RSP,
			Payload: &client.Packet_CloseResponse{CloseResponse: &client.CloseResponse{
				ConnectID: c.id, Error: errMsg,
			}},
		})
		klog.V(4).InfoS("Connection closed", "serverID", c.s.serverID, "connectionID", c.id)
		c.s.a.connClosed()
	})
}
