package socks

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/source"
	"github.com/konnect-dev/konnect/socks/internal/localproxy"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/proxy"
)

// closedAtOnce reports whether the server closed or reset c without waiting for its handshake.
func closedAtOnce(c net.Conn) bool { return !harness.OpenAfter(c, 300*time.Millisecond) }

// TestUnauthenticatedPerSource: with credentials (a proxy others can reach), one source address may hold at
// most MaxUnauthenticatedPerSource connections that have not authenticated; more are reset at once, so
// that a peer without the password cannot take every slot of MaxConns. Clients that authenticated do not
// count, and other sources are served.
func TestUnauthenticatedPerSource(t *testing.T) {
	up := sink(t)
	s := &Server{Credentials: &Credentials{User: "alice", Password: "pw"}, MaxUnauthenticatedPerSource: 4, MaxConns: 100}
	addr := serve(t, s, Auto)
	auth := &proxy.Auth{User: "alice", Password: "pw"}
	d, _ := proxy.SOCKS5("tcp", addr, auth, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// Two authenticated tunnels from 127.0.0.1 do not count.
	for range 2 {
		c, err := d.Dial("tcp", up.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for range 4 {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if c, err := harness.DialFrom("127.0.0.1", addr); err == nil {
		defer c.Close()
		if !closedAtOnce(c) {
			t.Fatal("a fifth unauthenticated connection from one source was kept")
		}
	}
	if closedAtOnce(held[2]) {
		t.Fatal("a connection within the bound was closed")
	}
	other, _ := proxy.SOCKS5("tcp", addr, auth, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}})
	c, err := other.Dial("tcp", up.Addr().String())
	if err != nil {
		t.Fatalf("another source: %v", err)
	}
	c.Close()
	// Once the silent ones go, the source authenticates again.
	for _, c := range held[2:] {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := d.Dial("tcp", up.Addr().String())
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source is not served again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLapsedHandshakesKeepSourceOut: a source whose unauthenticated connections run out their handshake
// time is kept out for a while, so that a few sources, each at its per-source bound, cannot hold every slot
// again and again. One lapse costs nothing; the source's connections are reset while its penalty lasts,
// other sources are served meanwhile, and the source is served again after it.
func TestLapsedHandshakesKeepSourceOut(t *testing.T) {
	up := sink(t)
	const handshake = 500 * time.Millisecond
	s := &Server{Credentials: &Credentials{User: "alice", Password: "pw"}, MaxUnauthenticatedPerSource: 4,
		MaxConns: 100, HandshakeTimeout: handshake}
	addr := serve(t, s, Auto)
	auth := &proxy.Auth{User: "alice", Password: "pw"}
	from := func(ip string) proxy.Dialer {
		d, _ := proxy.SOCKS5("tcp", addr, auth, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}})
		return d
	}
	// lapse opens n connections from 127.0.0.1 that send nothing, and waits until the server closed them.
	lapse := func(n int) {
		t.Helper()
		var idle []net.Conn
		for range n {
			c, err := harness.DialFrom("127.0.0.1", addr)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, c)
		}
		for _, c := range idle {
			_ = c.SetReadDeadline(time.Now().Add(10 * handshake))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("the server sent something to a client that never spoke")
			}
			c.Close()
		}
	}
	lapse(1)
	c, err := from("127.0.0.1").Dial("tcp", up.Addr().String())
	if err != nil {
		t.Fatalf("one lapsed handshake kept its source out: %v", err)
	}
	c.Close()

	// Four lapses: a penalty of four handshake timeouts, refused while more than 1.5 of them remain.
	lapse(4)
	refusedAt := time.Now()
	if _, err := from("127.0.0.1").Dial("tcp", up.Addr().String()); err == nil {
		t.Fatal("a source whose connections kept running out their handshake time was served")
	}
	if c, err := from("127.0.0.2").Dial("tcp", up.Addr().String()); err != nil {
		t.Fatalf("another source was refused: %v", err)
	} else {
		c.Close()
	}
	harness.EventuallyTrue(t, 10*handshake, "the penalized source is served again", func() bool {
		c, err := from("127.0.0.1").Dial("tcp", up.Addr().String())
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	if kept := time.Since(refusedAt); kept < handshake {
		t.Fatalf("the source was served again %v after its penalty began, want about %v", kept, 5*handshake/2)
	}
}

// openFrom opens n connections from src to addr that send nothing; connections the server resets before
// the dial returns are left out. They are closed when the test ends.
func openFrom(t *testing.T, src, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for range n {
		if c, err := harness.DialFrom(src, addr); err == nil {
			conns = append(conns, c)
			t.Cleanup(func() { c.Close() })
		}
	}
	return conns
}

// stillOpen counts the connections of conns that the server neither closed nor reset within 300 ms.
func stillOpen(conns []net.Conn) int {
	open := make(chan bool, len(conns))
	for _, c := range conns {
		go func() { open <- !closedAtOnce(c) }()
	}
	n := 0
	for range conns {
		if <-open {
			n++
		}
	}
	return n
}

// TestUnauthenticatedSourceLeavesRoomWithFewMaxConns: one source may hold at most a quarter of MaxConns
// unauthenticated, however small MaxConns is next to MaxUnauthenticatedPerSource (64 by default), so that
// an address without the password that opens MaxConns connections and stays silent cannot keep a client
// that authenticates out.
func TestUnauthenticatedSourceLeavesRoomWithFewMaxConns(t *testing.T) {
	for _, maxConns := range []int{MinMaxConnsWithCredentials, 8, 64} {
		t.Run(fmt.Sprint(maxConns), func(t *testing.T) {
			up := sink(t)
			s := &Server{Credentials: &Credentials{User: "alice", Password: "pw"}, MaxConns: maxConns}
			addr := serve(t, s, Auto)
			idle := openFrom(t, "127.0.0.1", addr, maxConns)
			// The server accepts in order, so it has seen every idle connection before this client's.
			d, _ := proxy.SOCKS5("tcp", addr, &proxy.Auth{User: "alice", Password: "pw"},
				&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}})
			c, err := d.Dial("tcp", up.Addr().String())
			if err != nil {
				t.Fatalf("%d unauthenticated connections from one source kept a client that authenticates out: %v", maxConns, err)
			}
			c.Close()
			if n := stillOpen(idle); n != maxConns/4 {
				t.Fatalf("%d of %d unauthenticated connections from one source kept, want a quarter of MaxConns, %d",
					n, maxConns, maxConns/4)
			}
		})
	}
}

