package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/sync/errgroup"
)

func TestTunnelHTTPGet(t *testing.T) {
	_, srv, ra := agentOnServer(t, nil)

	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return srv.dial(ctx, addr) }}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+ln.Addr().String()+"/through-the-tunnel", nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello /through-the-tunnel" {
		t.Fatalf("body %q", body)
	}
	if n, known := ra.Connected(); n != 1 || known != 1 {
		t.Fatalf("Connected() = %d, %d; want 1, 1", n, known)
	}
	tr.CloseIdleConnections()
	harness.EventuallyTrue(t, 5*time.Second, "connection closed on the agent", func() bool { return ra.OpenConnections() == 0 })
}

// roundTrip writes size random bytes through c while reading the echo back, and checks them.
func roundTrip(t testing.TB, c net.Conn, size int, chunk int) {
	t.Helper()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	var g errgroup.Group
	g.Go(func() error {
		for off := 0; off < size; off += chunk {
			end := min(off+chunk, size)
			if _, err := c.Write(data[off:end]); err != nil {
				return fmt.Errorf("write at %d: %w", off, err)
			}
		}
		return nil
	})
	got := sha256.New()
	g.Go(func() error {
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		n, err := io.CopyN(got, c, int64(size))
		if err != nil {
			return fmt.Errorf("read after %d bytes: %w", n, err)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if !bytes.Equal(got.Sum(nil), want[:]) {
		t.Fatal("echoed data differs")
	}
}

func TestTunnelBulkBothWays(t *testing.T) {
	pki := newTestPKI(t)
	// The frontend takes large messages so that the 16 MiB single write below reaches the agent as one
	// DATA message: the agent must accept it (gRPC's default limit is 4 MiB).
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca, bigFrames: true})
	startAgent(t, pki.config(srv.agentAddr))
	srv.waitBackends(t, 1)
	echo := harness.StartEcho(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, tc := range []struct {
		name        string
		size, chunk int
	}{
		{"64MiB in 256KiB writes", 64 << 20, 256 << 10},
		{"16MiB single write", 16 << 20, 16 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := srv.dial(ctx, echo.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			roundTrip(t, c, tc.size, tc.chunk)
		})
	}
}

func TestTunnel100Concurrent(t *testing.T) {
	_, srv, ra := agentOnServer(t, nil)
	echo := harness.StartEcho(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var g errgroup.Group
	for i := range 100 {
		g.Go(func() error {
			c, err := srv.dial(ctx, echo.Addr)
			if err != nil {
				return fmt.Errorf("conn %d: %w", i, err)
			}
			defer c.Close()
			msg := []byte(fmt.Sprintf("hello from %d", i))
			if _, err := c.Write(msg); err != nil {
				return err
			}
			buf := make([]byte, len(msg))
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(c, buf); err != nil {
				return fmt.Errorf("conn %d: %w", i, err)
			}
			if !bytes.Equal(buf, msg) {
				return fmt.Errorf("conn %d: got %q", i, buf)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := echo.Accepted.Load(); got != 100 {
		t.Fatalf("backend accepted %d connections, want 100", got)
	}
	harness.EventuallyTrue(t, 10*time.Second, "all connections closed on the agent", func() bool { return ra.OpenConnections() == 0 })
}

func TestDialErrors(t *testing.T) {
	_, srv, _ := agentOnServer(t, func(c *Config) { c.DialTimeout = 500 * time.Millisecond })

	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()

	for _, tc := range []struct {
		name, addr, want string
		within           time.Duration
	}{
		{"refused", refusedAddr, "dial tcp " + refusedAddr + ": connect: connection refused", 2 * time.Second},
		{"timeout", harness.FullBacklogListener(t), "i/o timeout", 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			c, err := srv.dial(ctx, tc.addr)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if el := time.Since(start); el > tc.within {
				t.Fatalf("took %v, want under %v", el, tc.within)
			}
		})
	}
}

func TestNoAgent(t *testing.T) {
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := srv.dial(ctx, "127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "No agent available") {
		t.Fatalf("dial without an agent: %v, want \"No agent available\"", err)
	}
}

func TestAllowDestination(t *testing.T) {
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	allowed, denied := harness.StartEcho(t), harness.StartEcho(t)
	_, port, _ := net.SplitHostPort(allowed.Addr)
	d, err := ParseDestination("127.0.0.0/8:" + port)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pki.config(srv.agentAddr)
	cfg.Allow = AllowList{d}
	startAgent(t, cfg)
	srv.waitBackends(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := srv.dial(ctx, allowed.Addr)
	if err != nil {
		t.Fatalf("allowed destination: %v", err)
	}
	roundTrip(t, c, 1000, 1000)
	c.Close()

	for _, addr := range []string{denied.Addr, "localhost:" + strings.Split(denied.Addr, ":")[1]} {
		_, err = srv.dial(ctx, addr)
		if err == nil || !strings.Contains(err.Error(), "not in --allow-destination") {
			t.Fatalf("dial %s: %v; want a refusal naming --allow-destination", addr, err)
		}
	}
	if n := denied.Accepted.Load(); n != 0 {
		t.Fatalf("refused destination saw %d connections", n)
	}
}

// TestServerFirstBackend: backends that speak first (SSH, SMTP, database banners) send data right after the
// dial. konnectivity-client drops DATA that arrives before its dialing goroutine has registered the
// connection; the agent holds the first DATA back briefly so that the banner is not lost.
func TestServerFirstBackend(t *testing.T) {
	_, srv, _ := agentOnServer(t, nil)
	banner := []byte("SSH-2.0-konnect-test\r\n")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write(banner)
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 30 {
		c, err := srv.dial(ctx, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(banner))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, banner) {
			t.Fatalf("tunnel %d: banner %q, %v", i, buf, err)
		}
		c.Close()
	}
}

// TestCloseWritesQueuedData: data the client wrote before it closed reaches the backend whole. The backend
// reads nothing for a while, so most of it still waits in the agent's queue when the server's CLOSE_REQ
// comes; the agent writes it out before it closes the backend (upstream's proxy-agent closes at once and
// drops it).
func TestCloseWritesQueuedData(t *testing.T) {
	_, srv, _ := agentOnServer(t, nil)
	const total, chunk = 8_000_000, 1_000_000
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		time.Sleep(500 * time.Millisecond)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := srv.dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, chunk)
	for range total / chunk {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	select {
	case n := <-got:
		if n != total {
			t.Fatalf("the backend read %d of the %d bytes written before the close", n, total)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the backend saw no end within 30s")
	}
}

// TestCloseFlushIsBounded: what the agent still holds for a backend when the client closes is written for
// closeFlushTimeout at most. The backend never reads, and far more is queued for it than its socket
// buffers take; the agent must give up at the bound, close the backend connection (the backend then reads
// what the kernel had taken, and the end) and answer the close. konnectivity-client's Close returns when
// that answer comes, or after its own 10 s without one.
func TestCloseFlushIsBounded(t *testing.T) {
	if closeFlushTimeout != 5*time.Second {
		t.Errorf("closeFlushTimeout is %s; docs/architecture.md gives the bound as 5 s", closeFlushTimeout)
	}
	_, srv, _ := agentOnServer(t, func(cfg *Config) {
		// The queue takes everything at once, so that neither the stall cut-off nor waiting for space plays
		// a part: only the bound ends the flush.
		cfg.ConnectionBuffer = 128 << 20
		cfg.StallTimeout = time.Minute
	})
	const total, chunk = 32 << 20, 1 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := srv.dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	backend, ok := <-accepted
	if !ok {
		t.Fatal("the backend accepted no connection")
	}
	defer backend.Close()
	buf := make([]byte, chunk)
	for range total / chunk {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	err = c.Close()
	took := time.Since(start)
	t.Logf("Close returned after %s: %v", took.Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("Close: %v (no close answer from the agent)", err)
	}
	// The agent's clock starts when the close reaches it, after Close began.
	if took < closeFlushTimeout || took > closeFlushTimeout+3*time.Second {
		t.Errorf("the agent answered the close after %s, want the flush bound %s (plus at most 3 s)", took.Round(time.Millisecond), closeFlushTimeout)
	}
	_ = backend.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, backend)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the backend read %d bytes, then nothing more for 10 s: its connection was not closed", n)
	}
	if n >= total {
		t.Fatalf("the backend read all %d bytes: the flush was not cut off", n)
	}
	t.Logf("the backend read %d of %d bytes, then the end (%v)", n, total, err)
}
