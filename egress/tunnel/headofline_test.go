package tunnel

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/agent"
	"github.com/konnect-dev/konnect/test/harness"
)

// startKonnectAgentWith runs konnect's agent in-process, with tune applied to its Config.
func startKonnectAgentWith(t testing.TB, e *env, id string, port int, tune func(*agent.Config)) {
	t.Helper()
	cfg := agent.Config{
		Servers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, CAFile: e.ca.file, CertFile: e.agentCert, KeyFile: e.agentKey,
		AgentID: id, SyncInterval: 100 * time.Millisecond, SyncIntervalCap: 500 * time.Millisecond, GracefulTimeout: time.Second,
	}
	if tune != nil {
		tune(&cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("konnect agent: %v", err)
	}
	harness.RunDaemon(t, time.Second, a.Run)
}

// pace is how fast a pacedReader reads: 0 pauses it, a positive value is bytes per second, and a negative
// one is as fast as it can.
type pace struct{ v atomic.Int64 }

// pacedReader reads r at the pace p sets, 8 KiB at a time.
type pacedReader struct {
	r io.Reader
	p *pace
}

func (s pacedReader) Read(b []byte) (int, error) {
	for s.p.v.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	rate := s.p.v.Load()
	if rate < 0 {
		return s.r.Read(b)
	}
	n, err := s.r.Read(b[:min(len(b), 8<<10)])
	time.Sleep(time.Duration(float64(time.Second) * float64(n) / float64(rate)))
	return n, err
}

// pacedSink accepts one connection at a time and reads it at the pace p sets, counting the bytes.
func pacedSink(t *testing.T, p *pace) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(countingWriter{&got}, pacedReader{c, p})
			c.Close()
		}
	}()
	return ln.Addr().String(), &got
}

type countingWriter struct{ n *atomic.Int64 }

func (w countingWriter) Write(b []byte) (int, error) { w.n.Add(int64(len(b))); return len(b), nil }

// TestNoHeadOfLineBlocking: readers that stop, then read slowly, and an upload to a backend that does the
// same, share one agent with quick requests, and the quick requests keep their pace: each takes
// milliseconds, and the bound is a second. Each slow transfer is larger than everything kube-apiserver's
// client and the server would buffer for it, so without per-connection flow control a slow reader holds
// the stream that every connection of the agent shares for as long as it keeps reading (ANP issue 180),
// and the quick requests time out. At the end the slow transfers speed up, and every byte arrives.
func TestNoHeadOfLineBlocking(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			const (
				slowBytes = 64 << 20 // each slow transfer
				readers   = 3
			)
			e := newEnv(t)
			cfg := e.config(mode)
			cfg.ClusterCA = e.ca.file
			// A slow reader is not cut off while it reads, whichever way the tunnel treats it.
			cfg.StallTimeout = time.Minute
			s := start(t, cfg)
			startKonnectAgentWith(t, e, "agent-1", s.agentPort(), func(c *agent.Config) { c.StallTimeout = time.Minute })
			s.waitAgents(t, 1)
			var p pace // every slow party's pace: paused now
			web := startHTTPBackend(t)
			sink, sunk := pacedSink(t, &p)
			f := s.frontend(mode)

			var wg sync.WaitGroup
			errs := make(chan error, readers+1)
			for i := range readers {
				c := dial(t, f, web)
				defer c.Close()
				req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/bytes?n=%d", web, slowBytes), nil)
				if err := req.Write(c); err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = c.SetReadDeadline(time.Now().Add(3 * time.Minute))
					res, err := http.ReadResponse(bufio.NewReaderSize(pacedReader{c, &p}, 64<<10), req)
					if err != nil {
						errs <- fmt.Errorf("slow reader %d: %w", i, err)
						return
					}
					body, err := io.ReadAll(res.Body)
					if err != nil || len(body) != slowBytes {
						errs <- fmt.Errorf("slow reader %d: %d of %d bytes: %v", i, len(body), slowBytes, err)
						return
					}
					for j := range body {
						if body[j] != pattern(int64(j)) {
							errs <- fmt.Errorf("slow reader %d: byte %d is wrong", i, j)
							return
						}
					}
				}()
			}
			// The upload stays open until the sink has it all: kube-apiserver's client gives a closing tunnel
			// only 10 s to deliver what it still holds.
			up := dial(t, f, sink)
			defer up.Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = up.SetWriteDeadline(time.Now().Add(3 * time.Minute))
				if _, err := up.Write(make([]byte, slowBytes)); err != nil {
					errs <- fmt.Errorf("slow upload: %w", err)
				}
			}()
			time.Sleep(2 * time.Second) // the slow transfers fill whatever they may hold
			p.v.Store(256 << 10)        // and now make progress, slowly

			var took []time.Duration
			for i := 0; i < 20; i++ {
				began := time.Now()
				done := make(chan struct{})
				go func() {
					defer close(done)
					c := dial(t, f, web)
					defer c.Close()
					if res, body := httpGet(t, c, web, "/"); res.StatusCode != 200 || len(body) == 0 {
						t.Errorf("quick request %d: %s", i, res.Status)
					}
				}()
				select {
				case <-done:
				case <-time.After(time.Second):
					p.v.Store(-1)
					t.Fatalf("quick request %d waited a second behind the slow transfers", i)
				}
				took = append(took, time.Since(began))
				time.Sleep(100 * time.Millisecond)
			}
			slices.Sort(took)
			t.Logf("quick requests beside %d slow readers and a slow upload: p50 %v, max %v", readers, took[len(took)/2], took[len(took)-1])

			p.v.Store(-1)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			harness.EventuallyTrue(t, 30*time.Second, "the slow backend has every uploaded byte", func() bool {
				return sunk.Load() == slowBytes
			})
		})
	}
}

// TestPausedReaderKeepsItsConnection: under flow control a reader that stops reading for longer than the
// stall timeout holds only its own window, so it is not cut off, and when it reads again every byte is there.
func TestPausedReaderKeepsItsConnection(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterCA = e.ca.file
	cfg.StallTimeout = 500 * time.Millisecond
	s := start(t, cfg)
	startKonnectAgentWith(t, e, "agent-1", s.agentPort(), func(c *agent.Config) { c.StallTimeout = 500 * time.Millisecond })
	s.waitAgents(t, 1)
	web := startHTTPBackend(t)
	f := s.frontend("grpc")
	var p pace
	c := dial(t, f, web)
	defer c.Close()
	const n = 64 << 20
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/bytes?n=%d", web, n), nil)
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(3 * time.Second) // six stall timeouts
		p.v.Store(-1)
	}()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	res, err := http.ReadResponse(bufio.NewReader(pacedReader{c, &p}), req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil || len(body) != n {
		t.Fatalf("%d of %d bytes: %v", len(body), n, err)
	}
	checkPattern(t, body, 0)
	if v := counterValue(s.metrics.stalledClosed); v != 0 {
		t.Fatalf("%v connections cut off as stalled", v)
	}
}
