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
// every one of MaxConns for a handshake timeout at a time, and again, and keep its users out.
type preAuth struct {
	sources source.Counter
}

// admit counts c against its source, or reports false when the source is at the bound. The connection
// counts until its handshake is over or it closes.
func (p *preAuth) admit(c net.Conn) (net.Conn, bool) {
	src := source.Of(c.RemoteAddr())
	if !p.sources.Take(src) {
		return c, false
	}
	return &preAuthConn{Conn: c, release: func() { p.sources.Release(src) }}, true
}

// preAuthConn is a connection counted by preAuth. Its handshake is over where the server lifts the
// handshake's read deadline (SetReadDeadline with the zero time): after the credentials were checked and
// the request read, in every protocol.
type preAuthConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *preAuthConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() {
		c.once.Do(c.release)
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *preAuthConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// CloseWrite half-closes the connection when the one underneath can (relay uses it).
func (c *preAuthConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// refuseSource drops a connection whose source is at the bound, with a reset.
func (s *Server) refuseSource(c net.Conn, max int) {
	s.Log.V(1).Info("Proxy connection refused: too many unauthenticated connections from its source", "remote", c.RemoteAddr(), "max", max)
	source.Refuse(c)
}
