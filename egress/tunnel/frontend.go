package tunnel

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

const (
	// maxChunk is the largest DATA payload sent in one gRPC message to agents, and the most one frontend
	// batch holds. Peers keep gRPC's default 4 MiB receive limit (upstream's agent, kube-apiserver's
	// konnectivity client), and 1 MiB messages already amortise the per-message cost.
	maxChunk = 1 << 20
	// frontendChunk is the largest DATA payload sent to kube-apiserver in one message. gRPC lets a send
	// return once the message before has mostly gone out, so a message is how finely the queue sees a slow
	// reader's progress: 256 KiB in the stall timeout (5 s) is 51 KB/s.
	frontendChunk = 256 << 10
	// A tunnel's first firstBytes go to kube-apiserver in messages of at most firstChunk. Its client takes
	// up to ten messages of a tunnel before the tunnel's reader takes any, whatever their size: that is
	// what a slow reader makes kube-apiserver hold, and, while those buffers fill, the tunnel looks to flow
	// control like a fast reader and its window grows, which the server then holds for that reader too.
	// Larger messages pay off only for long transfers, by cutting kube-apiserver's cost per message.
	firstChunk = 64 << 10
	firstBytes = 4 << 20
	// flushTimeout bounds how long a finished connection may take to flush what is queued for its reader.
	flushTimeout = 5 * time.Second
)

func packetSize(p *client.Packet) int {
	if d := p.GetData(); d != nil {
		return len(d.Data) + 64
	}
	return 64
}

// sendChunked sends p with send, split into DATA packets of at most chunk bytes.
func sendChunked(send func(any) error, p *client.Packet, chunk int, split prometheus.Counter) error {
	d := p.GetData()
	if d == nil || len(d.Data) <= chunk {
		return send(p)
	}
	split.Inc()
	for off := 0; off < len(d.Data); off += chunk {
		end := min(off+chunk, len(d.Data))
		if err := send(&client.Packet{
			Type:    client.PacketType_DATA,
			Payload: &client.Packet_Data{Data: &client.Data{ConnectID: d.ConnectID, Data: d.Data[off:end]}},
		}); err != nil {
			return err
		}
	}
	return nil
}

// newFrontendQueue is the queue of one frontend connection (see package flow), counted in the server's
// metrics. stalled closes the connection when its reader stalled. It takes --connection-buffer-bytes
// without waiting; a connection under flow control lifts that (frontendFlow.add), since its window bounds
// what the agent may send it.
func newFrontendQueue(s *Server, conn net.Conn, stalled func()) *flow.Queue[*client.Packet] {
	q := flow.New(s.cfg.ConnectionBuffer, s.cfg.StallTimeout, packetSize)
	// One batch is at most 1 MiB, sent as messages of up to frontendChunk (or written flow.Piece at a time).
	q.MaxBatch = maxChunk
	q.Merge = func(tail, p *client.Packet, owned bool) (*client.Packet, bool) {
		m, ok := mergeData(tail, p, owned)
		if ok && !owned {
			s.metrics.mergedPackets.Add(2)
		} else if ok {
			s.metrics.mergedPackets.Inc()
		}
		return m, ok
	}
	// A reader over TCP that keeps taking data is slow, not stalled, while the write into its socket waits.
	acks := flow.NewAckWatch(conn)
	q.Hooks = flow.Hooks{
		Queued: func(d int) { s.metrics.queuedBytes.Add(float64(d)) },
		Waited: func() { acks.Mark(); s.metrics.stalledWaits.Inc() },
		Stalled: func() {
			s.metrics.stalledClosed.Inc()
			stalled()
		},
		Moving: acks.Moved,
	}
	return q
}

// frontendStream hands packets for kube-apiserver to the connection's own queue instead of writing them on
// the agent stream's goroutine.
type frontendStream struct {
	grpc.ServerStream
	q     *flow.Queue[*client.Packet]
	flow  *frontendFlow
	first *firstData
}

// frontendFlowOf is the flow-control state of a frontend stream that frontendInterceptor wrapped.
func frontendFlowOf(ss grpc.ServerStream) *frontendFlow {
	if fs, ok := ss.(*frontendStream); ok {
		return fs.flow
	}
	return nil
}

func (f *frontendStream) SendMsg(m any) error {
	p, ok := m.(*client.Packet)
	if !ok {
		return f.ServerStream.SendMsg(m)
	}
	return f.q.Push(f.Context(), p)
}

