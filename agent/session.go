package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/konnectivity/batchtls"
	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/egress/konnectivity/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// controlQueue is how many control replies (CLOSE_RSP for unknown connections, refused dials) a session holds
// for its one control writer. DRAIN has its own slot (session.drainReq).
const controlQueue = 256

// connectTimeout bounds the TLS handshake, authentication and the server's response headers. Upstream's
// agent waits for the headers without a bound.
const connectTimeout = 15 * time.Second

// Transport sizes. Every tunnelled connection to one server shares one HTTP/2 stream, so its window is what
// bounds their total throughput; gRPC's 64 KiB default would allow a few packets in flight.
const (
	streamWindow    = 16 << 20
	connWindow      = 32 << 20
	transportBuffer = 256 << 10
)

var errSessionClosed = errors.New("server connection closed")

// session is one AgentService.Connect stream to one server.
type session struct {
	a        *Agent
	ep       endpoint
	serverID string
	count    int // the server's serverCount header
	since    time.Time

	cc     *grpc.ClientConn
	stream agentpb.AgentService_ConnectClient
	ctx    context.Context
	cancel context.CancelFunc

	// flow is the server's answer to the agent's flow-control offer: the window it grants each connection for
	// data from the agent. nil: the server does not speak the extension, and connections fall back to their
	// queue's limit and stall timeout. grants sends the agent's own grants; nil with flow.
	flow   *flow.Offer
	grants *flow.Grants
	budget *flow.Budget // how far this stream's receive windows may grow together

	sendMu sync.Mutex
	ctrl   chan *client.Packet // control replies, sent in order by controlWriter
	// drainReq asks controlWriter to send DRAIN. It is apart from ctrl, which drops what does not fit: a
	// server that never hears DRAIN keeps sending new dials to a draining agent.
	drainReq chan struct{}
	dead     atomic.Bool
	errMu    sync.Mutex
	err      error // why the session ended

	nextConnID atomic.Int64
	mu         sync.Mutex
	closed     bool
	conns      map[int64]*conn
	dials      map[int64]context.CancelFunc // pending dials by dial ID, for DIAL_CLS
	wg         sync.WaitGroup               // dials, readers, writers, the probe

	drainOnce sync.Once
}

