// Package source is the one home of the bounds on connections per source that konnect's listeners share
// (the agent port of `konnect server`, `konnect socks` with credentials, the health, metrics and admin
// endpoints): what a connection's source is, a count of open connections per source with a bound, penalties
// for sources that keep running out their handshake time, and how a connection past them is refused. It imports nothing of Kubernetes or of konnect's products, so that any
// listener can use it. What a listener counts, and when a connection stops counting, stay the listener's.
package source

import (
	"cmp"
	"net"
	"net/netip"
	"sync"
	"time"
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

// Penalties keeps out, for a while, the sources whose connections keep running out their handshake time
// without authenticating, as OpenSSH's PerSourcePenalties do. A per-source Counter alone leaves a listener
// that others can reach to a handful of sources: each holds its share of connections for a handshake
// timeout, and again, and together they hold every slot. Each such connection adds Per to its source's
// penalty, up to Max; a source is refused while its penalty exceeds Threshold, so that a client that lets
// one connection lapse now and then (a browser's speculative connection to its proxy) is not. The zero
// Penalties refuses nothing; it is safe for concurrent use.
type Penalties struct {
	Per, Threshold, Max time.Duration // set before the first Add
	// MaxSources bounds the sources remembered (0: DefaultPenaltySources). Past it a new source goes
	// unpenalized until one expires: refusing every unknown source instead would let the same peers keep
	// everyone out.
	MaxSources int

	mu    sync.Mutex
	until map[netip.Addr]time.Time
}

// DefaultPenaltySources is the default of Penalties.MaxSources, OpenSSH's for each address family.
const DefaultPenaltySources = 65536

// Add penalizes src for a connection that ran out its handshake time at now, and reports whether src is
// now refused.
func (p *Penalties) Add(src netip.Addr, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.until[src]
	if !ok {
		if p.until == nil {
			p.until = map[netip.Addr]time.Time{}
		}
		if max := cmp.Or(p.MaxSources, DefaultPenaltySources); len(p.until) >= max {
			for s, u := range p.until {
				if !u.After(now) {
					delete(p.until, s)
				}
			}
			if len(p.until) >= max {
				return false
			}
		}
	}
	until = later(until, now).Add(p.Per)
	if limit := now.Add(p.Max); until.After(limit) {
		until = limit
	}
	p.until[src] = until
	return until.Sub(now) > p.Threshold
}

// Refused reports whether src's penalty keeps it out at now. A penalty that has run out is forgotten.
func (p *Penalties) Refused(src netip.Addr, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.until[src]
	if !ok {
		return false
	}
	if !until.After(now) {
		delete(p.until, src)
		return false
	}
	return until.Sub(now) > p.Threshold
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
