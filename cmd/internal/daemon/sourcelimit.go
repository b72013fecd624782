package daemon

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/pki/source"
	"k8s.io/klog/v2"
)

// MaxConnsPerSource bounds the connections one source address (source.Of) may hold
// open at once to a health, metrics or admin endpoint. Those endpoints need no credentials and, once bound
// beyond loopback, anyone may open connections to them; the timeouts above bound how long each lives, this
// how many one peer holds. Probes and scrapers use a few. At the bound a new connection takes the place of
// the source's connection idle longest, so that kubelet's probe, which shares loopback with every process of
// the node, is still served while a leaky scraper holds idle connections; it is refused only while all are
// mid-request.
const MaxConnsPerSource = 128

// SourceLimit is a listener that holds at most a bound of connections from one source address at once. A
// new connection past the bound evicts its source's connection that has been quiet longest: one that has not
// sent a byte yet, or one between requests of an HTTP keep-alive (which HTTP lets a server close; the client
// retries on a fresh one). Only when every connection of the source is mid-request is the new one reset.
// A connection counts as between requests once the server reports it idle through ConnState: install that
// on the http.Server that serves the listener.
type SourceLimit struct {
	net.Listener
	sources source.Counter // the bound
	start   time.Time      // origin of sourceConn.quietSince

	mu    sync.Mutex
	conns map[netip.Addr]map[*sourceConn]struct{} // what an eviction chooses from
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
			if victim := l.quietest(src); victim != nil {
				klog.V(2).InfoS("Closed a quiet connection for a new one from its source at its bound", "addr", l.Addr(), "remote", victim.RemoteAddr(), "max", l.sources.Max)
				victim.Close() // releases its count: Accept is the only taker
			}
			if !l.sources.Take(src) {
				klog.V(2).InfoS("Refused a connection: too many from its source, all mid-request", "addr", l.Addr(), "remote", c.RemoteAddr(), "max", l.sources.Max)
				source.Refuse(c)
				continue
			}
		}
		sc := &sourceConn{Conn: c, l: l, src: src}
		sc.quietSince.Store(l.now())
		l.mu.Lock()
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

// ConnState is the http.Server hook that tells the limit which connections are between requests.
func (l *SourceLimit) ConnState(c net.Conn, s http.ConnState) {
	sc, ok := c.(*sourceConn)
	if !ok {
		return
	}
	switch s {
	case http.StateIdle:
		sc.quietSince.Store(l.now())
	case http.StateActive, http.StateHijacked:
		sc.quietSince.Store(0)
	}
}

// now is the time since start, never 0 (which marks a connection mid-request).
func (l *SourceLimit) now() int64 { return int64(time.Since(l.start)) + 1 }

// quietest returns src's connection that has been quiet longest, or nil when all are mid-request.
func (l *SourceLimit) quietest(src netip.Addr) *sourceConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found *sourceConn
	var since int64
	for c := range l.conns[src] {
		if t := c.quietSince.Load(); t != 0 && (found == nil || t < since) {
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
	// quietSince is when the connection was accepted or last went idle between requests (SourceLimit.now),
	// 0 from its first byte of a request until the server reports it idle again: a request trickled a byte
	// at a time is not quiet, and its ReadHeaderTimeout frees it.
	quietSince atomic.Int64
}

func (c *sourceConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.quietSince.Load() != 0 {
		c.quietSince.Store(0)
	}
	return n, err
}

func (c *sourceConn) Close() error {
	c.once.Do(func() { c.l.release(c) })
	return c.Conn.Close()
}
