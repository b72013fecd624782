package socks

import (
	"net"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/pki/source"
)

// DefaultMaxUnauthenticatedPerSource is Server.MaxUnauthenticatedPerSource's default.
const DefaultMaxUnauthenticatedPerSource = 64

// MinMaxConnsWithCredentials is the smallest MaxConns a Server with Credentials serves with: below it,
// unauthenticatedBounds would leave a source no connection at all.
const MinMaxConnsWithCredentials = 4

// unauthenticatedBounds is the one rule for how many of maxConns connections may be unauthenticated at
// once: half of them in all, so that however many sources take part, the other half is left to clients
// that authenticated (OpenSSH bounds its unauthenticated connections in all the same way, MaxStartups); and
// from one source at most perSource and at most half of that half, so that one source alone cannot fill
// it and keep every other source's handshakes out.
func unauthenticatedBounds(maxConns, perSource int) (total, perSrc int) {
	total = maxConns / 2
	return total, min(perSource, total/2)
}

// preAuth bounds the connections that have not authenticated yet, in all and per source address
// (unauthenticatedBounds). A server that takes credentials listens beyond loopback; without these bounds
// peers that never authenticate could hold every one of MaxConns for a handshake timeout at a time, and
// again, and keep its users out. Sources together still could fill their half again and again, so a source
// whose connections keep running out their handshake time is kept out for a while (penalties).
type preAuth struct {
	sources   source.Counter
	penalties source.Penalties
	maxTotal  int

	mu    sync.Mutex
	total int
}

// newPreAuth bounds the unauthenticated connections at maxTotal in all and perSource from each source. The
// penalties scale with the handshake timeout as OpenSSH's do with its LoginGraceTime (grace-exceeded 10 s,
// min 15 s, max 600 s at 10 s): one connection that lapses costs its source nothing, two in a row keep it
// out for a few seconds, and a source that lets its whole share lapse is kept out for 60 handshake
// timeouts.
func newPreAuth(maxTotal, perSource int, handshake time.Duration) *preAuth {
	return &preAuth{
		sources:   source.Counter{Max: perSource},
		penalties: source.Penalties{Per: handshake, Threshold: handshake * 3 / 2, Max: 60 * handshake},
		maxTotal:  maxTotal,
	}
}

// why names what keeps a refused source out.
type why string

const (
	atBound   why = "too many unauthenticated connections from its source"
	full      why = "too many unauthenticated connections"
	penalized why = "its source's connections kept running out their handshake time"
)

// admit counts c in all and against its source, or reports why it is refused. The connection counts until
// its handshake is over or it closes; one that closes unauthenticated past its handshake deadline penalizes
// its source.
func (p *preAuth) admit(c net.Conn) (net.Conn, why) {
	src := source.Of(c.RemoteAddr())
	if p.penalties.Refused(src, time.Now()) {
		return c, penalized
	}
	if !p.sources.Take(src) {
		return c, atBound
	}
	p.mu.Lock()
	if p.total >= p.maxTotal {
		p.mu.Unlock()
		p.sources.Release(src)
		return c, full
	}
	p.total++
	p.mu.Unlock()
	pc := &preAuthConn{Conn: c}
	pc.release = func() {
		p.mu.Lock()
		p.total--
		p.mu.Unlock()
		p.sources.Release(src)
	}
	pc.lapsed = func() { p.penalties.Add(src, time.Now()) }
	return pc, ""
}

// preAuthConn is a connection counted by preAuth. Its handshake is over where the server lifts the
// handshake's read deadline (SetReadDeadline with the zero time): after the credentials were checked and
// the request read, in every protocol.
type preAuthConn struct {
	net.Conn
	once            sync.Once
	release, lapsed func()

	mu       sync.Mutex
	deadline time.Time // the handshake's, set by the server's first read deadline
	done     bool      // the handshake is over
}

func (c *preAuthConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	if t.IsZero() {
		c.done = true
	} else if c.deadline.IsZero() {
		c.deadline = t
	}
	c.mu.Unlock()
	if t.IsZero() {
		c.once.Do(c.release)
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *preAuthConn) Close() error {
	c.once.Do(func() {
		c.release()
		c.mu.Lock()
		lapsed := !c.done && !c.deadline.IsZero() && !time.Now().Before(c.deadline)
		c.mu.Unlock()
		if lapsed {
			c.lapsed()
		}
	})
	return c.Conn.Close()
}

// CloseWrite half-closes the connection when the one underneath can (relay uses it).
func (c *preAuthConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// refuseSource drops a connection preAuth refused, with a reset.
func (s *Server) refuseSource(c net.Conn, reason why) {
	s.Log.V(1).Info("Proxy connection refused: "+string(reason), "remote", c.RemoteAddr())
	source.Refuse(c)
}