// TestUnauthenticatedInAllLeaveHalf: however many sources take part, at most half of MaxConns may be
// unauthenticated at once; past it a new connection is reset, or takes the place of another source's
// (TestUnauthenticatedFullEvictsTopSourcesOldest), so that the other half is left to clients that
// authenticate. Connections that authenticated do not count.
func TestUnauthenticatedInAllLeaveHalf(t *testing.T) {
	up := sink(t)
	s := &Server{Credentials: &Credentials{User: "alice", Password: "pw"}, MaxConns: 8, MaxUnauthenticatedPerSource: 2}
	addr := serve(t, s, Auto)
	auth := &proxy.Auth{User: "alice", Password: "pw"}
	d, _ := proxy.SOCKS5("tcp", addr, auth, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}})
	// Two tunnels authenticated before the others came.
	for range 2 {
		c, err := d.Dial("tcp", up.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// Three sources, each within its bound of two, try six unauthenticated connections.
	var idle []net.Conn
	for _, src := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		idle = append(idle, openFrom(t, src, addr, 2)...)
	}
	if n := stillOpen(idle); n != 4 {
		t.Fatalf("%d unauthenticated connections from three sources kept, want half of MaxConns, 4", n)
	}
	if n := s.ActiveConns(); n != 6 {
		t.Fatalf("%d connections served, want the 2 tunnels and 4 unauthenticated", n)
	}
	// A client authenticates (in a silent connection's place, TestUnauthenticatedFullEvictsTopSourcesOldest)
	// and then does not count, so another source may take that slot unauthenticated; its second connection,
	// from a source that then holds as many as any, is reset.
	tunnel, err := d.Dial("tcp", up.Addr().String())
	if err != nil {
		t.Fatalf("a client beside a full unauthenticated half: %v", err)
	}
	defer tunnel.Close()
	if n := stillOpen(openFrom(t, "127.0.0.4", addr, 2)); n != 1 {
		t.Fatalf("%d of 2 more unauthenticated connections kept beside 3 and an authenticated one, want 1", n)
	}
}

