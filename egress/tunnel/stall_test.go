//go:build integration

package tunnel

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestSlowReaderDoesNotStallOthers: connection A has 4 MiB on its way and its reader takes nothing until
// connection B, on the same agent stream, has downloaded 32 MiB. Upstream writes to A on the agent stream's
// only goroutine, so B would wait for A's reader (ANP issue 180) and this test would hang until A's reader
// gives up; here A's queue absorbs A's data, B completes, and A then gets every byte.
func TestSlowReaderDoesNotStallOthers(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			s := start(t, e.config(mode))
			startUpstreamAgent(t, e, "agent-1", s.agentPort())
			s.waitAgents(t, 1)
			web := startHTTPBackend(t)
			f := s.frontend(mode)

			const aSize = 4 << 20
			a := dial(t, f, web)
			defer a.Close()
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/bytes?n=%d", web, aSize), nil)
			if err := req.Write(a); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // A's response is in flight and nobody reads it

			bDone := make(chan error, 1)
			began := time.Now()
			go func() { bDone <- fetch(f, web, 32<<20) }()
			select {
			case err := <-bDone:
				if err != nil {
					t.Fatalf("B: %v", err)
				}
				t.Logf("B downloaded 32 MiB in %v while A's reader was stalled", time.Since(began))
			case <-time.After(30 * time.Second):
				t.Fatal("B stalled behind A's reader")
			}

			_ = a.SetDeadline(time.Now().Add(30 * time.Second))
			res, err := http.ReadResponse(bufio.NewReader(a), req)
			if err != nil {
				t.Fatalf("A: %v", err)
			}
			body, err := io.ReadAll(res.Body)
			if err != nil || len(body) != aSize {
				t.Fatalf("A: %d bytes, %v", len(body), err)
			}
			checkPattern(t, body, 0)
		})
	}
}

// stallServer runs a server in mode with an upstream agent, a per-connection buffer and a stall timeout,
// and a backend.
func stallServer(t *testing.T, mode string, buffer int, stall time.Duration) (*running, string) {
	t.Helper()
	e := newEnv(t)
	cfg := e.config(mode)
	cfg.ConnectionBuffer, cfg.StallTimeout = buffer, stall
	s := start(t, cfg)
	startUpstreamAgent(t, e, "agent-1", s.agentPort())
	s.waitAgents(t, 1)
	return s, startHTTPBackend(t)
}

// TestStalledReaderIsCutOff: a reader that never reads, with more data coming than its buffer holds, is
// closed after the stall timeout, and the other connections on the agent carry on.
func TestStalledReaderIsCutOff(t *testing.T) {
	s, web := stallServer(t, "grpc", 1<<20, time.Second)
	f := s.frontend("grpc")
	before := counterValue(s.metrics.stalledClosed)

	a := dial(t, f, web)
	defer a.Close()
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/bytes?n=%d", web, 1<<30), nil)
	if err := req.Write(a); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	// 4 MiB: enough to cross the 1 MiB buffer, small enough to stay well under the bound with -race on a
	// loaded machine.
	if took := download(t, f, web, 4<<20); took > 5*time.Second {
		t.Errorf("B took %v", took)
	}
	deadline := time.Now().Add(10 * time.Second)
	for counterValue(s.metrics.stalledClosed) == before {
		if time.Now().After(deadline) {
			t.Fatal("stalled reader was not cut off")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A sees its connection end after what was delivered.
	_ = a.SetDeadline(time.Now().Add(20 * time.Second))
	n, err := io.Copy(io.Discard, a)
	if err == nil && n >= 1<<30 {
		t.Fatalf("A got the whole GiB (%d bytes)", n)
	}
	// And a new connection still works.
	download(t, f, web, 1<<20)
}

// TestSlowReaderIsNotCutOff: a reader that keeps taking 640 KB/s is slow, not stalled, although one of the
// queue's batches (up to 1 MiB) takes it more than the stall timeout to read. In gRPC mode the server sees
// the reader only through konnectivity-client's window updates, which can lag the reader by several
// messages (docs/performance.md), so the stall timeout there is 2 s: five of its 256 KiB messages, which
// the reader gets once it has taken the tunnel's first firstBytes (smaller messages) at full speed.
func TestSlowReaderIsNotCutOff(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			stall := map[string]time.Duration{"grpc": 2 * time.Second, "http-connect": time.Second}[mode]
			s, web := stallServer(t, mode, 2<<20, stall)
			before := counterValue(s.metrics.stalledClosed)

			c := dial(t, s.frontend(mode), web)
			defer c.Close()
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/bytes?n=%d", web, 64<<20), nil)
			if err := req.Write(c); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64<<10)
			read := 0
			for read < firstBytes {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, err := io.ReadFull(c, buf)
				read += n
				if err != nil {
					t.Fatalf("after %d bytes: %v", read, err)
				}
			}
			for began := time.Now(); time.Since(began) < 4*stall; {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, err := io.ReadFull(c, buf)
				read += n
				if err != nil {
					t.Fatalf("after %d bytes in %v: %v", read, time.Since(began), err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if n := counterValue(s.metrics.stalledClosed); n != before {
				t.Fatalf("a slow reader was cut off as stalled (%v)", n-before)
			}
		})
	}
}

// TestSteadyReaderOverTCPIsNotCutOff: an HTTP CONNECT client over the mTLS TCP frontend that keeps reading at
// 200 KB/s, behind an upstream agent, is slow, not stalled. The server's write into its socket can block for
// longer than the stall timeout while the reader makes progress: Linux wakes a writer blocked on a full TCP
// send buffer only once about a third of it is free, and the buffer grows to megabytes.
func TestSteadyReaderOverTCPIsNotCutOff(t *testing.T) {
	const stall = time.Second
	e := newEnv(t)
	cfg := e.tcpConfig("http-connect")
	cfg.ConnectionBuffer, cfg.StallTimeout = 256<<10, stall
	s := start(t, cfg)
	startUpstreamAgent(t, e, "agent-1", s.agentPort())
	s.waitAgents(t, 1)
	web := startHTTPBackend(t)
	f := e.tcpFrontend(t, s, "http-connect")
	before := counterValue(s.metrics.stalledClosed)

	c := dial(t, f, web)
	defer c.Close()
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/bytes?n=%d", web, 256<<20), nil)
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16<<10)
	read := 0
	for began := time.Now(); time.Since(began) < 8*stall; {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := io.ReadFull(c, buf)
		read += n
		if err != nil {
			t.Fatalf("after %d bytes in %v: %v", read, time.Since(began), err)
		}
		if n := counterValue(s.metrics.stalledClosed); n != before {
			t.Fatalf("a reader that kept taking 200 KB/s was cut off as stalled after %d bytes", read)
		}
		time.Sleep(80 * time.Millisecond)
	}
}
