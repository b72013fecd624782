package daemon

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// haveIPv6Loopback skips the test where ::1 cannot be bound.
func haveIPv6Loopback(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT) {
		t.Skip("no IPv6 loopback here")
	}
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

// TestListenLocalhostBindsBothLoopbacks: "localhost" is served on 127.0.0.1 and ::1 on one port, so that no
// other user can take the address a client that resolves localhost to ::1 would reach. A port already held
// on ::1 is refused, naming the flag, where binding 127.0.0.1 alone would leave those clients to its holder.
func TestListenLocalhostBindsBothLoopbacks(t *testing.T) {
	haveIPv6Loopback(t)
	ln, err := Listen("tcp", "localhost:0", false, "-D")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	served := make(chan string, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c)
			served <- string(b)
			c.Close()
		}
	}()
	for _, host := range []string{"127.0.0.1", "::1"} {
		c, err := net.Dial("tcp", net.JoinHostPort(host, port))
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		c.Write([]byte(host))
		c.Close()
		if got := <-served; got != host {
			t.Fatalf("served %q, want %q", got, host)
		}
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "::1"} {
		if c, err := net.Dial("tcp", net.JoinHostPort(host, port)); err == nil {
			c.Close()
			t.Fatalf("%s: still listening after Close", host)
		}
	}

	// Another program holds [::1]:P.
	squatter, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	held := strconv.Itoa(squatter.Addr().(*net.TCPAddr).Port)
	_, err = Listen("tcp", "localhost:"+held, false, "-D")
	if err == nil || !strings.Contains(err.Error(), "-D") || !strings.Contains(err.Error(), "[::1]:"+held) {
		t.Fatalf("Listen on localhost with [::1] held: %v, want an error naming -D and [::1]:%s", err, held)
	}
	if c, err := net.Dial("tcp4", "127.0.0.1:"+held); err == nil {
		c.Close()
		t.Fatal("the refused Listen left 127.0.0.1 bound")
	}
}