// dialServer opens a stream to ep and reads the server's ID and count from the response headers.
func (a *Agent) dialServer(ctx context.Context, ep endpoint) (*session, error) {
	tlsCfg := a.creds.tlsConfig(ep.serverName)
	md := metadata.Pairs(header.AgentID, a.cfg.AgentID, header.AgentIdentifiers, a.cfg.Identifiers)
	if tok := a.creds.bearer(); tok != "" {
		md.Set(header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+tok)
	}
	if !a.cfg.DisableFlowControl {
		md.Set(flow.Header, a.cfg.flowOffer().String())
	}
	cc, err := grpc.NewClient("passthrough:///"+ep.addr,
		grpc.WithTransportCredentials(batchtls.Credentials(grpccreds.NewTLS(tlsCfg))),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: a.cfg.KeepaliveTime, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithWriteBufferSize(transportBuffer),
		grpc.WithReadBufferSize(transportBuffer),
		grpc.WithMaxHeaderListSize(konnectivity.MaxHeaderList),
		// ZeroCopySend stays off: a connection reuses the buffer of a small read for its next one. A read
		// large enough to skip the copy goes out in its own buffer, given away as a wire.OwnedData (conn.go).
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(a.cfg.MaxRecvMessage), grpc.ForceCodecV2(wire.Codec{})),
		experimental.WithBufferPool(wire.Pool),
		grpc.WithUserAgent("konnect-agent"),
	)
	if err != nil {
		return nil, fmt.Errorf("server %s: %w", ep.addr, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &session{a: a, ep: ep, cc: cc, ctx: sctx, cancel: cancel, ctrl: make(chan *client.Packet, controlQueue),
		drainReq: make(chan struct{}, 1),
		conns:    make(map[int64]*conn), dials: make(map[int64]context.CancelFunc)}
	fail := func(err error) (*session, error) {
		cancel()
		_ = cc.Close()
		return nil, fmt.Errorf("server %s: %w", ep.addr, err)
	}
	timer := time.AfterFunc(connectTimeout, cancel)
	defer timer.Stop()
	s.stream, err = agentpb.NewAgentServiceClient(cc).Connect(metadata.NewOutgoingContext(sctx, md))
	if err != nil {
		return fail(err)
	}
	hdr, err := s.stream.Header()
	if err != nil {
		return fail(err)
	}
	ids := hdr.Get(header.ServerID)
	if len(ids) != 1 {
		// A server that refuses the agent (bad token, for example) answers with trailers only; the real
		// reason is the stream's status.
		if _, rerr := s.stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			return fail(rerr)
		}
		return fail(fmt.Errorf("expected one %s header, got %v", header.ServerID, ids))
	}
	counts := hdr.Get(header.ServerCount)
	if len(counts) != 1 {
		return fail(fmt.Errorf("expected one %s header, got %v", header.ServerCount, counts))
	}
	n, err := strconv.Atoi(counts[0])
	if err != nil || n < 0 {
		return fail(fmt.Errorf("bad %s header %q", header.ServerCount, counts[0]))
	}
	if !a.cfg.DisableFlowControl {
		offer, ok, err := flow.ParseAnswer(hdr.Get(flow.Header))
		if err != nil {
			return fail(err)
		}
		if ok {
			s.flow = &offer
			s.grants = flow.NewGrants(s.send)
			s.budget = flow.NewBudget(flow.StreamBudget(a.cfg.FlowMaxWindow))
		}
	}
	if !timer.Stop() {
		return fail(context.DeadlineExceeded)
	}
	s.serverID, s.count, s.since = ids[0], n, time.Now()
	return s, nil
}

// flowControl is the flow control the stream runs: flow.Version, or flow.None.
func (s *session) flowControl() string {
	if s.flow != nil {
		return flow.Version
	}
	return flow.None
}

func (s *session) send(pkt *client.Packet) error { return s.sendMsg(pkt, pkt.Type) }

// sendOwned sends a DATA packet together with its payload's buffer, which it gives away: the caller must not
// touch d.Buf again, whatever the outcome (wire.OwnedData).
func (s *session) sendOwned(d *wire.OwnedData) error { return s.sendMsg(d, client.PacketType_DATA) }

// sendMsg sends m, a *client.Packet of type t or a *wire.OwnedData, which the codec encodes as one.
func (s *session) sendMsg(m any, t client.PacketType) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.dead.Load() {
		return errSessionClosed
	}
	if err := s.stream.SendMsg(m); err != nil {
		s.a.m.sendError(err, t)
		s.fail(fmt.Errorf("send %s: %w", t, err))
		return err
	}
	s.a.m.packetSent(t)
	return nil
}

// sendAsync queues a control packet for controlWriter, so that the receive loop is not held up behind a
// stream that is full. When the queue is full the packet is dropped: the server has stopped reading, and
// each of these replies only closes the server's side of a connection it has already lost (or tells it of a
// dial it will time out), so dropping costs nothing that blocking or one goroutine per reply would save.
func (s *session) sendAsync(pkt *client.Packet) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return
	}
	select {
	case s.ctrl <- pkt:
	default:
		s.a.m.controlDropped.Inc()
		klog.V(2).InfoS("Control queue full; dropping a reply", "type", pkt.Type, "serverID", s.serverID, "server", s.ep.addr)
	}
}

