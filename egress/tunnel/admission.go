package tunnel

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/pki/source"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// Defaults for the bounds on peers that have not authenticated yet (see admission).
const (
	// DefaultHandshakeTimeout bounds the TLS handshake and HTTP/2 preface on the TCP listeners; gRPC's own
	// default is 120 s.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultAgentAuthTimeout is how long a connection to the agent port may take, from accept, to have a
	// Connect stream accepted (TLS handshake, HTTP/2 preface, authentication). The agents' own bound is
	// 15 s (konnect) or none (upstream).
	DefaultAgentAuthTimeout = 10 * time.Second
	// DefaultMaxUnauthenticated bounds the connections to the agent port that have not authenticated yet,
	// in all and from one source address. A connection that authenticates stops counting, so these bound
	// how many authenticate at once, not how many agents connect. Beyond the total, new connections wait
	// in the kernel's accept queue, in order, until a slot frees: 5,000 agents reconnecting together get in
	// a thousand at a time without a reset and a retry. Beyond the bound per source (one IPv4 address or
	// IPv6 /64), a new connection is reset.
	DefaultMaxUnauthenticated          = 1024
	DefaultMaxUnauthenticatedPerSource = 64
)

// maxFrontendHandshakes bounds the TLS handshakes in progress on the mutual-TLS TCP frontend; beyond it,
// new connections wait in the accept queue as on the agent port (kube-apiserver opens one connection per
// tunnel and does not retry a failed dial). A variable for tests.
var maxFrontendHandshakes = 1024

const (
	connPending int32 = iota
	connAuthenticated
	connClosed
)

// admission bounds the peers of one TCP listener until they authenticate. Each must authenticate within
// timeout of being accepted or it is closed, and at most maxTotal (maxPerSource from one source) may be
// unauthenticated at once: past maxTotal the listener accepts nothing until a slot frees, past
// maxPerSource a new connection is reset. Without these, gRPC gives a TLS handshake 120 s and an HTTP/2 connection that
// never opens a stream forever. What "authenticated" means is the listener's: a completed TLS handshake
// (which verified the client certificate) on the frontend, an accepted Connect stream on the agent port.
type admission struct {
	listener    string        // "agent" or "frontend", for metrics and logs
	handshake   time.Duration // to complete the TLS handshake
	timeout     time.Duration // to authenticate (at least handshake)
	maxTotal    int           // 0: no bound
	onHandshake bool          // a completed TLS handshake authenticates the connection
	m           *authMetrics

	sources source.Counter // the unauthenticated connections of each source; Max is maxPerSource (0: no bound)

	mu        sync.Mutex
	slotFreed chan struct{} // closed and replaced whenever a slot frees
	total     int
}

func newAdmission(listener string, handshake, timeout time.Duration, maxTotal, maxPerSource int, m *authMetrics) *admission {
	return &admission{listener: listener, handshake: min(handshake, timeout), timeout: timeout, maxTotal: maxTotal,
		m: m, sources: source.Counter{Max: maxPerSource}, slotFreed: make(chan struct{})}
}

// take counts a new unauthenticated connection from src, or reports false when src is at its bound. The
// caller waited for a free slot in all (full).
func (a *admission) take(src netip.Addr) bool {
	if !a.sources.Take(src) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.total++
	a.m.unauthenticated.WithLabelValues(a.listener).Inc()
	return true
}

func (a *admission) release(src netip.Addr) {
	a.sources.Release(src)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.total--
	a.m.unauthenticated.WithLabelValues(a.listener).Dec()
	close(a.slotFreed)
	a.slotFreed = make(chan struct{})
}

// full reports whether the total bound is reached, and a channel closed when a slot frees.
func (a *admission) full() (bool, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxTotal > 0 && a.total >= a.maxTotal, a.slotFreed
}

// listen wraps ln so that every connection it accepts is bounded by a.
func (a *admission) listen(ln net.Listener) net.Listener {
	return &admitListener{Listener: ln, a: a, closed: make(chan struct{})}
}

type admitListener struct {
	net.Listener
	a         *admission
	closeOnce sync.Once
	closed    chan struct{}
}

