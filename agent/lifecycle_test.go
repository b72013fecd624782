package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	"go.uber.org/goleak"
)

// echoOnce checks that a fresh tunnel through srv reaches echo.
func echoOnce(t testing.TB, srv *upstreamServer, echo *harness.Server) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := srv.dial(ctx, echo.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	return nil
}

func TestAgentRestart(t *testing.T) {
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	echo := harness.StartEcho(t)
	for i := range 2 {
		ra := startAgent(t, pki.config(srv.agentAddr))
		srv.waitBackends(t, 1)
		if err := echoOnce(t, srv, echo); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if err := ra.Stop(t); err != nil {
			t.Fatal(err)
		}
		harness.EventuallyTrue(t, 10*time.Second, "server saw the agent go", func() bool { return srv.backends() == 0 })
	}
}

func TestServerRestart(t *testing.T) {
	echo := harness.StartEcho(t)
	pki, srv, ra := agentOnServer(t, nil)
	if err := echoOnce(t, srv, echo); err != nil {
		t.Fatal(err)
	}
	srv.stop()
	harness.EventuallyTrue(t, 10*time.Second, "agent noticed", func() bool { n, _ := ra.Connected(); return n == 0 })
	// Down for a while: the agent keeps retrying with backoff and records why it fails.
	harness.EventuallyTrue(t, 10*time.Second, "a recorded connect error", func() bool {
		st := ra.Status()
		return len(st) == 1 && st[0].LastError != ""
	})
	st := ra.Status()
	if len(st) != 1 || st[0].Connected || st[0].LastError == "" {
		t.Fatalf("status while the server is down: %+v", st)
	}
	srv2 := startUpstreamServer(t, serverOpts{id: "s1-restarted", ca: pki.ca, addr: srv.agentAddr})
	srv2.waitBackends(t, 1)
	if err := echoOnce(t, srv2, echo); err != nil {
		t.Fatal(err)
	}
	if st := ra.Status(); st[0].ServerID != "s1-restarted" || st[0].LastError != "" {
		t.Fatalf("status after reconnect: %+v", st)
	}
}

func readyErr(ra *runningAgent, name string) error {
	for _, c := range append(ra.ReadyChecks(), ra.AllServersConnected()) {
		if c.Name() == name {
			return c.Check(nil)
		}
	}
	panic("no readiness check " + name)
}

// notReady is the first of the agent's /readyz checks that fails, or nil.
func notReady(ra *runningAgent) error {
	for _, c := range ra.ReadyChecks() {
		if err := c.Check(nil); err != nil {
			return fmt.Errorf("%s: %w", c.Name(), err)
		}
	}
	return nil
}

// TestInitialSync: a new agent is ready once it has reached every server it knows of, or, with one out of
// reach, once its initial-sync grace has passed: a DaemonSet rollout then keeps the agent it replaces until
// the new one serves as many servers, without stalling for a server that no agent reaches.
func TestInitialSync(t *testing.T) {
	pki := newTestPKI(t)
	s1 := startUpstreamServer(t, serverOpts{id: "s1", count: 2, ca: pki.ca})
	s2 := startUpstreamServer(t, serverOpts{id: "s2", count: 2, ca: pki.ca})
	ra := startAgent(t, pki.config(s1.agentAddr, s2.agentAddr))
	harness.EventuallyTrue(t, 10*time.Second, "agent ready with both servers", func() bool { return notReady(ra) == nil })
	if n, _ := ra.Connected(); n != 2 {
		t.Fatalf("ready with %d of 2 servers before its grace", n)
	}

	const grace = 2 * time.Second
	cfg := pki.config(s1.agentAddr, "127.0.0.1:1") // nothing listens on port 1
	cfg.AgentID, cfg.InitialSyncGrace = "agent-2", grace
	began := time.Now()
	ra2 := startAgent(t, cfg)
	harness.EventuallyTrue(t, 10*time.Second, "agent-2 on s1", func() bool { n, _ := ra2.Connected(); return n == 1 })
	if err := notReady(ra2); time.Since(began) < grace && (err == nil || !strings.Contains(err.Error(), "initial-sync")) {
		t.Fatalf("a new agent with one of two servers, within its grace: %v, want initial-sync failing", err)
	}
	harness.EventuallyTrue(t, 10*time.Second, "agent-2 ready after its grace", func() bool { return notReady(ra2) == nil })
	if waited := time.Since(began); waited < grace {
		t.Fatalf("ready %v after the start, before its %v grace", waited, grace)
	}
}