// controlWriter sends queued control packets, in order, until the session ends.
func (s *session) controlWriter() {
	for {
		select {
		case <-s.ctx.Done():
			return
		case pkt := <-s.ctrl:
			if s.send(pkt) != nil {
				return
			}
		case <-s.drainReq:
			klog.V(2).InfoS("Sending DRAIN", "serverID", s.serverID, "server", s.ep.addr)
			if s.send(&client.Packet{Type: client.PacketType_DRAIN, Payload: &client.Packet_Drain{Drain: &client.Drain{}}}) != nil {
				return
			}
		}
	}
}

// fail ends the session; serve notices and tears it down.
func (s *session) fail(err error) {
	s.errMu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.errMu.Unlock()
	s.dead.Store(true)
	s.cancel()
}

func (s *session) lastErr() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

func (s *session) drain() {
	s.drainOnce.Do(func() {
		s.drainReq <- struct{}{} // never blocks: the slot is only filled here, once
	})
}

// serve runs the receive loop until the stream ends, then closes everything the session opened.
func (s *session) serve() {
	defer s.teardown()
	// teardown waits for the probe and the control writer: it only runs once this loop has returned.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.probe()
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.controlWriter()
	}()
	for {
		pkt, err := s.stream.Recv()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
				s.fail(errors.New("server closed the stream"))
			case s.ctx.Err() != nil || status.Code(err) == codes.Canceled:
				s.fail(err)
			default:
				s.a.m.recvError(err)
				s.fail(err)
				klog.ErrorS(err, "Lost the connection to a server", "serverID", s.serverID, "server", s.ep.addr)
			}
			return
		}
		s.a.m.packetReceived(pkt.Type)
		switch pkt.Type {
		case client.PacketType_DIAL_REQ:
			s.handleDial(pkt.GetDialRequest())
		case client.PacketType_DATA:
			d := pkt.GetData()
			if c := s.conn(d.GetConnectID()); c != nil {
				c.enqueue(d.Data)
			} else if d.GetConnectID() != 0 {
				klog.V(2).InfoS("DATA for an unknown connection", "serverID", s.serverID, "connectionID", d.GetConnectID())
				s.sendAsync(closeRsp(d.GetConnectID(), "unrecognized connectID"))
			}
		case client.PacketType_CLOSE_REQ:
			id := pkt.GetCloseRequest().GetConnectID()
			if c := s.conn(id); c != nil {
				c.closeRequested()
			} else {
				s.sendAsync(closeRsp(id, "Unknown connectID"))
			}
		case flow.GrantType:
			if s.flow == nil {
				klog.V(2).InfoS("Ignoring a flow-control grant from a server that did not take up flow control", "serverID", s.serverID)
				continue
			}
			if err := flow.DecodeGrants(pkt, s.grant); err != nil {
				s.a.m.flowViolation(flowMalformed)
				s.fail(err)
				klog.ErrorS(err, "Closing the stream to a server that broke flow control", "serverID", s.serverID, "server", s.ep.addr)
				return
			}
		case client.PacketType_DIAL_CLS:
			// The frontend gave up before the dial finished (upstream's agent ignores this).
			s.mu.Lock()
			cancel := s.dials[pkt.GetCloseDial().GetRandom()]
			delete(s.dials, pkt.GetCloseDial().GetRandom())
			s.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		default:
			klog.V(5).InfoS("Ignoring packet", "type", pkt.Type, "serverID", s.serverID)
		}
	}
}

// grant gives a connection the credit the server granted it. A grant for a connection that is gone crossed
// its close on the wire, and is no fault.
func (s *session) grant(id, n int64) error {
	if c := s.conn(id); c != nil {
		c.granted(n)
	}
	return nil
}

func closeRsp(id int64, msg string) *client.Packet {
	return &client.Packet{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{
		CloseResponse: &client.CloseResponse{ConnectID: id, Error: msg}}}
}

func dialRsp(random, id int64, msg string) *client.Packet {
	return &client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
		DialResponse: &client.DialResponse{Random: random, ConnectID: id, Error: msg}}}
}

