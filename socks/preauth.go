package socks

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/pki/source"
	"github.com/konnect-dev/konnect/socks/internal/localproxy"
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
// again, and keep its users out. While the bound in all is reached, a source that holds fewer than another
// takes that one's oldest connection's place (makeRoom). Sources together still could fill their half again
// and again, so a source whose connections keep running out their handshake time is kept out for a while
// (penalties). It also takes each connection's slot of MaxConns (limit), so that every connection it counts
// holds one: the slot is taken, or handed over by the connection it displaces, under mu with the count.
type preAuth struct {
	penalties source.Penalties
	maxTotal  int
	perSource int
	limit     *localproxy.ConnLimit

	mu      sync.Mutex
	total   int
	seq     uint64                    // admissions so far: orders connections by age
	sources map[netip.Addr]*list.List // each source's counted connections (*preAuthConn), oldest first
}

// newPreAuth bounds the unauthenticated connections at maxTotal in all and perSource from each source. The
// penalties scale with the handshake timeout as OpenSSH's do with its LoginGraceTime (grace-exceeded 10 s,
// min 15 s, max 600 s at 10 s): one connection that lapses costs its source nothing, two in a row keep it
// out for a few seconds, and a source that lets its whole share lapse is kept out for 60 handshake
// timeouts. limit is the server's MaxConns.
func newPreAuth(maxTotal, perSource int, handshake time.Duration, limit *localproxy.ConnLimit) *preAuth {
	return &preAuth{
		penalties: source.Penalties{Per: handshake, Threshold: handshake * 3 / 2, Max: 60 * handshake},
		maxTotal:  maxTotal,
		perSource: perSource,
		limit:     limit,
		sources:   map[netip.Addr]*list.List{},
	}
}

// why names what keeps a refused source out.
type why string

const (
	atBound   why = "too many unauthenticated connections from its source"
	full      why = "too many unauthenticated connections"
	penalized why = "its source's connections kept running out their handshake time"
	// overCap: every slot of MaxConns is taken. The server answers it in its protocol (Server.refuse).
	overCap why = "too many connections"
)

// admit counts c in all and against its source, and gives it a slot of MaxConns, or reports why it is
// refused; one refused as overCap is not counted, as it waits for no handshake. When it made room for c by
// closing another source's connection, it returns that connection's remote address, and c has that
// connection's slot. The connection counts until its handshake is over, it closes, or it makes room for
// another; one that closes unauthenticated past its handshake deadline penalizes its source. Once the
// server is done with the connection it calls releaseSlot.
func (p *preAuth) admit(c net.Conn) (_ net.Conn, refused why, evicted net.Addr) {
	src := source.Of(c.RemoteAddr())
	if p.penalties.Refused(src, time.Now()) {
		return c, penalized, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	held := p.sources[src]
	n := 0
	if held != nil {
		n = held.Len()
	}
	if p.perSource > 0 && n >= p.perSource {
		return c, atBound, nil
	}
	if p.total >= p.maxTotal {
		victim := p.makeRoom(n)
		if victim == nil {
			return c, full, nil
		}
		evicted = victim.RemoteAddr()
		p.uncount(victim)
		// c takes victim's slot of MaxConns, which victim holds as it is counted, so that c gets in
		// while every slot is taken, half of them by connections that never authenticate, without
		// waiting for victim's goroutine to free it: that goroutine's releaseSlot frees nothing. It is
		// safe: victim is reset (linger 0) below, while p.mu is held, so a handshake that ends meanwhile
		// (release, which waits for p.mu) finds its connection closed already, and its goroutine ends at
		// its next read or write (one whose request was just read may still dial before its reply
		// fails). Until then, the goroutines serving connections exceed MaxConns by the victims still
		// unwinding. Its Close finds the connection uncounted and does not count a lapse, as the source
		// did not let it run out its time.
		victim.slotGiven = true
		source.Refuse(victim.Conn)
	} else if !p.limit.TryAcquire() {
		// Taken under p.mu with the count, as Serve may run on several listeners at once: no connection
		// is counted, and so can be displaced, without a slot to hand over.
		return c, overCap, nil
	}
	if held == nil {
		held = list.New()
		p.sources[src] = held
	}
	p.seq++
	pc := &preAuthConn{Conn: c, p: p, src: src, seq: p.seq}
	pc.elem = held.PushBack(pc)
	p.total++
	return pc, "", evicted
}

// makeRoom is the one rule for a connection that finds every unauthenticated slot taken, from a source that
// holds n of them: it takes the place of the oldest connection of the source that holds the most, if that is
// more than n; otherwise (n is the most, or ties it) it is refused, and makeRoom returns nil. Of sources that
// tie for the most, the one whose oldest connection is older gives way. So a client's first connection always
// gets a handshake slot, and its next ones while another source holds more, however many peers without the
// password hold the rest; those peers only displace each other. OpenSSH's MaxStartups refuses new connections
// at random past its start and all of them when full, a client's as likely as a peer's; this is fairer, and
// deterministic. It looks at every source that holds a connection, at most maxTotal of them, and only while
// all slots are taken. Callers hold p.mu.
func (p *preAuth) makeRoom(n int) *preAuthConn {
	var top *list.List
	oldest := func(l *list.List) *preAuthConn { return l.Front().Value.(*preAuthConn) }
	for _, held := range p.sources {
		if top == nil || held.Len() > top.Len() || held.Len() == top.Len() && oldest(held).seq < oldest(top).seq {
			top = held
		}
	}
	if top == nil || top.Len() <= n {
		return nil
	}
	return oldest(top)
}

// uncount stops counting c, once, and reports whether this call did. Callers hold p.mu.
func (p *preAuth) uncount(c *preAuthConn) bool {
	if c.elem == nil {
		return false
	}
	held := p.sources[c.src]
	held.Remove(c.elem)
	c.elem = nil
	if held.Len() == 0 {
		delete(p.sources, c.src)
	}
	p.total--
	return true
}

// release stops counting c, once, and reports whether this call did.
func (p *preAuth) release(c *preAuthConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.uncount(c)
}

// releaseSlot frees c's slot of MaxConns once the server is done with c, unless c gave it to the connection
// that took its place. c is uncounted by then (its Close came first), so no admit can give it away later.
func (p *preAuth) releaseSlot(c *preAuthConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !c.slotGiven {
		p.limit.Release()
	}
}

// preAuthConn is a connection counted by preAuth. Its handshake is over where the server lifts the
// handshake's read deadline (SetReadDeadline with the zero time): after the credentials were checked and
// the request read, in every protocol.
type preAuthConn struct {
	net.Conn
	p    *preAuth
	src  netip.Addr
	seq  uint64        // its admission's, set once
	elem *list.Element // in p.sources[src] while counted; guarded by p.mu
	// slotGiven: its slot of MaxConns went to the connection that took its place; guarded by p.mu.
	slotGiven bool
	once      sync.Once

	mu       sync.Mutex
	deadline time.Time // the handshake's, set by the server's first read deadline
}

func (c *preAuthConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() {
		c.once.Do(func() { c.p.release(c) })
	} else {
		c.mu.Lock()
		if c.deadline.IsZero() {
			c.deadline = t
		}
		c.mu.Unlock()
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *preAuthConn) Close() error {
	c.once.Do(func() {
		// Not counted any more: it made room for another source's connection, which is no lapse.
		if !c.p.release(c) {
			return
		}
		c.mu.Lock()
		lapsed := !c.deadline.IsZero() && !time.Now().Before(c.deadline)
		c.mu.Unlock()
		if lapsed {
			c.p.penalties.Add(c.src, time.Now())
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