// gate is a StartGate that opens when its channel is closed.
// gate is a StartGate that the test opens; waited is closed once Run waits on it.
type gate struct {
	open, waited chan struct{}
	once         sync.Once
}

func newGate() *gate { return &gate{open: make(chan struct{}), waited: make(chan struct{})} }

func (g *gate) WaitForSync(ctx context.Context) error {
	g.once.Do(func() { close(g.waited) })
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) Waiting() string { return "waiting for the gate" }

func TestInitialSyncWaitsForStartAfter(t *testing.T) {
	pki := newTestPKI(t)
	s1 := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	cfg := pki.config(s1.agentAddr)
	g := newGate()
	cfg.StartAfter = g
	ra := startAgent(t, cfg)
	select {
	case <-g.waited:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not wait on StartAfter")
	}
	if err := notReady(ra); err == nil || err.Error() != "initial-sync: waiting for the gate" {
		t.Fatalf("waiting for StartAfter: %v, want initial-sync: waiting for the gate", err)
	}
	if s1.backends() != 0 {
		t.Fatal("the agent connected before StartAfter let it")
	}
	close(g.open)
	s1.waitBackends(t, 1)
	harness.EventuallyTrue(t, 10*time.Second, "agent ready", func() bool { return notReady(ra) == nil })
}

func TestTwoServersOneAgent(t *testing.T) {
	pki := newTestPKI(t)
	s1 := startUpstreamServer(t, serverOpts{id: "s1", count: 2, ca: pki.ca})
	s2 := startUpstreamServer(t, serverOpts{id: "s2", count: 2, ca: pki.ca})
	echo := harness.StartEcho(t)
	ra := startAgent(t, pki.config(s1.agentAddr, s2.agentAddr))
	harness.EventuallyTrue(t, 10*time.Second, "agent on both servers", func() bool { return s1.backends() == 1 && s2.backends() == 1 })
	for _, s := range []*upstreamServer{s1, s2} {
		if err := echoOnce(t, s, echo); err != nil {
			t.Fatalf("through %s: %v", s.id, err)
		}
	}
	if err := readyErr(ra, "all-servers-connected"); err != nil {
		t.Fatal(err)
	}

	// s2 goes away: the agent still counts it, and reports it missing until it is back, while it stays
	// ready, as upstream's: one server down must not take the agents of every node out of service.
	addr2 := s2.agentAddr
	s2.stop()
	harness.EventuallyTrue(t, 10*time.Second, "agent noticed s2 is gone", func() bool { n, _ := ra.Connected(); return n == 1 })
	if n, known := ra.Connected(); known != 2 {
		t.Fatalf("known servers %d (connected %d), want 2", known, n)
	}
	// Upstream's deprecated failure count, which alerts still use, counts the lost stream.
	if n := counterValue(ra.m.serverFailures.WithLabelValues("from_server")); n != 1 {
		t.Errorf("konnectivity_network_proxy_agent_server_connection_failure_count{direction=\"from_server\"} = %v, want 1", n)
	}
	err := readyErr(ra, "all-servers-connected")
	if err == nil || !strings.Contains(err.Error(), "connected to 1 of 2 servers") || !strings.Contains(err.Error(), addr2) {
		t.Fatalf("readiness with s2 down: %v", err)
	}
	if err := notReady(ra); err != nil {
		t.Fatalf("not ready with s1 up: %v", err)
	}
	if err := echoOnce(t, s1, echo); err != nil {
		t.Fatal(err)
	}

	s2b := startUpstreamServer(t, serverOpts{id: "s2", count: 2, ca: pki.ca, addr: addr2})
	// The server counts the stream before the agent has read its headers: wait for both ends.
	harness.EventuallyTrue(t, 10*time.Second, "agent back on s2", func() bool {
		n, _ := ra.Connected()
		return s2b.backends() == 1 && n == 2
	})
	if n, known := ra.Connected(); n != 2 || known != 2 {
		t.Fatalf("Connected() = %d, %d after s2 came back", n, known)
	}
	if err := readyErr(ra, "all-servers-connected"); err != nil {
		t.Fatal(err)
	}
	if err := echoOnce(t, s2b, echo); err != nil {
		t.Fatal(err)
	}
}