func (s *session) handleDial(req *client.DialRequest) {
	random, addr := req.GetRandom(), req.GetAddress()
	refuse := func(reason string, err error) {
		s.a.m.dialFailures.WithLabelValues(reason).Inc()
		klog.V(1).InfoS("Dial refused", "serverID", s.serverID, "dialID", random, "dialAddress", addr, "err", err)
		s.sendAsync(dialRsp(random, 0, err.Error()))
	}
	// A draining agent still dials, as upstream's does: upstream's server sends it a dial only when no other
	// agent serves the destination (destHost: its node), and a refusal would fail that request for certain.
	switch req.GetProtocol() {
	case "tcp", "tcp4", "tcp6":
	default:
		refuse(dialFailureUnknown, fmt.Errorf("konnect agent: protocol %q not supported", req.GetProtocol()))
		return
	}
	if err := s.a.cfg.Allow.check(addr); err != nil {
		refuse(dialFailureNotAllowed, err)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.a.cfg.DialTimeout)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return
	}
	s.dials[random] = cancel
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer cancel()
		d := net.Dialer{}
		if len(s.a.cfg.Allow) > 0 {
			d.Control = s.a.cfg.Allow.control
		}
		start := time.Now()
		nc, err := d.DialContext(ctx, req.GetProtocol(), addr)
		s.mu.Lock()
		_, pending := s.dials[random]
		delete(s.dials, random)
		s.mu.Unlock()
		if !pending { // DIAL_CLS, or the session is going away: nobody waits for an answer
			if nc != nil {
				_ = nc.Close()
			}
			return
		}
		if err != nil {
			reason := dialFailureUnknown
			var ne net.Error
			switch {
			case errors.Is(err, konnectivity.ErrNotAllowed):
				reason = dialFailureNotAllowed
			case errors.As(err, &ne) && ne.Timeout():
				reason = dialFailureTimeout
			}
			s.a.m.dialFailures.WithLabelValues(reason).Inc()
			klog.V(1).InfoS("Dial to backend failed", "serverID", s.serverID, "dialID", random, "dialAddress", addr, "err", err)
			_ = s.send(dialRsp(random, 0, err.Error()))
			return
		}
		s.a.m.dialed(time.Since(start))
		c := newConn(s, s.nextConnID.Add(1), nc)
		if !s.addConn(c) {
			_ = nc.Close()
			return
		}
		klog.V(3).InfoS("Backend connection established", "serverID", s.serverID, "dialID", random, "connectionID", c.id, "dialAddress", addr)
		// The connection is registered before DIAL_RSP goes out, so DATA that follows finds it.
		if err := s.send(dialRsp(random, c.id, "")); err != nil {
			c.finish("")
			return
		}
		s.wg.Add(2) // the reader, and the queue's writer until the queue ends
		c.q.Start(c.writeBatch, c.writerEnded)
		go c.readLoop()
	}()
}

func (s *session) conn(id int64) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns[id]
}

func (s *session) addConn(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c.id] = c
	s.a.connOpened()
	return true
}

func (s *session) removeConn(id int64) {
	s.mu.Lock()
	delete(s.conns, id)
	s.mu.Unlock()
}

func (s *session) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// probe ends the session when its transport fails, as upstream's --probe-interval does.
func (s *session) probe() {
	t := time.NewTicker(s.a.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			if st := s.cc.GetState(); st == connectivity.TransientFailure || st == connectivity.Shutdown {
				s.fail(fmt.Errorf("transport is %s", st))
				return
			}
		}
	}
}

func (s *session) teardown() {
	s.dead.Store(true)
	if s.grants != nil {
		s.grants.Stop()
	}
	s.cancel()
	s.mu.Lock()
	s.closed = true
	conns := slices.Collect(maps.Values(s.conns))
	for id, cancel := range s.dials {
		cancel()
		delete(s.dials, id)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.finish("")
	}
	s.wg.Wait()
	_ = s.cc.Close()
}
