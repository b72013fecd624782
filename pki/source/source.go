// Package source is the one home of the bounds on connections per source that konnect's listeners share
// (the agent port of `konnect server`, `konnect socks` with credentials, the health, metrics and admin
// endpoints): what a connection's source is, a count of open connections per source with a bound, and how a
// connection past it is refused. It imports nothing of Kubernetes or of konnect's products, so that any
// listener can use it. What a listener counts, and when a connection stops counting, stay the listener's.
package source

import (
	"net"
	"net/netip"
	"sync"
)

// Of is the source a per-source bound counts a remote address by: the IPv4 address, or the /64 of an IPv6
// address, which one host commonly owns whole. Other addresses (a Unix socket's) count as one.
func Of(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// Counter counts the connections each source holds, up to Max from one source (0: no bound). The zero
// Counter counts without a bound; it is safe for concurrent use.
type Counter struct {
	Max int // set before the first Take

	mu   sync.Mutex
	open map[netip.Addr]int
}

// Take counts one more connection from src, or reports false when src already holds Max.
func (c *Counter) Take(src netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.Max > 0 && c.open[src] >= c.Max {
		return false
	}
	if c.open == nil {
		c.open = map[netip.Addr]int{}
	}
	c.open[src]++
	return true
}

// Release counts one connection from src less; a source that holds none is forgotten.
func (c *Counter) Release(src netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[src]--; c.open[src] <= 0 {
		delete(c.open, src)
	}
}

// Refuse closes a connection past its source's bound with a reset rather than a FIN, so that nothing of it
// lingers on this side (no TIME_WAIT, no lingering send).
func Refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}
