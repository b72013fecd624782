package daemon

import (
	"net"
	"sync"

	"github.com/konnect-dev/konnect/pki/source"
	"k8s.io/klog/v2"
)

// MaxConnsPerSource bounds the connections one source address (source.Of) may hold
// open at once to a health, metrics or admin endpoint. Those endpoints need no credentials and, once bound
// beyond loopback, anyone may open connections to them; the timeouts above bound how long each lives, this
// how many one peer holds. Probes and scrapers use a few.
const MaxConnsPerSource = 128

// LimitPerSource returns ln with at most n connections open from one source address at once; beyond, a new
// connection is reset as soon as it is accepted.
func LimitPerSource(ln net.Listener, n int) net.Listener {
	return &sourceLimit{Listener: ln, sources: source.Counter{Max: n}}
}

type sourceLimit struct {
	net.Listener
	sources source.Counter
}

func (l *sourceLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source.Of(c.RemoteAddr())
		if !l.sources.Take(src) {
			klog.V(2).InfoS("Refused a connection: too many from its source", "addr", l.Addr(), "remote", c.RemoteAddr(), "max", l.sources.Max)
			source.Refuse(c)
			continue
		}
		return &sourceConn{Conn: c, release: func() { l.sources.Release(src) }}, nil
	}
}

type sourceConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *sourceConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