// TestServeRefusesTooFewMaxConnsWithCredentials: below MinMaxConnsWithCredentials, half of MaxConns leaves
// a source no unauthenticated connection, and all of it would leave none to clients that authenticate, so
// Serve fails rather than serve without the bound.
func TestServeRefusesTooFewMaxConnsWithCredentials(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Server{Credentials: &Credentials{User: "alice", Password: "pw"}, MaxConns: MinMaxConnsWithCredentials - 1}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background(), ln, Auto) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "MaxConns 3") {
			t.Fatalf("Serve = %v, want an error naming MaxConns", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve served with MaxConns 3 and credentials")
	}
}

// unauthenticated reports how many connections s counts as unauthenticated, and from how many sources.
func unauthenticated(s *Server) (conns, sources int) {
	s.init()
	s.preAuth.mu.Lock()
	defer s.preAuth.mu.Unlock()
	return s.preAuth.total, len(s.preAuth.sources)
}

// TestUnauthenticatedFullEvictsTopSourcesOldest: while the unauthenticated half of MaxConns is full, a new
// connection from a source that holds fewer of it than another source takes the place of that source's
// oldest connection, which is reset; one from a source that holds as many as any is reset, as before. So a
// client from a fresh address authenticates at once however many silent connections hold the half, and
// the peers that hold it only displace each other. The evicted handshakes end, and the counts stay exact.
func TestUnauthenticatedFullEvictsTopSourcesOldest(t *testing.T) {
	up := sink(t)
	// Half of 16 is 8 unauthenticated in all, at most 4 from one source.
	s := &Server{Credentials: &Credentials{User: "alice", Password: "pw"}, MaxConns: 16,
		MaxUnauthenticatedPerSource: 4, HandshakeTimeout: time.Minute}
	addr := serve(t, s, Auto)
	waitFor := func(conns, sources int) {
		t.Helper()
		what := fmt.Sprintf("%d unauthenticated from %d sources", conns, sources)
		harness.EventuallyTrue(t, 5*time.Second, what, func() bool {
			c, n := unauthenticated(s)
			return c == conns && n == sources
		})
	}
	// The server accepts in order, so each source's connections are admitted oldest first.
	a := openFrom(t, "127.0.0.1", addr, 3)
	b := openFrom(t, "127.0.0.2", addr, 3)
	c := openFrom(t, "127.0.0.3", addr, 2)
	waitFor(8, 3)

	// 127.0.0.1 holds 3, as many as any source, and below its bound of 4: reset.
	if late := openFrom(t, "127.0.0.1", addr, 1); len(late) == 1 && !closedAtOnce(late[0]) {
		t.Fatal("a connection from a source that holds the most of a full unauthenticated half was kept")
	}
	if n := stillOpen(slices.Concat(a, b, c)); n != 8 {
		t.Fatalf("%d of 8 unauthenticated connections kept after a refusal, want 8", n)
	}

	// 127.0.0.3 holds 2, fewer: its new connection takes the place of the oldest of 127.0.0.1's and
	// 127.0.0.2's, which hold 3 each: 127.0.0.1's first.
	c = append(c, openFrom(t, "127.0.0.3", addr, 1)...)
	if len(c) != 3 || closedAtOnce(c[2]) {
		t.Fatal("a connection from a source that holds fewer than another was not kept")
	}
	if !closedAtOnce(a[0]) {
		t.Fatal("the oldest connection of the source that holds the most was not closed")
	}
	if n := stillOpen(slices.Concat(a[1:], b, c)); n != 8 {
		t.Fatalf("%d of the other 8 unauthenticated connections kept, want 8", n)
	}
	waitFor(8, 3)

	// A client from a fresh address authenticates and gets its tunnel at once; 127.0.0.2's first
	// connection gives way (127.0.0.2 and 127.0.0.3 hold 3 each; 127.0.0.2's oldest is older).
	d, _ := proxy.SOCKS5("tcp", addr, &proxy.Auth{User: "alice", Password: "pw"},
		&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}})
	tunnel, err := d.Dial("tcp", up.Addr().String())
	if err != nil {
		t.Fatalf("a client from a fresh address while the unauthenticated half is full: %v", err)
	}
	if _, err := tunnel.Write([]byte("through")); err != nil {
		t.Fatal(err)
	}
	if !closedAtOnce(b[0]) {
		t.Fatal("the oldest connection of the sources that hold the most was not closed for a client")
	}
	if n := stillOpen(slices.Concat(a[1:], b[1:], c)); n != 7 {
		t.Fatalf("%d of the other 7 unauthenticated connections kept, want 7", n)
	}
	// The tunnel no longer counts; the evicted connections' handshakes ended and freed their slots of
	// MaxConns.
	waitFor(7, 3)
	harness.EventuallyTrue(t, 5*time.Second, "7 silent connections and a tunnel served", func() bool {
		return s.ActiveConns() == 8
	})
	if closedAtOnce(tunnel) {
		t.Fatal("the tunnel closed")
	}

	// Once everything closes, nothing is counted, and a full half can be taken again without evictions.
	tunnel.Close()
	for _, c := range slices.Concat(a, b, c) {
		c.Close()
	}
	waitFor(0, 0)
	harness.EventuallyTrue(t, 5*time.Second, "no connection served", func() bool { return s.ActiveConns() == 0 })
	again := slices.Concat(openFrom(t, "127.0.0.5", addr, 4), openFrom(t, "127.0.0.6", addr, 4))
	if n := stillOpen(again); n != 8 {
		t.Fatalf("%d of 8 unauthenticated connections kept after all closed, want 8", n)
	}
	waitFor(8, 2)
}

