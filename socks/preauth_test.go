package socks

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

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
// unauthenticated at once; more are reset at once, so that the other half is left to clients that
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
	// A slot of the unauthenticated half frees: a client authenticates in it, and then does not count, so
	// another source may take that slot unauthenticated, and no more.
	idle[0].Close()
	var tunnel net.Conn
	harness.EventuallyTrue(t, 5*time.Second, "a client authenticates", func() bool {
		var err error
		tunnel, err = d.Dial("tcp", up.Addr().String())
		return err == nil
	})
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
