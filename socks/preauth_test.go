package socks

import (
	"net"
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