// addrConn is a connection from a remote address of the test's choosing.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// TestEvictionCountsOnce: connections that make room for others, end their handshakes and close, all at
// once (as from several listeners served at once), are each counted and released exactly once, and an
// evicted one is no lapse that penalizes its source; and each slot of MaxConns, taken or handed over by an
// evicted connection, is freed exactly once.
func TestEvictionCountsOnce(t *testing.T) {
	p := newPreAuth(8, 4, time.Nanosecond, localproxy.NewConnLimit(12))
	var wg sync.WaitGroup
	var evictions atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				server, client := net.Pipe()
				defer client.Close()
				ip := net.IPv4(10, 0, 0, byte(1+(g+i)%5))
				c, refused, evicted := p.admit(addrConn{server, &net.TCPAddr{IP: ip, Port: 1}})
				if refused != "" {
					c.Close()
					continue
				}
				if evicted != nil {
					evictions.Add(1)
				}
				// As the server's goroutine does once it is done with the connection.
				done := func() {
					c.Close()
					p.releaseSlot(c.(*preAuthConn))
				}
				// Each admitted connection starts its handshake, then ends it, closes, or is left open
				// for others to evict.
				_ = c.SetReadDeadline(time.Now().Add(time.Hour))
				switch i % 3 {
				case 0:
					_ = c.SetReadDeadline(time.Time{})
					done()
				case 1:
					done()
				default:
					defer done()
				}
			}
		}()
	}
	wg.Wait()
	if evictions.Load() == 0 {
		t.Fatal("no connection made room for another: the test tries nothing")
	}
	if p.total != 0 || len(p.sources) != 0 {
		t.Fatalf("%d unauthenticated connections from %d sources counted after all closed, want none",
			p.total, len(p.sources))
	}
	if n := p.limit.Active(); n != 0 {
		t.Fatalf("%d slots of MaxConns taken after all closed, want none", n)
	}
}