// tcpBalancer forwards each new connection to the next backend in turn, like a layer-4 load balancer.
func tcpBalancer(t *testing.T, backends ...string) string {
	return tcpForwarder(t, "127.0.0.1:0", backends...)
}

func tcpForwarder(t *testing.T, listen string, backends ...string) string {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backends[i%len(backends)])
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(b, c); b.Close() }()
			go func() { defer wg.Done(); io.Copy(c, b); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func TestLoadBalancedAddress(t *testing.T) {
	for _, tc := range []struct {
		name        string
		count       int  // what the servers report
		syncForever bool // --sync-forever
		want        int  // servers the agent ends up on
	}{
		{"servers report two", 2, false, 2},
		{"servers report one, sync forever", 1, true, 2},
		{"servers report one", 1, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pki := newTestPKI(t)
			s1 := startUpstreamServer(t, serverOpts{id: "s1", count: tc.count, ca: pki.ca})
			s2 := startUpstreamServer(t, serverOpts{id: "s2", count: tc.count, ca: pki.ca})
			lb := tcpBalancer(t, s1.agentAddr, s2.agentAddr)
			cfg := pki.config(lb)
			cfg.SyncForever = tc.syncForever
			ra := startAgent(t, cfg)
			// One address, but more servers behind it: the agent dials again until it has them all.
			harness.EventuallyTrue(t, 10*time.Second, "agent on the servers behind one address", func() bool {
				return s1.backends()+s2.backends() == tc.want
			})
			// ... and keeps no duplicate or extra streams open.
			time.Sleep(300 * time.Millisecond)
			if got := s1.backends() + s2.backends(); got != tc.want {
				t.Fatalf("agent on %d servers, want %d", got, tc.want)
			}
			if n, _ := ra.Connected(); n != tc.want {
				t.Fatalf("Connected() = %d, want %d", n, tc.want)
			}
		})
	}
}

// TestLoadBalancerSharedByAgents: agents that retry behind one round-robin balancer in a fixed rhythm reach
// the same server every time (three agents, three servers: each retry lands where that agent already is),
// unless the retries are spread in time. Each agent must still reach every server.
func TestLoadBalancerSharedByAgents(t *testing.T) {
	pki := newTestPKI(t)
	var backends []string
	var servers []*upstreamServer
	for _, id := range []string{"s1", "s2", "s3"} {
		s := startUpstreamServer(t, serverOpts{id: id, count: 3, ca: pki.ca})
		servers = append(servers, s)
		backends = append(backends, s.agentAddr)
	}
	lb := tcpBalancer(t, backends...)
	var agents []*runningAgent
	for i := range 3 {
		cfg := pki.config(lb)
		cfg.AgentID = fmt.Sprintf("agent-%d", i)
		agents = append(agents, startAgent(t, cfg))
		// Distinct phases within the sync interval, as agents started on different nodes have.
		time.Sleep(cfg.SyncInterval / 3)
	}
	harness.EventuallyTrue(t, 20*time.Second, "every agent on all three servers", func() bool {
		for _, ra := range agents {
			if n, _ := ra.Connected(); n != 3 {
				return false
			}
		}
		return true
	})
	for _, s := range servers {
		if got := s.backends(); got != 3 {
			t.Fatalf("server has %d agents, want 3", got)
		}
	}
}