// RecvMsg notes that the client has sent something after its dial (data, a close, or the end of its
// stream): its first DATA need no longer be held.
func (f *frontendStream) RecvMsg(m any) error {
	err := f.ServerStream.RecvMsg(m)
	if p, ok := m.(*client.Packet); err != nil || !ok || p.Type != client.PacketType_DIAL_REQ {
		f.first.clientSent()
	}
	return err
}

// firstData holds a tunnel's first DATA towards the frontend, from the dial's answer until the client has
// sent something or for at most hold (konnectivity.FirstDataHold says why). Upstream's agent sends that DATA
// right behind its DIAL_RSP. konnect's agent, the one that speaks flow control, holds it itself, so a
// connection under flow control is not held again. The hold runs on the frontend's own queue writer, so only
// this tunnel waits: the agent stream pushes into the queue as ever, and should the queue fill up meanwhile,
// the hold ends rather than make that push wait. A frontend stream holds its first DATA only:
// kube-apiserver's tunnels are single-use.
type firstData struct {
	hold       time.Duration
	agentHolds func(connID int64) bool // the agent holds the connection's first DATA itself
	heard      chan struct{}           // the client sent something after its dial
	full       chan struct{}           // a push found the queue full
	heard1     sync.Once
	full1      sync.Once

	// The writer's own.
	answered time.Time // when the dial's answer went out; zero before
	done     bool      // the first DATA went out, or there is no hold
}

func newFirstData(hold time.Duration, agentHolds func(connID int64) bool) *firstData {
	return &firstData{hold: hold, agentHolds: agentHolds, heard: make(chan struct{}), full: make(chan struct{}),
		done: hold <= 0}
}

func (h *firstData) clientSent() { h.heard1.Do(func() { close(h.heard) }) }
func (h *firstData) queueFull()  { h.full1.Do(func() { close(h.full) }) }

// before runs on the writer before p is sent: the first DATA after the dial's answer waits.
func (h *firstData) before(ctx context.Context, p *client.Packet) {
	if h.done || p.Type != client.PacketType_DATA || h.answered.IsZero() {
		return
	}
	h.done = true
	wait := time.Until(h.answered.Add(h.hold))
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-h.heard:
	case <-h.full:
	case <-t.C:
	case <-ctx.Done():
	}
}

// sent runs on the writer once p went out: a successful dial's answer starts the hold.
func (h *firstData) sent(p *client.Packet) {
	if h.done || !h.answered.IsZero() || p.Type != client.PacketType_DIAL_RSP {
		return
	}
	switch rsp := p.GetDialResponse(); {
	case rsp.GetError() != "":
	case h.agentHolds(rsp.GetConnectID()):
		h.done = true
	default:
		h.answered = time.Now()
	}
}

// frontendInterceptor gives every frontend stream (one tunnel, one connection: kube-apiserver's client is
// single-use) its send queue. The handler runs on the stream's own goroutine: a stalled reader is cut off
// by closing its connection (see tunnelCreds), which ends the handler.
func (s *Server) frontendInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	s.frontends.Add(1)
	defer s.frontends.Add(-1)
	var stalled atomic.Bool
	q := newFrontendQueue(s, tunnelConn(ss.Context()), func() {
		stalled.Store(true)
		closeTunnelConn(ss.Context())
	})
	ff := &frontendFlow{close: func() { closeTunnelConn(ss.Context()) }, queue: q}
	// The agent's DIAL_RSP bound a connection under flow control to ff before it reached this writer.
	first := newFirstData(s.firstDataHold, func(id int64) bool { return ff.conn(id) != nil })
	waited := q.Hooks.Waited
	q.Hooks.Waited = func() { first.queueFull(); waited() }
	defer ff.end()
	writerDone := make(chan struct{})
	// A DATA message counts as consumed, and its connection is granted more, once the connection has
	// carried it (sentLedger). Where another stream holds the connection's ledger, it counts when the next
	// send returns, or when nothing more waits: gRPC lets a send return once the message before has partly
	// gone out, so until then gRPC may still hold that message for a reader that has not taken it.
	ledger := claimLedger(ss.Context(), ff.consumed)
	if ledger != nil {
		defer ledger.release()
	}
	var heldID int64
	var held int
	var sent int64 // DATA bytes sent to kube-apiserver
	credit := func() {
		if held > 0 {
			ff.consumed(heldID, held)
			held = 0
		}
	}
	send := func(m any) error {
		p := m.(*client.Packet)
		first.before(ss.Context(), p)
		err := ss.SendMsg(m)
		q.Progress()
		if err != nil {
			return err
		}
		first.sent(p)
		d := p.GetData()
		if d == nil {
			return nil
		}
		sent += int64(len(d.Data))
		if ledger != nil {
			ledger.sent(d.ConnectID, len(d.Data))
			return nil
		}
		credit()
		heldID, held = d.ConnectID, len(d.Data)
		return nil
	}
	chunk := func() int {
		if sent < firstBytes {
			return firstChunk
		}
		return frontendChunk
	}
	q.Idle = credit
	q.Start(func(batch []*client.Packet) error { return s.sendPackets(send, batch, chunk) },
		func(error) { close(writerDone) })
	err := handler(srv, &frontendStream{ServerStream: ss, q: q, flow: ff, first: first})
	if stalled.Load() {
		return status.Error(codes.ResourceExhausted, flow.ErrStalled.Error())
	}
	q.Close()
	t := time.NewTimer(flushTimeout)
	defer t.Stop()
	select {
	case <-writerDone:
	case <-t.C:
		q.Fail(flow.ErrClosed)
	}
	return err
}