// TestEvictedIsNoLapse: a connection closed to make room for another source's is closed at once, and does
// not count against its source as one that ran out its handshake time, even past its deadline: its source
// did not let it lapse. Two lapses in a row would keep the source out.
func TestEvictedIsNoLapse(t *testing.T) {
	p := newPreAuth(2, 2, time.Second, localproxy.NewConnLimit(4))
	from := func(ip byte) (net.Conn, net.Conn) {
		t.Helper()
		server, client := net.Pipe()
		t.Cleanup(func() { client.Close() })
		c, refused, _ := p.admit(addrConn{server, &net.TCPAddr{IP: net.IPv4(10, 0, 0, ip), Port: 1}})
		if refused != "" {
			t.Fatalf("a connection from 10.0.0.%d refused: %s", ip, refused)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(-time.Second)) // its handshake time ran out already
		return c, client
	}
	a1, a1client := from(1)
	a2, _ := from(1)
	from(2) // takes a1's place
	from(3) // 10.0.0.1 and 10.0.0.2 hold one each; a2 is the older: takes its place
	if p.total != 2 || p.sources[source.Of(&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)})] != nil {
		t.Fatalf("%d unauthenticated connections counted, %v from 10.0.0.1, want 2 and none", p.total,
			p.sources[source.Of(&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)})])
	}
	if _, err := a1client.Read(make([]byte, 1)); err == nil {
		t.Fatal("an evicted connection was not closed")
	}
	a1.Close()
	a2.Close()
	if p.penalties.Refused(netip.AddrFrom4([4]byte{10, 0, 0, 1}), time.Now()) {
		t.Fatal("a source was penalized for connections that made room for others")
	}
}

// TestEvictionHandsOverItsSlot: with every one of MaxConns taken, half by authenticated tunnels and half by
// connections that never authenticate, a client from a fresh address still gets its tunnel: the connection
// it displaces gives it its slot of MaxConns too, not only its place among the unauthenticated.
func TestEvictionHandsOverItsSlot(t *testing.T) {
	up := sink(t)
	// Half of 8 is 4 unauthenticated in all, at most 2 from one source; 4 tunnels take the other half.
	s := eightSlots()
	addr := serve(t, s, Auto)
	dial := aliceFrom(addr, up.Addr().String())
	tunnelsFrom(t, dial, "127.0.0.8", 4)
	idle := slices.Concat(openFrom(t, "127.0.0.1", addr, 2), openFrom(t, "127.0.0.2", addr, 2))
	harness.EventuallyTrue(t, 5*time.Second, "4 unauthenticated and 4 tunnels", func() bool {
		c, _ := unauthenticated(s)
		return c == 4 && s.limit.Active() == 8
	})
	tunnel, err := dial("127.0.0.9")
	if err != nil {
		t.Fatalf("a client from a fresh address while every slot is taken, half unauthenticated: %v", err)
	}
	defer tunnel.Close()
	if _, err := tunnel.Write([]byte("through")); err != nil {
		t.Fatal(err)
	}
	if n := stillOpen(idle); n != 3 {
		t.Fatalf("%d of 4 unauthenticated connections kept, want 3: one made room", n)
	}
}

// lateListener accepts connections whose reads, from the addresses late, block once the connection has
// failed until freed is closed: their goroutines see them closed late, and end late.
type lateListener struct {
	net.Listener
	late  []string
	freed chan struct{}
}

func (l lateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil && slices.Contains(l.late, c.RemoteAddr().(*net.TCPAddr).IP.String()) {
		c = lateConn{c, l.freed}
	}
	return c, err
}

type lateConn struct {
	net.Conn
	freed chan struct{}
}

func (c lateConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		<-c.freed
	}
	return n, err
}

