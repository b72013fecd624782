package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/test/harness"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// httpGet sends one HTTP/1.1 request over c and returns the response body.
func httpGet(t testing.TB, c net.Conn, host, path string) (*http.Response, []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, "http://"+host+path, nil)
	if err := req.Write(c); err != nil {
		t.Fatalf("write request: %v", err)
	}
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 256<<10), req)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return res, body
}

func checkPattern(t testing.TB, b []byte, off int64) {
	t.Helper()
	for i := range b {
		if b[i] != pattern(off+int64(i)) {
			t.Fatalf("byte %d: got %d want %d", off+int64(i), b[i], pattern(off+int64(i)))
		}
	}
}

func dial(t testing.TB, f Frontend, addr string) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := f.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("dial %s through %s (%s): %v", addr, f.UDSName, f.Mode, err)
	}
	return c
}

// echoRoundTrip writes n pattern bytes in writes of size chunk (0: one write) and reads them back.
func echoRoundTrip(t testing.TB, c net.Conn, n int64, chunk int) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(120 * time.Second))
	errc := make(chan error, 1)
	go func() {
		if chunk == 0 {
			b := make([]byte, n)
			fill(b, 0)
			_, err := c.Write(b)
			errc <- err
			return
		}
		b := make([]byte, chunk)
		for off := int64(0); off < n; off += int64(chunk) {
			m := min(int64(chunk), n-off)
			fill(b[:m], off)
			if _, err := c.Write(b[:m]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 1<<20)
	var got int64
	for got < n {
		m, err := c.Read(buf[:min(int64(len(buf)), n-got)])
		checkPattern(t, buf[:m], got)
		got += int64(m)
		if err != nil {
			t.Fatalf("read after %d of %d bytes: %v", got, n, err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
}

// TestTunnelUpstreamAgent runs konnect's server with upstream's proxy-agent binary in both frontend modes.
func TestTunnelUpstreamAgent(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			cfg.ClusterCA = e.ca.file // agents authenticate by client certificate
			s := start(t, cfg)
			startUpstreamAgent(t, e, "agent-1", s.agentPort())
			s.waitAgents(t, 1)
			web, echo := startHTTPBackend(t), harness.StartEcho(t).Addr
			f := s.frontend(mode)

			t.Run("get", func(t *testing.T) {
				c := dial(t, f, web)
				defer c.Close()
				res, body := httpGet(t, c, web, "/")
				if res.StatusCode != 200 || string(body) != "hello from backend\n" {
					t.Fatalf("got %s %q", res.Status, body)
				}
			})
			t.Run("single-16MiB-write", func(t *testing.T) {
				c := dial(t, f, echo)
				defer c.Close()
				echoRoundTrip(t, c, 16<<20, 0)
			})
			t.Run("64MiB-both-ways", func(t *testing.T) {
				c := dial(t, f, echo)
				defer c.Close()
				echoRoundTrip(t, c, 64<<20, 256<<10)
			})
			t.Run("64MiB-download", func(t *testing.T) {
				c := dial(t, f, web)
				defer c.Close()
				res, body := httpGet(t, c, web, fmt.Sprintf("/bytes?n=%d", 64<<20))
				if res.StatusCode != 200 || len(body) != 64<<20 {
					t.Fatalf("got %s, %d bytes", res.Status, len(body))
				}
				checkPattern(t, body, 0)
			})
			t.Run("100-concurrent", func(t *testing.T) {
				var wg sync.WaitGroup
				errs := make(chan error, 100)
				for i := range 100 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						c, err := f.Dial(ctx, echo)
						if err != nil {
							errs <- fmt.Errorf("conn %d: dial: %w", i, err)
							return
						}
						defer c.Close()
						_ = c.SetDeadline(time.Now().Add(30 * time.Second))
						msg := []byte(fmt.Sprintf("hello %d %s", i, strings.Repeat("x", 32<<10)))
						if _, err := c.Write(msg); err != nil {
							errs <- fmt.Errorf("conn %d: write: %w", i, err)
							return
						}
						got := make([]byte, len(msg))
						if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
							errs <- fmt.Errorf("conn %d: echo mismatch (%v)", i, err)
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
			})
			t.Run("refused-destination", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				_, err := f.Dial(ctx, harness.ClosedAddr(t))
				if err == nil {
					t.Fatal("dial to a closed port succeeded")
				}
				if time.Since(start) > 3*time.Second {
					t.Errorf("refused dial took %v; want it fast", time.Since(start))
				}
				if !strings.Contains(err.Error(), "connection refused") {
					t.Errorf("error %q does not say connection refused", err)
				}
				if !failedAs(err, false, konnectivity.ErrConnectionRefused) {
					t.Errorf("not a refusal past the server: %v", err)
				}
			})
		})
	}
}

