package socks

import (
	"net"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/pki/source"
)

// DefaultMaxUnauthenticatedPerSource is Server.MaxUnauthenticatedPerSource's default.
const DefaultMaxUnauthenticatedPerSource = 64

// preAuth bounds, per source address, the connections that have not authenticated yet. A server that takes
// credentials listens beyond loopback; without this bound one peer that never authenticates could hold
// every one of MaxConns for a handshake timeout at a time, and again, and keep its users out. A few sources
// together still could, so a source whose connections keep running out their handshake time is kept out
// for a while (penalties).
type preAuth struct {
	sources   source.Counter
	penalties source.Penalties
}

// newPreAuth bounds each source at max unauthenticated connections. The penalties scale with the handshake
// timeout as OpenSSH's do with its LoginGraceTime (grace-exceeded 10 s, min 15 s, max 600 s at 10 s): one
// connection that lapses costs its source nothing, two in a row keep it out for a few seconds, and a source
// that lets its whole share lapse is kept out for 60 handshake timeouts.
func newPreAuth(max int, handshake time.Duration) *preAuth {
	return &preAuth{
		sources:   source.Counter{Max: max},
		penalties: source.Penalties{Per: handshake, Threshold: handshake * 3 / 2, Max: 60 * handshake},
	}
}

// why names what keeps a refused source out.
type why string

const (
	atBound   why = "too many unauthenticated connections from its source"
	penalized why = "its source's connections kept running out their handshake time"
)

// admit counts c against its source, or reports why its source is refused. The connection counts until its
// handshake is over or it closes; one that closes unauthenticated past its handshake deadline penalizes its
// source.
func (p *preAuth) admit(c net.Conn) (net.Conn, why) {
	src := source.Of(c.RemoteAddr())
	if p.penalties.Refused(src, time.Now()) {
		return c, penalized
	}
	if !p.sources.Take(src) {
		return c, atBound
	}
	pc := &preAuthConn{Conn: c}
	pc.release = func() { p.sources.Release(src) }
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

// refuseSource drops a connection whose source preAuth refused, with a reset.
func (s *Server) refuseSource(c net.Conn, reason why) {
	s.Log.V(1).Info("Proxy connection refused: "+string(reason), "remote", c.RemoteAddr())
	source.Refuse(c)
}