// TestEvictedSlotIsTakenAtOnce: with every slot of MaxConns taken, half by connections that never
// authenticate, a connection that displaces one whose goroutine ends late takes that one's slot at once,
// and the listener goes on accepting: a client that arrives next displaces another such connection and gets
// its tunnel at once, in that connection's slot.
func TestEvictedSlotIsTakenAtOnce(t *testing.T) {
	up := sink(t)
	// Half of 8 is 4 unauthenticated in all, at most 2 from one source; 4 tunnels take the other half.
	s := eightSlots()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freed := make(chan struct{})
	free := sync.OnceFunc(func() { close(freed) })
	addr := serveOn(t, s, lateListener{ln, []string{"127.0.0.1", "127.0.0.2"}, freed}, Auto)
	t.Cleanup(free) // before Serve's cleanup waits for the connections' goroutines
	dial := aliceFrom(addr, up.Addr().String())
	tunnelsFrom(t, dial, "127.0.0.8", 4)
	// 127.0.0.1's are the older: the first newcomer displaces the first of them, the next 127.0.0.2's
	// first, which then holds the most.
	a := openFrom(t, "127.0.0.1", addr, 2)
	harness.EventuallyTrue(t, 5*time.Second, "2 unauthenticated", func() bool { c, _ := unauthenticated(s); return c == 2 })
	b := openFrom(t, "127.0.0.2", addr, 2)
	harness.EventuallyTrue(t, 5*time.Second, "4 unauthenticated and 4 tunnels", func() bool {
		c, _ := unauthenticated(s)
		return c == 4 && s.ActiveConns() == 8
	})

	start := time.Now()
	newcomer := openFrom(t, "127.0.0.9", addr, 1)
	tunnel, err := dial("127.0.0.3")
	if err != nil {
		t.Fatalf("a client while displaced connections' goroutines have not ended: %v", err)
	}
	defer tunnel.Close()
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("a client got its tunnel %v after it dialed, while displaced connections' goroutines had not ended", took)
	}
	if _, err := tunnel.Write([]byte("through")); err != nil {
		t.Fatal(err)
	}
	if !closedAtOnce(a[0]) || !closedAtOnce(b[0]) {
		t.Fatal("the newcomers did not displace the oldest connections of the sources that held the most")
	}
	if n := stillOpen(slices.Concat(newcomer, a[1:], b[1:])); n != 3 {
		t.Fatalf("%d of 3 unauthenticated connections kept, want 3", n)
	}
	// 4 tunnels, the newcomer and the client in the displaced connections' slots, 2 unauthenticated.
	if n := s.ActiveConns(); n != 8 {
		t.Fatalf("ActiveConns = %d, want 8", n)
	}
	free()
}

// TestEvictionsLeakNoSlot: with the unauthenticated half of MaxConns full, 200 newcomers from fresh
// addresses displace its connections, every tenth a client that gets its tunnel, 100 of them while every
// slot is taken and 100 while one is free; once every client has closed, no slot is taken, and MaxConns
// clients get their tunnels again, and no more.
func TestEvictionsLeakNoSlot(t *testing.T) {
	up := sink(t)
	// Half of 8 is 4 unauthenticated in all, at most 2 from one source.
	s := eightSlots()
	addr := serve(t, s, Auto)
	dial := aliceFrom(addr, up.Addr().String())
	conns := tunnelsFrom(t, dial, "127.0.0.8", 4)
	conns = append(conns, openFrom(t, "127.0.0.1", addr, 2)...)
	conns = append(conns, openFrom(t, "127.0.0.2", addr, 2)...)
	harness.EventuallyTrue(t, 5*time.Second, "4 unauthenticated and 4 tunnels", func() bool {
		c, _ := unauthenticated(s)
		return c == 4 && s.ActiveConns() == 8
	})
	tunnels := 4
	for i := range 200 {
		if i == 100 {
			// The other 100 displace connections while a slot is free too.
			conns[0].Close()
			tunnels--
			harness.EventuallyTrue(t, 5*time.Second, "a tunnel's slot freed", func() bool { return s.ActiveConns() == tunnels+3 })
		}
		from := fmt.Sprintf("127.0.%d.%d", 1+i/100, 1+i%100)
		if i%10 != 9 {
			conns = append(conns, openFrom(t, from, addr, 1)...)
			continue
		}
		tunnel, err := dial(from)
		if err != nil {
			t.Fatalf("client %d from a fresh address while the unauthenticated half is full: %v", i, err)
		}
		if _, err := tunnel.Write([]byte("through")); err != nil {
			t.Fatal(err)
		}
		tunnel.Close()
		// Once its goroutine ends, the next newcomer takes its slot without displacing another.
		harness.EventuallyTrue(t, 5*time.Second, "the tunnel's slot freed", func() bool { return s.ActiveConns() == tunnels+3 })
	}
	// The last newcomer was a client: the one it displaced left 3.
	if c, _ := unauthenticated(s); c != 3 {
		t.Fatalf("%d unauthenticated after the newcomers, want 3", c)
	}

	for _, c := range conns {
		c.Close()
	}
	harness.EventuallyTrue(t, 5*time.Second, "no connection served or counted", func() bool {
		c, _ := unauthenticated(s)
		return c == 0 && s.ActiveConns() == 0
	})
	// A slot freed twice, or one taken late, shows here: the 8th client or the 9th is not as it should be.
	for i := range 8 {
		tunnel, err := dial("127.0.0.9")
		if err != nil {
			t.Fatalf("client %d of MaxConns after every client closed: %v", i+1, err)
		}
		defer tunnel.Close()
	}
	if n := s.ActiveConns(); n != 8 {
		t.Fatalf("ActiveConns = %d with MaxConns tunnels, want 8", n)
	}
	if tunnel, err := dial("127.0.0.9"); err == nil {
		tunnel.Close()
		t.Fatal("a client past MaxConns got its tunnel")
	}
}