func (l *admitListener) Accept() (net.Conn, error) {
	for {
		for waited := false; ; waited = true {
			full, freed := l.a.full()
			if !full {
				break
			}
			if !waited {
				l.a.m.acceptWaits.WithLabelValues(l.a.listener).Inc()
			}
			select {
			case <-freed:
			case <-l.closed:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source.Of(c.RemoteAddr())
		if !l.a.take(src) {
			l.a.m.connsRefused.WithLabelValues(l.a.listener).Inc()
			klog.V(2).InfoS("Refused a connection: too many unauthenticated connections from its source", "listener", l.a.listener,
				"remote", c.RemoteAddr(), "bound", l.a.sources.Max)
			source.Refuse(c)
			continue
		}
		ac := &admitConn{Conn: c, a: l.a, src: src, deadline: time.Now().Add(l.a.timeout)}
		ac.timer = time.AfterFunc(l.a.handshake, ac.check)
		return ac, nil
	}
}

func (l *admitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// admitConn is an accepted connection that counts against its admission until it authenticates or closes.
type admitConn struct {
	net.Conn
	a          *admission
	src        netip.Addr
	deadline   time.Time // to authenticate
	timer      *time.Timer
	state      atomic.Int32
	handshaken atomic.Bool

	// Agent port: whether a Connect stream is being authenticated now, and whether one ever was before the
	// connection authenticated (it gets one attempt).
	authBusy atomic.Bool
	tried    atomic.Bool
}

// NetConn is the accepted connection (flow.AckWatch looks through it).
func (c *admitConn) NetConn() net.Conn { return c.Conn }

// authenticated takes the connection out of its admission's bounds for good.
func (c *admitConn) authenticated() {
	if c.state.CompareAndSwap(connPending, connAuthenticated) {
		c.timer.Stop()
		c.a.release(c.src)
	}
}

func (c *admitConn) isAuthenticated() bool { return c.state.Load() == connAuthenticated }

// check closes a connection that has not completed its handshake, or not authenticated, in time.
func (c *admitConn) check() {
	stage, bound := "handshake", c.a.handshake
	if c.handshaken.Load() {
		if left := time.Until(c.deadline); left > 0 {
			c.timer.Reset(left)
			return
		}
		stage, bound = "auth", c.a.timeout
	}
	if c.state.CompareAndSwap(connPending, connClosed) {
		c.a.release(c.src)
		c.a.m.connsExpired.WithLabelValues(c.a.listener, stage).Inc()
		klog.V(2).InfoS("Closed a connection that did not authenticate in time", "listener", c.a.listener,
			"remote", c.RemoteAddr(), "stage", stage, "timeout", bound)
		_ = c.Conn.Close()
	}
}

func (c *admitConn) Close() error {
	if c.state.Swap(connClosed) == connPending {
		c.timer.Stop()
		c.a.release(c.src)
	}
	return c.Conn.Close()
}

// beginAuth lets one Connect stream of this connection authenticate: one at a time, and only one ever
// before the connection has authenticated, so that a connection cannot make the server review tokens
// without bound (upstream reviews every stream, and a connection may open hundreds at once).
func (c *admitConn) beginAuth() (end func(), refused error) {
	if !c.authBusy.CompareAndSwap(false, true) {
		return nil, status.Error(codes.ResourceExhausted, "another Connect stream of this connection is authenticating; open one at a time")
	}
	if !c.isAuthenticated() && c.tried.Swap(true) {
		c.authBusy.Store(false)
		return nil, status.Error(codes.PermissionDenied, "this connection already tried to authenticate; connect again")
	}
	var once sync.Once
	return func() { once.Do(func() { c.authBusy.Store(false) }) }, nil
}

// admitCreds wraps a listener's transport credentials so that a stream reaches its admitConn through its
// peer's AuthInfo, and, on the frontend, so that a completed handshake authenticates the connection.
type admitCreds struct {
	credentials.TransportCredentials
	a *admission
}

// admitInfo is the connection's AuthInfo, with its admitConn.
type admitInfo struct {
	credentials.AuthInfo
	conn *admitConn
}

func (c admitCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	ac, ok := raw.(*admitConn)
	if !ok {
		return conn, info, nil
	}
	ac.handshaken.Store(true)
	if c.a.onHandshake {
		ac.authenticated()
	}
	return conn, admitInfo{AuthInfo: info, conn: ac}, nil
}

func (c admitCreds) Clone() credentials.TransportCredentials {
	return admitCreds{c.TransportCredentials.Clone(), c.a}
}

// admittedConn is the admitConn of the stream whose context ctx is, or nil.
func admittedConn(ctx context.Context) *admitConn {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	switch info := p.AuthInfo.(type) {
	case admitInfo:
		return info.conn
	case tunnelInfo:
		if ai, ok := info.AuthInfo.(admitInfo); ok {
			return ai.conn
		}
	}
	return nil
}

// agentAuthInterceptor authenticates each Connect stream (by token, when configured; a client certificate
// was checked in the handshake) before anything else looks at it, with one stream per connection in
// authentication at a time. A stream whose response headers are sent was accepted, which authenticates its
// connection (see admission).
func (s *Server) agentAuthInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	ac := admittedConn(ctx)
	end := func() {}
	if ac != nil {
		var err error
		if end, err = ac.beginAuth(); err != nil {
			s.authMetrics.authRefused.WithLabelValues("stream").Inc()
			return err
		}
		defer end()
	}
	if s.tokens != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		var src netip.Addr
		if p, ok := peer.FromContext(ctx); ok {
			src = source.Of(p.Addr)
		}
		node, err := s.tokens.authenticate(ctx, md, src)
		if err != nil {
			id, idents, remote := agentOf(ctx)
			s.agents.refused(id, idents, remote, err)
			return err
		}
		ss = s.verifyIdentifiers(ctx, ss, node)
	}
	return handler(srv, &acceptWatch{ServerStream: ss, accepted: func() {
		if ac != nil {
			ac.authenticated()
		}
		end()
	}})
}

// acceptWatch calls accepted as the stream's response headers are sent: upstream's handler sends them only
// once it has taken the agent.
type acceptWatch struct {
	grpc.ServerStream
	accepted func()
	once     sync.Once
}

func (w *acceptWatch) SendHeader(md metadata.MD) error {
	// Accepted before the headers go, not after: a peer that has them may open its next stream at once,
	// and that stream must find the connection authenticated and no stream of it authenticating.
	w.once.Do(w.accepted)
	return w.ServerStream.SendHeader(md)
}