func TestDrain(t *testing.T) {
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	echo := harness.StartEcho(t)
	cfg := pki.config(srv.agentAddr)
	cfg.GracefulTimeout = 5 * time.Second
	ra := startAgent(t, cfg)
	other := pki.config(srv.agentAddr)
	other.AgentID = "agent-2"
	rb := startAgent(t, other)
	srv.waitBackends(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Open a connection through the agent that is about to drain.
	var open net.Conn
	harness.EventuallyTrue(t, 5*time.Second, "a connection through agent-1", func() bool {
		c, err := srv.dial(ctx, echo.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if ra.OpenConnections() == 1 {
			open = c
			return true
		}
		c.Close()
		return false
	})

	stopped := make(chan error, 1)
	start := time.Now()
	go func() { stopped <- ra.Stop(t) }()
	harness.EventuallyTrue(t, 5*time.Second, "agent-1 draining", func() bool { return ra.draining.Load() })
	// The server heard DRAIN: every new tunnel goes to agent-2.
	before := rb.OpenConnections()
	for range 20 {
		c, err := srv.dial(ctx, echo.Addr)
		if err != nil {
			t.Fatalf("dial while agent-1 drains: %v", err)
		}
		defer c.Close()
	}
	if got := rb.OpenConnections() - before; got != 20 {
		t.Fatalf("agent-2 got %d of 20 new connections", got)
	}
	// The connection open before the drain keeps working.
	roundTrip(t, open, 1<<20, 64<<10)
	select {
	case <-stopped:
		t.Fatal("Run returned while a connection was still open")
	default:
	}
	open.Close()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(cfg.GracefulTimeout):
		t.Fatal("Run did not return after the last connection closed")
	}
	if el := time.Since(start); el >= cfg.GracefulTimeout {
		t.Fatalf("drain took %v, the whole graceful timeout", el)
	}
}

// TestDrainClosesQuietConnections: in the last quarter of the graceful timeout, a connection that moves no
// byte is closed at once, between two exchanges, instead of being cut at the deadline wherever it is; one
// that keeps moving bytes stays open until the deadline.
func TestDrainClosesQuietConnections(t *testing.T) {
	srv, ra, echo, quiet := tunnelledEcho(t, 6*time.Second)
	defer quiet.Close()
	busy, err := srv.dial(context.Background(), echo.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	roundTrip(t, quiet, 1<<10, 1<<10)

	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- ra.Stop(t) }()
	busyFailed := make(chan time.Duration, 1)
	go func() {
		b := []byte{1}
		for time.Since(start) < 2*ra.cfg.GracefulTimeout {
			if _, err := busy.Write(b); err != nil {
				busyFailed <- time.Since(start)
				return
			}
			if _, err := io.ReadFull(busy, b); err != nil {
				busyFailed <- time.Since(start)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	_ = quiet.SetReadDeadline(time.Now().Add(2 * ra.cfg.GracefulTimeout))
	if _, err := quiet.Read(make([]byte, 1)); err == nil {
		t.Fatal("data on a quiet connection")
	}
	closedAt := time.Since(start)
	lastQuarter := ra.cfg.GracefulTimeout - ra.cfg.GracefulTimeout/4
	if closedAt < lastQuarter-100*time.Millisecond || closedAt > ra.cfg.GracefulTimeout-500*time.Millisecond {
		t.Fatalf("quiet connection closed %v after the stop; want soon after %v, well before the %v deadline", closedAt, lastQuarter, ra.cfg.GracefulTimeout)
	}
	select {
	case at := <-busyFailed:
		t.Fatalf("busy connection closed %v after the stop, before the quiet one (%v)", at, closedAt)
	default:
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	// The busy connection kept Run in its drain until the deadline, and was closed then.
	select {
	case at := <-busyFailed:
		if at < ra.cfg.GracefulTimeout-100*time.Millisecond {
			t.Fatalf("busy connection closed %v after the stop, before the %v deadline", at, ra.cfg.GracefulTimeout)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("busy connection still open after the agent stopped")
	}
}

// TestDrainClosesBetweenRequests: a kept-alive connection that carries a request every 100 ms never rests
// for the drain's usual second; in the last stretch before the deadline it is closed in a gap between two
// requests, not cut at the deadline wherever it is.
func TestDrainClosesBetweenRequests(t *testing.T) {
	_, ra, _, conn := tunnelledEcho(t, 4*time.Second)
	defer conn.Close()
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- ra.Stop(t) }()
	var closedAt time.Duration
	b := []byte{1}
	for closedAt == 0 && time.Since(start) < 2*ra.cfg.GracefulTimeout {
		time.Sleep(100 * time.Millisecond)
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(b); err != nil {
			closedAt = time.Since(start)
		} else if _, err := io.ReadFull(conn, b); err != nil {
			closedAt = time.Since(start)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	quietFor := min(time.Second, ra.cfg.GracefulTimeout/10)
	if closedAt == 0 || closedAt < ra.cfg.GracefulTimeout-quietFor || closedAt > ra.cfg.GracefulTimeout-20*time.Millisecond {
		t.Fatalf("connection closed %v after the stop; want in the last %v before the %v deadline, not at it", closedAt, quietFor, ra.cfg.GracefulTimeout)
	}
}

// TestDrainWaitsForAnAnswer: in the last quarter of the graceful timeout, a kept-alive connection whose
// backend is still working on a request looks quiet, but is not closed before the answer comes.
func TestDrainWaitsForAnAnswer(t *testing.T) {
	const think = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 1)
		for { // one byte in, one byte out after thinking about it, as long as the connection lasts
			if _, err := c.Read(b); err != nil {
				return
			}
			time.Sleep(think)
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	_, srv, ra := agentOnServer(t, func(c *Config) { c.GracefulTimeout = 4 * time.Second })
	conn, err := srv.dial(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- ra.Stop(t) }()
	// A request in the last quarter (from 3 s), after a rest: answered 300 ms later, well before the deadline.
	time.Sleep(ra.cfg.GracefulTimeout - ra.cfg.GracefulTimeout/4 + 100*time.Millisecond - time.Since(start))
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	b := []byte{7}
	if _, err := conn.Write(b); err != nil {
		t.Fatalf("request %v after the stop: %v", time.Since(start), err)
	}
	if _, err := io.ReadFull(conn, b); err != nil {
		t.Fatalf("the answer to a request sent in the last quarter of the graceful timeout was lost: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestDrainingAgentStillDials: upstream's server sends a draining agent a dial only when no other agent
// serves the destination; the agent serves it, as upstream's does, and says on /readyz that it is draining.
func TestDrainingAgentStillDials(t *testing.T) {
	srv, ra, echo, held := tunnelledEcho(t, 5*time.Second)
	go ra.Stop(t)
	harness.EventuallyTrue(t, 5*time.Second, "agent draining", func() bool { return ra.draining.Load() })
	late, err := srv.dial(context.Background(), echo.Addr)
	if err != nil {
		t.Fatalf("dial to a draining agent: %v", err)
	}
	if _, err := late.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(late, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through a draining agent: %q, %v", buf, err)
	}
	if err := readyErr(ra, "shutdown"); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("readiness of a draining agent: %v", err)
	}
	late.Close()
	held.Close()
}

func TestGracefulTimeoutBoundsRun(t *testing.T) {
	_, ra, _, c := tunnelledEcho(t, 300*time.Millisecond)
	defer c.Close()
	start := time.Now()
	if err := ra.Stop(t); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("Run took %v to return with a tunnel open; graceful timeout is %v", el, ra.cfg.GracefulTimeout)
	}
	// The tunnel was closed by the agent.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("tunnel still open after the agent stopped")
	}
}

func TestRunLeavesNothingBehind(t *testing.T) {
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	echo := harness.StartEcho(t)
	// Everything running now (the server, klog, gRPC internals) is not the agent's.
	ignore := goleak.IgnoreCurrent()
	cfg := pki.config(srv.agentAddr)
	cfg.GracefulTimeout = 200 * time.Millisecond
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	srv.waitBackends(t, 1)
	if err := echoOnce(t, srv, echo); err != nil {
		t.Fatal(err)
	}
	held, err := srv.dial(context.Background(), echo.Addr) // left open on purpose
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	held.Close()
	harness.EventuallyTrue(t, 5*time.Second, "server saw the agent go", func() bool { return srv.backends() == 0 })
	// The tunnel client and the server need a moment to unwind their side of the closed tunnel.
	srv.stop()
	goleak.VerifyNone(t, ignore,
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

func TestWrongServerSAN(t *testing.T) {
	for _, tc := range []struct{ name, san, host, want string }{
		{"other IP", "127.0.0.2", "127.0.0.1", "certificate is valid for 127.0.0.2, not 127.0.0.1"},
		{"other name", "other.example", "localhost", "certificate is valid for other.example, not localhost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pki := newTestPKI(t)
			srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca, serverHost: tc.san})
			_, port, _ := net.SplitHostPort(srv.agentAddr)
			ra := startAgent(t, pki.config(net.JoinHostPort(tc.host, port)))
			harness.EventuallyTrue(t, 10*time.Second, "a recorded TLS failure", func() bool {
				for _, st := range ra.Status() {
					if strings.Contains(st.LastError, tc.want) {
						return true
					}
				}
				return false
			})
			if srv.backends() != 0 {
				t.Fatal("agent connected to a server whose certificate does not name it")
			}
		})
	}
}

func TestWrongServerCA(t *testing.T) {
	pki := newTestPKI(t)
	other := pkitest.NewCA(t, "other-ca")
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: other})
	ra := startAgent(t, pki.config(srv.agentAddr))
	harness.EventuallyTrue(t, 10*time.Second, "a recorded TLS failure", func() bool {
		st := ra.Status()
		return len(st) == 1 && strings.Contains(st[0].LastError, "certificate signed by unknown authority")
	})
	if srv.backends() != 0 {
		t.Fatal("agent connected to a server signed by a CA it does not trust")
	}
}

func TestTokenRejectedIsReported(t *testing.T) {
	logs := harness.CaptureKlog(t)
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca, wantToken: "other-token"})
	ra := startAgent(t, pki.config(srv.agentAddr))
	harness.EventuallyTrue(t, 10*time.Second, "the server's refusal recorded", func() bool {
		st := ra.Status()
		return len(st) == 1 && strings.Contains(st[0].LastError, "Unauthenticated") &&
			strings.Contains(st[0].LastError, "bad token")
	})
	// The status is recorded just before the error is logged; wait for the line before stopping, since a
	// stopping agent does not log its own cancelled dials.
	harness.EventuallyTrue(t, 10*time.Second, "the refusal logged", func() bool { return strings.Contains(logs(), "Cannot connect to server") })
	_ = ra.Stop(t)
	// Not at any verbosity: captureLogs turned everything on.
	if out := logs(); strings.Contains(out, "token-1") || !strings.Contains(out, "Cannot connect to server") {
		t.Fatalf("the token appears in the logs, or the failure does not:\n%s", out)
	}
}

func TestHotReloadWithTunnelOpen(t *testing.T) {
	pki := newTestPKI(t)
	// s1 trusts the first CA's client certificates and token-1; s2 (started after the rotation) only the
	// second CA's and token-2. The server certificates are issued by the CA the agent trusts at that time.
	s1 := startUpstreamServer(t, serverOpts{id: "s1", count: 2, ca: pki.ca, clientCA: pki.ca, wantToken: "token-1"})
	// Reserve s2's port now; it starts later.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr2 := l.Addr().String()
	l.Close()
	echo := harness.StartEcho(t)
	ra := startAgent(t, pki.config(s1.agentAddr, addr2))
	harness.EventuallyTrue(t, 10*time.Second, "agent on s1", func() bool { return s1.backends() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open, err := s1.dial(ctx, echo.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	roundTrip(t, open, 64<<10, 64<<10)

	// Rotate everything on disk.
	ca2 := pkitest.NewCA(t, "cluster-ca-2")
	pkitest.WriteFile(t, pki.caFile, ca2.CertPEM)
	agentCert := ca2.Client(t, "konnectivity-agent")
	pkitest.WriteFile(t, pki.certFile, agentCert.CertPEM)
	pkitest.WriteFile(t, pki.keyFile, agentCert.KeyPEM)
	pkitest.WriteFile(t, pki.tokFile, []byte("token-2"))

	s2 := startUpstreamServer(t, serverOpts{id: "s2", count: 2, addr: addr2, ca: ca2, clientCA: ca2, wantToken: "token-2"})
	harness.EventuallyTrue(t, 10*time.Second, "agent on s2 with the new CA, certificate and token", func() bool { return s2.backends() == 1 })
	// The server registers the agent before the agent has recorded the session as connected.
	harness.EventuallyTrue(t, 10*time.Second, "the agent counting both servers", func() bool { n, _ := ra.Connected(); return n == 2 })
	// The tunnel opened before the rotation still works.
	roundTrip(t, open, 1<<20, 64<<10)
	if err := echoOnce(t, s2, echo); err != nil {
		t.Fatal(err)
	}
}

func TestHotReloadKeepsGoodCopyOfBrokenFile(t *testing.T) {
	pki, srv, ra := agentOnServer(t, nil)
	// A half-written CA bundle must not stop reconnects.
	pkitest.WriteFile(t, pki.caFile, []byte("-----BEGIN CERTIFICATE-----\ntruncated"))
	srv.stop()
	harness.EventuallyTrue(t, 10*time.Second, "agent noticed", func() bool { n, _ := ra.Connected(); return n == 0 })
	srv2 := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca, addr: srv.agentAddr})
	harness.EventuallyTrue(t, 10*time.Second, "agent reconnected with the last good CA bundle", func() bool { return srv2.backends() == 1 })
}

func TestHealthEndpointsOverHTTP(t *testing.T) {
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	ra := startAgent(t, pki.config(srv.agentAddr, "127.0.0.1:1"))
	srv.waitBackends(t, 1)
	mux := http.NewServeMux()
	for _, c := range append(ra.ReadyChecks(), ra.AllServersConnected()) {
		mux.HandleFunc("/readyz/"+c.Name(), func(w http.ResponseWriter, r *http.Request) {
			if err := c.Check(r); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
			}
		})
	}
	hs := httptest.NewServer(mux)
	defer hs.Close()
	for path, want := range map[string]int{"/readyz/server-connected": 200, "/readyz/all-servers-connected": 503} {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// tunnelledEcho is the set-up of the drain tests: an echo backend, an agent with graceful timeout d on a
// server, and one connection through both to the backend.
func tunnelledEcho(t *testing.T, d time.Duration) (*upstreamServer, *runningAgent, *harness.Server, net.Conn) {
	t.Helper()
	echo := harness.StartEcho(t)
	_, srv, ra := agentOnServer(t, func(c *Config) { c.GracefulTimeout = d })
	conn, err := srv.dial(context.Background(), echo.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return srv, ra, echo, conn
}