// tunnelCreds wraps the frontend's transport credentials (insecure on the Unix socket) so that a stream can
// reach its connection: gRPC has no way to end a stream from outside its handler, and each of
// kube-apiserver's tunnels is its own connection, so closing that connection ends the tunnel. The
// connection also counts what gRPC writes to it (sentConn).
type tunnelCreds struct {
	credentials.TransportCredentials
}

// tunnelInfo is the connection's AuthInfo, with the connection; sent is nil for a CONNECT tunnel.
type tunnelInfo struct {
	credentials.AuthInfo
	conn net.Conn
	sent *sentConn
}

func (c tunnelCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	sc := &sentConn{Conn: conn}
	return readyConn(sc), tunnelInfo{AuthInfo: info, conn: sc, sent: sc}, nil
}

func (c tunnelCreds) Clone() credentials.TransportCredentials {
	return tunnelCreds{c.TransportCredentials.Clone()}
}

// tunnelConn is the connection of the stream whose context ctx is, or nil.
func tunnelConn(ctx context.Context) net.Conn {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(tunnelInfo); ok {
			return info.conn
		}
	}
	return nil
}

// closeTunnelConn closes the connection of the stream whose context ctx is.
func closeTunnelConn(ctx context.Context) {
	if c := tunnelConn(ctx); c != nil {
		_ = c.Close()
	}
}

// sentConn is a frontend connection that tells its ledger how many bytes gRPC wrote to it.
type sentConn struct {
	net.Conn
	ledger sentLedger
}

// NetConn is the connection sentConn counts for (flow.AckWatch looks through it).
func (c *sentConn) NetConn() net.Conn { return c.Conn }

func (c *sentConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.ledger.wrote(n)
	return n, err
}

// readyConn is sc, with gRPC's readiness reads where its connection is a plain socket (the Unix socket, or
// TCP without TLS). For such a connection gRPC takes a read buffer from its pool only once data has arrived,
// and gives it back after; wrapped without them, every idle tunnel would pin a 32 KiB read buffer of its
// own. Under TLS gRPC reads through the TLS connection, and sc stays as it is.
func readyConn(sc *sentConn) net.Conn {
	switch c := sc.Conn.(type) {
	case *net.UnixConn, *net.TCPConn:
		if raw, err := c.(syscall.Conn).SyscallConn(); err == nil {
			return &readySentConn{sentConn: sc, raw: raw}
		}
	}
	return sc
}

// readySentConn implements gRPC's optional ReadOnReady (google.golang.org/grpc/internal/transport/
// readyreader, which gRPC looks for on the connection): wait until the socket is readable, then read into
// a buffer taken from pool.
type readySentConn struct {
	*sentConn
	raw syscall.RawConn
}

func (c *readySentConn) ReadOnReady(bufSize int, pool mem.BufferPool) (*[]byte, int, error) {
	var (
		buf     *[]byte
		n       int
		readErr error
	)
	err := c.raw.Read(func(fd uintptr) bool {
		buf = pool.Get(bufSize)
		n, readErr = syscall.Read(int(fd), *buf)
		if readErr != nil {
			pool.Put(buf)
			buf = nil
		}
		return readErr != syscall.EAGAIN
	})
	switch {
	case err != nil:
		if buf != nil {
			pool.Put(buf)
		}
		return nil, 0, err
	case readErr != nil:
		return nil, 0, readErr
	case n == 0:
		pool.Put(buf)
		return nil, 0, io.EOF
	}
	return buf, n, nil
}

