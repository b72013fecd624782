package flow

import (
	"net"
	"sync/atomic"
)

// AckWatch tells a slow reader from a stalled one where the writer writes into a TCP socket: progress is
// what the peer acknowledges, not only writes that return. Linux wakes a write blocked on a full send
// buffer once about a third of it is free, and the buffer grows to megabytes, so a reader taking 200 KB/s
// can leave a write blocked for longer than the stall timeout while it reads steadily. Its Mark and Moved
// are a Queue's Waited and Moving hooks.
type AckWatch struct {
	conn  net.Conn
	acked atomic.Uint64
}

// NewAckWatch watches c, or what c wraps (NetConn, as a *tls.Conn has): a connection that is not TCP, or
// a system without TCP_INFO, never reports progress, and only returned writes count.
func NewAckWatch(c net.Conn) *AckWatch { return &AckWatch{conn: c} }

// Mark notes how much the peer has acknowledged, when a push begins to wait.
func (w *AckWatch) Mark() {
	n, _ := ackedBytes(w.conn)
	w.acked.Store(n)
}

// Moved says whether the peer has acknowledged more since the last Mark or Moved.
func (w *AckWatch) Moved() bool {
	n, ok := ackedBytes(w.conn)
	return ok && n > w.acked.Swap(n)
}

// ackedBytes is how much of c's output its peer has acknowledged, and whether c could say.
func ackedBytes(c net.Conn) (uint64, bool) {
	for {
		switch x := c.(type) {
		case *net.TCPConn:
			return tcpAcked(x)
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return 0, false
		}
	}
}
