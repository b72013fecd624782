package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"github.com/prometheus/client_golang/prometheus"
)

// reset reports whether the server reset or closed c (rather than waiting for its request).
func reset(c net.Conn) bool { return !harness.OpenAfter(c, 300*time.Millisecond) }

func getFrom(src, addr string) error {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(context.Context, string, string) (net.Conn, error) { return harness.DialFrom(src, addr) }}}
	res, err := c.Get("http://" + addr + "/livez")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != 200 {
		return fmt.Errorf("%s", res.Status)
	}
	return nil
}

// serveHealth serves the health mux as Serve does, and returns the limit it serves through.
func serveHealth(t *testing.T) (addr string, limit *SourceLimit, stop func()) {
	t.Helper()
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	limit = LimitPerSource(ln, MaxConnsPerSource)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveLimited(ctx, limit, NewHealthMux(nil, nil, prometheus.NewRegistry())) }()
	return ln.Addr().String(), limit, func() { cancel(); <-done }
}

// midRequest counts the connections from src that l holds mid-request: the server has read a byte of a
// request on each.
func midRequest(l *SourceLimit, src netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns[src] {
		if c.quietSince.Load() == 0 {
			n++
		}
	}
	return n
}

// closedOf counts the connections of cs that the server has closed or reset: each is read until a deadline
// 300 ms away, all at once.
func closedOf(cs []net.Conn) int {
	var wg sync.WaitGroup
	var closed atomic.Int32
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if reset(c) {
				closed.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(closed.Load())
}

// TestServeEvictsQuietConnectionsAtTheBound: kubelet's probe shares its source (loopback, or the node's
// address) with every other process there, so a process that holds the source's share of connections
// without using them (a scraper that leaks keep-alive connections, a script) must not get the probe
// refused. At the bound a new connection takes the place of the one quiet longest, so that the source still
// holds at most MaxConnsPerSource.
func TestServeEvictsQuietConnectionsAtTheBound(t *testing.T) {
	addr, _, stop := serveHealth(t)
	defer stop()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// The source's share, each an idle keep-alive connection that did one request.
	for range MaxConnsPerSource {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("request on connection %d: %v", len(held), err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || res.Close {
			t.Fatalf("request on connection %d: %s, close %v; want 200 and the connection kept", len(held), res.Status, res.Close)
		}
	}
	// Connections that never send a byte; the server's header timeout (5 s) must not run out before the
	// end of the test, so nothing here waits long.
	const silent = 8
	for i := range silent {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Errorf("connection %d past the bound refused while the source's others are quiet: %v", i+1, err)
			continue
		}
		held = append(held, c)
	}
	if err := getFrom("127.0.0.1", addr); err != nil {
		t.Fatalf("/livez from a source whose connections are all quiet: %v", err)
	}
	// The bound still holds: the silent ones and the probe each took the place of one connection.
	if n := closedOf(held); n != silent+1 {
		t.Fatalf("%d of the %d connections held were closed, want %d", n, len(held), silent+1)
	}
}

// TestServeLimitsConnectionsPerSource: a health, metrics or admin endpoint takes at most MaxConnsPerSource
// connections from one source address at once (each also bounded in time by the timeouts); while all of them
// are mid-request (here each trickles its headers a byte at a time), a new one is reset, while other sources
// are served, and the source is served again once the header timeout closes them.
func TestServeLimitsConnectionsPerSource(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the header timeout")
	}
	addr, limit, stop := serveHealth(t)
	defer stop()

	var held []net.Conn
	trickle := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(trickle)
		for _, c := range held {
			c.Close()
		}
		wg.Wait()
	}()
	const request = "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
	for range MaxConnsPerSource {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < len(request)-1; i++ { // never the last byte
				if _, err := io.WriteString(c, request[i:i+1]); err != nil {
					return
				}
				select {
				case <-trickle:
					return
				case <-tick.C:
				}
			}
		}()
	}
	// Every held connection is mid-request once the server has read its first byte; the header timeout
	// counts from its accept, so this wait must end well before it.
	loopback := netip.MustParseAddr("127.0.0.1")
	if err := harness.Poll("every held connection mid-request", ReadHeaderTimeout/2, 5*time.Millisecond, func() error {
		if n := midRequest(limit, loopback); n != MaxConnsPerSource {
			return fmt.Errorf("%d of %d", n, MaxConnsPerSource)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if c, err := harness.DialFrom("127.0.0.1", addr); err == nil {
		defer c.Close()
		if !reset(c) {
			t.Fatalf("connection %d from one source was kept while the others were mid-request", MaxConnsPerSource+1)
		}
	}
	if err := getFrom("127.0.0.1", addr); err == nil {
		t.Fatal("/livez was served past the bound while every connection of the source was mid-request")
	}
	if n := closedOf(held); n != 0 {
		t.Fatalf("%d connections within the bound, mid-request, were closed", n)
	}
	if err := getFrom("127.0.0.2", addr); err != nil {
		t.Fatalf("another source is not served: %v", err)
	}
	deadline := time.Now().Add(ReadHeaderTimeout + 5*time.Second)
	for err := getFrom("127.0.0.1", addr); err != nil; err = getFrom("127.0.0.1", addr) {
		if time.Now().After(deadline) {
			t.Fatalf("the source is not served again after the header timeout: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if waited := time.Since(start); waited < ReadHeaderTimeout/2 {
		t.Fatalf("the source was served again after %v, before the header timeout (%v) freed a connection", waited, ReadHeaderTimeout)
	}
}