// claimLedger returns the ledger of the stream's connection, which calls carried for each DATA message once
// the connection carried it, or nil when another stream on it holds the ledger. kube-apiserver opens one
// connection per tunnel, so its streams always get one.
func claimLedger(ctx context.Context, carried func(id int64, n int)) *sentLedger {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(tunnelInfo); ok && info.sent != nil && info.sent.ledger.claim(carried) {
			return &info.sent.ledger
		}
	}
	return nil
}

// minWireOverhead is the fewest bytes a DATA message takes on a connection beyond its payload: gRPC's
// 5-byte message prefix, one 9-byte HTTP/2 frame header and the payload's 2-byte protobuf tag and length.
const minWireOverhead = 5 + 9 + 2

// sentLedger matches the bytes written to a connection against the DATA messages one stream sent on it, in
// order, and calls carried for each message once the connection has carried it. gRPC writes a stream's
// messages in the order they were sent. written counts every byte, frames and headers included, and each
// message is counted at the fewest bytes it can take, so a message is never found written later than it
// was: carried may come a little early (by the framing beyond that minimum, and by other streams' bytes),
// never late, and so never holds back credit that the connection has earned.
type sentLedger struct {
	mu      sync.Mutex
	carried func(id int64, n int) // nil while no stream holds the ledger
	written int64                 // bytes written to the connection since the ledger was claimed
	queued  int64                 // where on the connection the last message sent ends, at the least
	pending []sentMessage
}

type sentMessage struct {
	end int64
	id  int64
	n   int
}

func (l *sentLedger) claim(carried func(id int64, n int)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.carried != nil {
		return false
	}
	l.carried, l.written, l.queued, l.pending = carried, 0, 0, nil
	return true
}

// release drops what is pending: the stream is over.
func (l *sentLedger) release() {
	l.mu.Lock()
	l.carried, l.pending = nil, nil
	l.mu.Unlock()
}

// sent records a DATA message of n payload bytes for connection id that gRPC took. Its bytes may have been
// written already, before gRPC's send returned.
func (l *sentLedger) sent(id int64, n int) {
	l.mu.Lock()
	l.queued += int64(n + minWireOverhead)
	if l.written >= l.queued && len(l.pending) == 0 {
		carried := l.carried
		l.mu.Unlock()
		carried(id, n)
		return
	}
	l.pending = append(l.pending, sentMessage{end: l.queued, id: id, n: n})
	l.mu.Unlock()
}

func (l *sentLedger) wrote(n int) {
	if n <= 0 {
		return
	}
	l.mu.Lock()
	l.written += int64(n)
	i := 0
	for i < len(l.pending) && l.pending[i].end <= l.written {
		i++
	}
	if i == 0 {
		l.mu.Unlock()
		return
	}
	// Taken out to call carried without the lock; a write seldom completes more than a few messages, so
	// they stay on the stack.
	var small [8]sentMessage
	due := append(small[:0], l.pending[:i]...)
	carried := l.carried
	l.pending = append(l.pending[:0], l.pending[i:]...)
	l.mu.Unlock()
	for _, m := range due {
		carried(m.id, m.n)
	}
}

// sendPackets sends a batch of packets to the frontend, DATA packets split into messages of at most chunk()
// bytes, asked before each packet.
func (s *Server) sendPackets(send func(any) error, batch []*client.Packet, chunk func() int) error {
	for _, p := range batch {
		if err := sendChunked(send, p, chunk(), s.metrics.chunkedPackets); err != nil {
			return err
		}
	}
	return nil
}

// mergeData is the frontend queue's Merge: small DATA packets of one connection are combined as they are
// queued, up to frontendChunk bytes (flow.AppendSmall). Upstream's agent sends 4 KiB packets, and
// kube-apiserver's client pays per message (a receive, a channel hand-off and a copy), so a backlog of them
// goes out as fewer, larger messages; and a window of tiny packets costs the queue about its bytes. A DATA
// packet of flow.MergeBelow or more goes as it is, without a copy.
func mergeData(tail, p *client.Packet, owned bool) (*client.Packet, bool) {
	t, d := tail.GetData(), p.GetData()
	if t == nil || d == nil || t.ConnectID != d.ConnectID || t.Error != "" || d.Error != "" {
		return nil, false
	}
	b, ok := flow.AppendSmall(t.Data, d.Data, owned, frontendChunk)
	if !ok {
		return nil, false
	}
	if owned {
		t.Data = b
		return tail, true
	}
	return &client.Packet{
		Type:    client.PacketType_DATA,
		Payload: &client.Packet_Data{Data: &client.Data{ConnectID: t.ConnectID, Data: b}},
	}, true
}
