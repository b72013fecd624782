package harness

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct loopback TCP ports that were free a moment ago, for a program under
// test to bind later.
//
// They come from below the kernel's ephemeral range. A port the kernel handed out for ":0" lies inside
// that range, so the source port of any outgoing connection, this test's or another's, could take it in
// the moment before the program binds it ("address already in use"). Ports below the range are never
// handed out that way. A port this process returned is not returned again.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi := portsBelowEphemeral()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 10*(hi-lo) || hi-lo < 1000 {
			ports = append(ports, kernelPort(t))
			continue
		}
		p := lo + rand.IntN(hi-lo)
		if portsGiven[p] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		portsGiven[p] = true
		ports = append(ports, p)
	}
	return ports
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// portsBelowEphemeral returns [lo, hi): unprivileged ports below the kernel's ephemeral range.
func portsBelowEphemeral() (lo, hi int) {
	lo, hi = 10000, 32768 // the kernel's default range starts at 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	return lo, hi
}

// kernelPort is the fallback when the ephemeral range leaves too little below it.
func kernelPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// ClosedAddr returns a loopback address where nothing listens.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// FullBacklogListener returns the address of a loopback listener whose accept queue is full, so that a
// further connect is never answered: a dial to it times out, without any traffic leaving the machine.
func FullBacklogListener(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the queue with connections that are never accepted.
	for range 4 {
		d := net.Dialer{Timeout: 200 * time.Millisecond}
		if c, err := d.Dial("tcp", addr); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	return addr
}

// Server is a loopback TCP server for tests.
type Server struct {
	Addr     string
	Accepted atomic.Int64 // connections accepted so far
}

// StartEcho runs a Server that echoes every byte back on each connection, until the test ends (see Serve).
func StartEcho(t testing.TB) *Server {
	t.Helper()
	return Serve(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// Serve runs a Server on 127.0.0.1 that serves each connection with handle, on a goroutine of its own, and
// closes the connection when handle returns. When the test ends it closes the listener and every open
// connection, and waits for the handlers.
func Serve(t testing.TB, handle func(net.Conn)) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String()}
	// The accept loop counts in wg too, so that no Add of a connection's goroutine races the cleanup's Wait;
	// closed keeps a connection accepted as the test ends from outliving the cleanup.
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	closed := false
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.Accepted.Add(1)
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			conns[c] = struct{}{}
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				handle(c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

// DialFrom opens a TCP connection to addr from the loopback address src: all of 127.0.0.0/8 is local, so a
// test can play several sources.
func DialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// OpenAfter reports whether c is still open after d: its peer neither closed nor reset it. What the peer
// sends meanwhile is read and dropped.
func OpenAfter(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}
}
