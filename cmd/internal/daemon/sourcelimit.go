package daemon

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/pki/source"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// MaxConnsPerSource bounds the connections one source address (source.Of) may hold
// open at once to a health, metrics or admin endpoint. Those endpoints need no credentials and, once bound
// beyond loopback, anyone may open connections to them; the timeouts above bound how long each lives, this
// how many one peer holds. Probes and scrapers use a few. At the bound a new connection takes the place of
// the source's oldest connection that has no request being served (one still sending its headers, or idle
// between requests), so that kubelet's probe, which shares loopback with every process of the node, is
// still served while a leaky scraper holds idle connections or a local process trickles headers on all of
// them; it is refused only while all are being served.
const MaxConnsPerSource = 128

// SourceLimit is a listener that holds at most a bound of connections from one source address at once. A
// new connection past the bound evicts its source's oldest connection that has not delivered a complete
// request: one still sending its request headers (however slowly: each byte would otherwise keep it for up
// to the header timeout), or one between requests of an HTTP keep-alive (which HTTP lets a server close;
// the client retries on a fresh one). A connection whose request is being served is never evicted; only
// when every connection of the source is being served is the new one reset. The server reports when a
// request has been read and when its response is done through ConnState: install that on the http.Server
// that serves the listener.
type SourceLimit struct {
	net.Listener
	sources source.Counter // the bound
	start   time.Time      // origin of sourceConn.waitingSince

	// Evicted and Refused, when set before the first Accept, count the connections closed to make room for
	// a new one from their source and the new ones reset because every connection of their source was
	// being served. Without them the only trace is a line at klog V(2).
	Evicted, Refused prometheus.Counter

	mu      sync.Mutex
	conns   map[netip.Addr]map[*sourceConn]struct{} // what an eviction chooses from
	stopped bool                                    // closeWaiting was called
}

// LimitPerSource returns ln with at most n connections open from one source address at once (see
// SourceLimit); set the server's ConnState to its ConnState.
func LimitPerSource(ln net.Listener, n int) *SourceLimit {
	return &SourceLimit{Listener: ln, sources: source.Counter{Max: n}, start: time.Now(),
		conns: map[netip.Addr]map[*sourceConn]struct{}{}}
}

func (l *SourceLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source.Of(c.RemoteAddr())
		if !l.sources.Take(src) {
			if victim := l.oldestWaiting(src); victim != nil {
				klog.V(2).InfoS("Closed a connection with no request being served for a new one from its source at its bound",
					"addr", l.Addr(), "remote", victim.RemoteAddr(), "max", l.sources.Max)
				inc(l.Evicted)
				victim.Close() // releases its count: Accept is the only taker
			}
			if !l.sources.Take(src) {
				klog.V(2).InfoS("Refused a connection: too many from its source, all being served", "addr", l.Addr(), "remote", c.RemoteAddr(), "max", l.sources.Max)
				inc(l.Refused)
				source.Refuse(c)
				continue
			}
		}
		sc := &sourceConn{Conn: c, l: l, src: src}
		sc.waitingSince.Store(l.now())
		l.mu.Lock()
		if l.stopped {
			l.mu.Unlock()
			sc.Close()
			continue
		}
		set := l.conns[src]
		if set == nil {
			set = map[*sourceConn]struct{}{}
			l.conns[src] = set
		}
		set[sc] = struct{}{}
		l.mu.Unlock()
		return sc, nil
	}
}

// inc adds one to c, if set.
func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}

// closeWaiting closes every connection that has no request being served, and from then on each new one as
// it is accepted. http.Server's Shutdown closes idle connections at once but waits for one that has not sent
// a complete request yet until it is 5 s old, so a connection opened just before a stop (a probe's, a
// scraper's, one trickling its headers) held a daemon's exit for up to ShutdownGrace.
func (l *SourceLimit) closeWaiting() {
	l.mu.Lock()
	l.stopped = true
	var waiting []*sourceConn
	for _, set := range l.conns {
		for c := range set {
			if c.waitingSince.Load() != 0 {
				waiting = append(waiting, c)
			}
		}
	}
	l.mu.Unlock()
	for _, c := range waiting {
		c.Close()
	}
}

// ConnState is the http.Server hook that tells the limit which connections have a request being served:
// from StateActive (the server has read a request's headers; the handler has not started yet) to
// StateIdle.
func (l *SourceLimit) ConnState(c net.Conn, s http.ConnState) {
	sc, ok := c.(*sourceConn)
	if !ok {
		return
	}
	switch s {
	case http.StateIdle:
		sc.waitingSince.Store(l.now())
	case http.StateActive, http.StateHijacked:
		sc.waitingSince.Store(0)
	}
}

// now is the time since start, never 0 (which marks a connection whose request is being served).
func (l *SourceLimit) now() int64 { return int64(time.Since(l.start)) + 1 }

// oldestWaiting returns src's connection that has waited longest for a complete request, or nil when every
// one has a request being served.
func (l *SourceLimit) oldestWaiting(src netip.Addr) *sourceConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found *sourceConn
	var since int64
	for c := range l.conns[src] {
		if t := c.waitingSince.Load(); t != 0 && (found == nil || t < since) {
			found, since = c, t
		}
	}
	return found
}

func (l *SourceLimit) release(c *sourceConn) {
	l.mu.Lock()
	if set := l.conns[c.src]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(l.conns, c.src)
		}
	}
	l.mu.Unlock()
	l.sources.Release(c.src)
}

type sourceConn struct {
	net.Conn
	l    *SourceLimit
	src  netip.Addr
	once sync.Once
	// waitingSince is when the connection was accepted or last went idle between requests (SourceLimit.now),
	// 0 while a request it delivered is being served (ConnState). A request trickled a byte at a time is
	// still waited for: bytes read count for nothing until the headers are complete.
	waitingSince atomic.Int64
}

func (c *sourceConn) Close() error {
	c.once.Do(func() { c.l.release(c) })
	return c.Conn.Close()
}