// TestOverCapIsNotCounted: a connection refused because every slot of MaxConns is taken is not counted
// as unauthenticated while its refusal is answered, so a newcomer does not displace it (it would get no
// slot from it) and is refused at once, as over the cap.
func TestOverCapIsNotCounted(t *testing.T) {
	up := sink(t)
	s := eightSlots()
	addr := serve(t, s, Auto)
	dial := aliceFrom(addr, up.Addr().String())
	tunnelsFrom(t, dial, "127.0.0.8", 8)
	// Refused as over the cap; silent, so their refusals wait up to 2 s for a first byte.
	silent := slices.Concat(openFrom(t, "127.0.0.1", addr, 2), openFrom(t, "127.0.0.2", addr, 2))
	start := time.Now()
	if tunnel, err := dial("127.0.0.3"); err == nil {
		tunnel.Close()
		t.Fatal("a client past MaxConns got its tunnel")
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("a client past MaxConns was refused %v after it dialed, want at once", took)
	}
	// The server accepts in order: the silent ones were refused before the client.
	if c, _ := unauthenticated(s); c != 0 {
		t.Fatalf("%d unauthenticated counted while only refusals are answered, want 0", c)
	}
	if n := stillOpen(silent); n != 4 {
		t.Fatalf("%d of 4 connections being refused left open, want 4: none displaced", n)
	}
}

// aliceFrom dials target through the SOCKS5 server at addr as alice, from the loopback address from, giving
// up after 5 s: a slot freed twice locks the accept loop, which should fail a test, not hang it.
func aliceFrom(addr, target string) func(from string) (net.Conn, error) {
	return func(from string) (net.Conn, error) {
		d, _ := proxy.SOCKS5("tcp", addr, &proxy.Auth{User: "alice", Password: "pw"},
			&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return d.(proxy.ContextDialer).DialContext(ctx, "tcp", target)
	}
}

// eightSlots is a server that asks for alice's password and serves 8 connections: of them, 4 unauthenticated
// in all and 2 from one source.
func eightSlots() *Server {
	return &Server{Credentials: &Credentials{User: "alice", Password: "pw"}, MaxConns: 8,
		MaxUnauthenticatedPerSource: 64, HandshakeTimeout: time.Minute}
}

// tunnelsFrom opens n tunnels with dial from the loopback address from, closed when the test ends.
func tunnelsFrom(t *testing.T, dial func(from string) (net.Conn, error), from string, n int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range n {
		c, err := dial(from)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		out = append(out, c)
	}
	return out
}