func TestNoAgent(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			s := start(t, e.config(mode))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := s.frontend(mode).Dial(ctx, "127.0.0.1:1")
			if err == nil || !strings.Contains(err.Error(), "No agent available") {
				t.Fatalf("want No agent available, got %v", err)
			}
			if !failedAs(err, false, konnectivity.ErrNoAgent) {
				t.Errorf("not read back as no agent: %v", err)
			}
		})
	}
}

func TestServerGone(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := Frontend{UDSName: dir + "/none.sock"}.Dial(ctx, "127.0.0.1:1")
	if err == nil || !failedAs(err, true, konnectivity.ErrNoSuchFile) {
		t.Fatalf("got %v, want a FrontendError for a missing socket", err)
	}
}

func TestAgentAndServerRestart(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	s := start(t, cfg)
	port := s.agentPort()
	web := startHTTPBackend(t)
	get := func(s *running) {
		t.Helper()
		c := dial(t, s.frontend("grpc"), web)
		defer c.Close()
		if res, _ := httpGet(t, c, web, "/"); res.StatusCode != 200 {
			t.Fatalf("status %s", res.Status)
		}
	}
	a := startUpstreamAgent(t, e, "agent-r", port)
	s.waitAgents(t, 1)
	get(s)

	// Agent restart.
	a.Kill()
	s.waitAgents(t, 0)
	startUpstreamAgent(t, e, "agent-r", port)
	s.waitAgents(t, 1)
	get(s)

	// Server restart on the same socket and agent port; the agent reconnects by itself.
	if err := s.Stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	cfg2 := e.config("grpc")
	cfg2.AgentAddr = fmt.Sprintf("127.0.0.1:%d", port)
	s2 := start(t, cfg2)
	s2.waitAgents(t, 1)
	get(s2)
}

// TestDrain: Run returns within the graceful timeout with a tunnel open (upstream's GracefulStop would wait
// for ever, ANP issue 866), the open tunnel is closed, and readiness fails while draining.
func TestDrain(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			cfg.GracefulTimeout = 1 * time.Second
			s := start(t, cfg)
			startUpstreamAgent(t, e, "agent-d", s.agentPort())
			s.waitAgents(t, 1)
			echo := harness.StartEcho(t).Addr
			c := dial(t, s.frontend(mode), echo)
			defer c.Close()
			echoRoundTrip(t, c, 1024, 0)

			began := time.Now()
			s.Cancel()
			// Readiness turns false at once.
			deadline := time.Now().Add(time.Second)
			for !s.draining.Load() && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			for _, chk := range s.ReadyChecks() {
				if chk.Name() == "shutdown" && chk.Check(nil) == nil {
					t.Error("shutdown check passes while draining")
				}
			}
			if err := s.Stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			took := time.Since(began)
			if took < 900*time.Millisecond || took > 4*time.Second {
				t.Errorf("Run returned after %v; want about the graceful timeout (1s)", took)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Error("tunnel still open after drain")
			}
		})
	}
}

func TestSingleWriteSplitForUpstreamAgent(t *testing.T) {
	// A 16 MiB single write reaches upstream's agent (4 MiB receive limit) as pieces, and the frontend
	// (kube-apiserver's client, 4 MiB receive limit) gets the echo back in pieces too.
	e := newEnv(t)
	s := start(t, e.config("grpc"))
	startUpstreamAgent(t, e, "agent-s", s.agentPort())
	s.waitAgents(t, 1)
	echo := harness.StartEcho(t).Addr
	c := dial(t, s.frontend("grpc"), echo)
	defer c.Close()
	echoRoundTrip(t, c, 16<<20+12345, 0)
}

// TestStopDoesNotWaitForALeaseDeletion: a kube-apiserver that does not answer the deletion of the server's
// Lease holds the exit for leaseDeleteTimeout at most.
func TestStopDoesNotWaitForALeaseDeletion(t *testing.T) {
	client := fake.NewClientset()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	client.PrependReactor("delete", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return true, nil, nil
	})
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.GracefulTimeout = time.Second
	cfg.Leases = &Leases{Namespace: "kube-system", Labels: map[string]string{"k8s-app": "konnectivity-server"}, Client: client}
	s := start(t, cfg)
	began := time.Now()
	if err := s.Stop(t); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > cfg.GracefulTimeout+leaseDeleteTimeout+5*time.Second {
		t.Errorf("Run returned %v after its context ended", took)
	}
}

// failedAs reports whether a Dial error is reason, met while reaching the server (frontend, a
// *FrontendError) or past it. doctor's Reason (cmd/internal/doctorcmd) explains each such pair to operators.
func failedAs(err error, frontend bool, reason error) bool {
	var fe *FrontendError
	return errors.As(err, &fe) == frontend && errors.Is(konnectivity.Classify(err), reason)
}
