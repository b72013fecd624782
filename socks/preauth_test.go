package socks

import (
	"io"
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
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
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
