package daemon

import (
	"net"
	"net/netip"
	"sync"

	"github.com/konnect-dev/konnect/socks"
	"k8s.io/klog/v2"
)

// MaxConnsPerSource bounds the connections one source address (socks.SourceOf) may hold
// open at once to a health, metrics or admin endpoint. Those endpoints need no credentials and, once bound
// beyond loopback, anyone may open connections to them; the timeouts above bound how long each lives, this
// how many one peer holds. Probes and scrapers use a few.
const MaxConnsPerSource = 128

// LimitPerSource returns ln with at most n connections open from one source address at once; beyond, a new
// connection is reset as soon as it is accepted.
func LimitPerSource(ln net.Listener, n int) net.Listener {
	return &sourceLimit{Listener: ln, max: n, open: map[netip.Addr]int{}}
}

type sourceLimit struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[netip.Addr]int
}

func (l *sourceLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := socks.SourceOf(c.RemoteAddr())
		l.mu.Lock()
		full := l.open[src] >= l.max
		if !full {
			l.open[src]++
		}
		l.mu.Unlock()
		if full {
			klog.V(2).InfoS("Refused a connection: too many from its source", "addr", l.Addr(), "remote", c.RemoteAddr(), "max", l.max)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		return &sourceConn{Conn: c, release: func() { l.release(src) }}, nil
	}
}

func (l *sourceLimit) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[src]--; l.open[src] <= 0 {
		delete(l.open, src)
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
