package tunnel

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
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
func newFrontendQueue(s *Server, stalled func()) *flow.Queue[*client.Packet] {
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
	q.Hooks = flow.Hooks{
		Queued: func(d int) { s.metrics.queuedBytes.Add(float64(d)) },
		Waited: s.metrics.stalledWaits.Inc,
		Stalled: func() {
			s.metrics.stalledClosed.Inc()
			stalled()
		},
	}
	return q
}

// frontendStream hands packets for kube-apiserver to the connection's own queue instead of writing them on
// the agent stream's goroutine.
type frontendStream struct {
	grpc.ServerStream
	q    *flow.Queue[*client.Packet]
	flow *frontendFlow
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

// frontendInterceptor gives every frontend stream (one tunnel, one connection: kube-apiserver's client is
// single-use) its send queue. The handler runs on the stream's own goroutine: a stalled reader is cut off
// by closing its connection (see tunnelCreds), which ends the handler.
func (s *Server) frontendInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	s.frontends.Add(1)
	defer s.frontends.Add(-1)
	var stalled atomic.Bool
	q := newFrontendQueue(s, func() {
		stalled.Store(true)
		closeTunnelConn(ss.Context())
	})
	ff := &frontendFlow{close: func() { closeTunnelConn(ss.Context()) }, queue: q}
	defer ff.end()
	writerDone := make(chan struct{})
	// Each message sent is progress: gRPC lets a send return once the one before has mostly gone out. So
	// a DATA message counts as consumed, and its connection is granted more, when the next send returns, or
	// when nothing more waits: until then gRPC may still hold it for a reader that has not taken it.
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
		err := ss.SendMsg(m)
		q.Progress()
		if err != nil {
			return err
		}
		credit()
		if d := m.(*client.Packet).GetData(); d != nil {
			heldID, held = d.ConnectID, len(d.Data)
			sent += int64(len(d.Data))
		}
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
	err := handler(srv, &frontendStream{ServerStream: ss, q: q, flow: ff})
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
// connection goes on to gRPC unchanged, which keeps its buffer-free waits for idle Unix sockets.
type tunnelCreds struct {
	credentials.TransportCredentials
}

// tunnelInfo is the connection's AuthInfo, with the connection.
type tunnelInfo struct {
	credentials.AuthInfo
	conn net.Conn
}

func (c tunnelCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	return conn, tunnelInfo{AuthInfo: info, conn: conn}, nil
}

func (c tunnelCreds) Clone() credentials.TransportCredentials {
	return tunnelCreds{c.TransportCredentials.Clone()}
}

// closeTunnelConn closes the connection of the stream whose context ctx is.
func closeTunnelConn(ctx context.Context) {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(tunnelInfo); ok {
			_ = info.conn.Close()
		}
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
