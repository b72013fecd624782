package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/test/harness"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server"
	"sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// upstreamTimeoutText is upstream proxy-server's dial timeout error, which konnect's keeps so that tools
// matching it still do.
const upstreamTimeoutText = "timed out waiting for backend dial"

// silentAgent is an in-process client of the agent protocol that reads what the server sends and answers
// only when the test says so: an agent that is stuck, or slow.
type silentAgent struct {
	stream agent.AgentService_ConnectClient
	got    chan *client.Packet
	// leave ends the agent's stream and connection.
	leave func()
}

func startSilentAgent(t *testing.T, e *env, addr, id string) *silentAgent {
	t.Helper()
	a := connectAgent(t, e, addr, id)
	go func() {
		defer close(a.got)
		for {
			pkt, err := a.stream.Recv()
			if err != nil {
				return
			}
			a.got <- pkt
		}
	}()
	return a
}

// connectAgent connects an agent stream that reads nothing until the caller does.
func connectAgent(t *testing.T, e *env, addr, id string, opts ...grpc.DialOption) *silentAgent {
	t.Helper()
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(e.ca.file)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(e.agentCert, e.agentKey)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12,
	})))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	ctx = metadata.AppendToOutgoingContext(ctx, header.AgentID, id)
	stream, err := agent.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatalf("silent agent not accepted: %v", err)
	}
	return &silentAgent{stream: stream, got: make(chan *client.Packet, 1024), leave: func() { cancel(); conn.Close() }}
}

// next returns the next packet of type typ that the server sent, skipping others.
func (a *silentAgent) next(t *testing.T, typ client.PacketType) *client.Packet {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case pkt, ok := <-a.got:
			if !ok {
				t.Fatalf("agent stream ended while waiting for %v", typ)
			}
			if pkt.Type == typ {
				return pkt
			}
		case <-timeout:
			t.Fatalf("no %v from the server within 10s", typ)
		}
	}
}

// none checks that the server sends no packet of type typ for a while.
func (a *silentAgent) none(t *testing.T, typ client.PacketType, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case pkt, ok := <-a.got:
			if ok && pkt.Type == typ {
				t.Fatalf("unexpected %v: %v", typ, pkt)
			}
		case <-timeout:
			return
		}
	}
}

// rawFrontend is a gRPC frontend stream that sends DIAL_REQs as the test says, unlike konnectivity-client,
// which sends one.
func rawFrontend(t *testing.T, uds string, opts ...grpc.DialOption) client.ProxyService_ProxyClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+uds, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", uds)
		})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	stream, err := client.NewProxyServiceClient(conn).Proxy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

func dialReq(random int64, addr string) *client.Packet {
	return &client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{
		DialRequest: &client.DialRequest{Protocol: "tcp", Address: addr, Random: random}}}
}

func waitPending(t *testing.T, s *running, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.dials.pending() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pending dials: %d, want %d", s.dials.pending(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDialTimeoutFreesSlot: a dial to an agent that never answers fails at the frontend (kube-apiserver's
// konnectivity-client, or an HTTP CONNECT client) after --backend-dial-timeout, and gives its slot back:
// with a bound of one, a second dial is timed out too rather than refused.
func TestDialTimeoutFreesSlot(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			cfg.BackendDialTimeout = 300 * time.Millisecond
			cfg.MaxPendingDials = 1
			s := start(t, cfg)
			a := startSilentAgent(t, e, s.AgentAddr(), "stuck-agent")
			s.waitAgents(t, 1)
			before := counterValue(s.metrics.dialTimeouts)
			for i := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				began := time.Now()
				_, err := s.frontend(mode).Dial(ctx, "10.0.0.1:443")
				cancel()
				took := time.Since(began)
				if err == nil || !strings.Contains(err.Error(), upstreamTimeoutText) {
					t.Fatalf("dial %d: %v, want a dial timeout", i, err)
				}
				if mode == "grpc" && !strings.Contains(err.Error(), "--backend-dial-timeout") {
					t.Errorf("dial %d: error does not name the flag: %v", i, err)
				}
				if took > 5*time.Second {
					t.Errorf("dial %d failed after %v, not after the 300ms timeout", i, took)
				}
				if !failedAs(err, false, konnectivity.ErrDialTimeout) {
					t.Errorf("not a dial timeout past the server: %v", err)
				}
				a.next(t, client.PacketType_DIAL_REQ)
				waitPending(t, s, 0)
			}
			if got := counterValue(s.metrics.dialTimeouts) - before; got != 2 {
				t.Errorf("dial timeouts counted: %v, want 2", got)
			}
		})
	}
}

// TestLateDialResponseGetsCloseRequest: the agent answers a dial after it timed out; the server tells it to
// close the connection it opened, as nobody will use it.
func TestLateDialResponseGetsCloseRequest(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.BackendDialTimeout = 300 * time.Millisecond
	s := start(t, cfg)
	a := startSilentAgent(t, e, s.AgentAddr(), "slow-agent")
	s.waitAgents(t, 1)

	f := rawFrontend(t, cfg.UDSName)
	if err := f.Send(dialReq(4242, "10.0.0.1:443")); err != nil {
		t.Fatal(err)
	}
	req := a.next(t, client.PacketType_DIAL_REQ)
	if req.GetDialRequest().GetRandom() != 4242 {
		t.Fatalf("agent got %v", req)
	}
	rsp, err := f.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if rsp.Type != client.PacketType_DIAL_RSP || rsp.GetDialResponse().GetRandom() != 4242 ||
		!strings.Contains(rsp.GetDialResponse().GetError(), "--backend-dial-timeout") {
		t.Fatalf("frontend got %v, want a failed DIAL_RSP naming --backend-dial-timeout", rsp)
	}
	waitPending(t, s, 0)

	// The agent's dial succeeds now, too late.
	if err := a.stream.Send(&client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
		DialResponse: &client.DialResponse{Random: 4242, ConnectID: 77}}}); err != nil {
		t.Fatal(err)
	}
	cls := a.next(t, client.PacketType_CLOSE_REQ)
	if id := cls.GetCloseRequest().GetConnectID(); id != 77 {
		t.Fatalf("CLOSE_REQ for connection %d, want 77", id)
	}
}

// holdDial starts a dial that stays pending while the agent does not answer: a DIAL_REQ with dial ID random
// on its own gRPC stream, or a CONNECT request (the server picks the dial ID).
func holdDial(t *testing.T, s *running, mode string, random int64) {
	t.Helper()
	if mode == "grpc" {
		if err := rawFrontend(t, s.cfg.UDSName).Send(dialReq(random, "10.0.0.1:443")); err != nil {
			t.Fatal(err)
		}
		return
	}
	c, err := net.Dial("unix", s.cfg.UDSName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
}

// TestPendingDialsBounded: with --max-pending-dials dials waiting for a stuck agent, the next dial is refused
// at once with an error naming the flag, without reaching the agent; once a pending dial is answered, a new
// one is admitted again.
func TestPendingDialsBounded(t *testing.T) {
	const bound = 4
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			cfg.BackendDialTimeout = time.Minute
			cfg.MaxPendingDials = bound
			s := start(t, cfg)
			a := startSilentAgent(t, e, s.AgentAddr(), "stuck-agent")
			s.waitAgents(t, 1)

			var held []int64
			for i := range bound {
				holdDial(t, s, mode, int64(1000+i))
				held = append(held, a.next(t, client.PacketType_DIAL_REQ).GetDialRequest().GetRandom())
			}
			waitPending(t, s, bound)
			before := counterValue(s.metrics.dialsRefused)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			began := time.Now()
			_, err := s.frontend(mode).Dial(ctx, "10.0.0.1:443")
			cancel()
			if err == nil || !strings.Contains(err.Error(), "--max-pending-dials=4") {
				t.Fatalf("dial beyond the bound: %v, want a refusal naming --max-pending-dials", err)
			}
			if mode == "http-connect" && !strings.Contains(err.Error(), "503 Service Unavailable") {
				t.Errorf("CONNECT refusal: %v, want 503", err)
			}
			if took := time.Since(began); took > 3*time.Second {
				t.Errorf("refusal took %v", took)
			}
			if !errors.Is(konnectivity.Classify(err), konnectivity.ErrTooManyDials) {
				t.Errorf("not read back as too many pending dials: %v", err)
			}
			if got := counterValue(s.metrics.dialsRefused) - before; got != 1 {
				t.Errorf("refusals counted: %v, want 1", got)
			}
			a.none(t, client.PacketType_DIAL_REQ, 300*time.Millisecond)
			if n := s.dials.pending(); n != bound {
				t.Errorf("pending dials after the refusal: %d, want %d", n, bound)
			}

			// The agent answers one pending dial (a failure): its slot is free for a new dial.
			if err := a.stream.Send(&client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
				DialResponse: &client.DialResponse{Random: held[0], Error: "connection refused"}}}); err != nil {
				t.Fatal(err)
			}
			waitPending(t, s, bound-1)
			holdDial(t, s, mode, 2000)
			a.next(t, client.PacketType_DIAL_REQ)
			waitPending(t, s, bound)
		})
	}
}

// TestNoGoroutinePerPendingDial: many dials pending on one frontend stream cost no goroutine each (upstream's
// --backend-dial-timeout would start one per dial), and the stream's end releases all of them.
func TestNoGoroutinePerPendingDial(t *testing.T) {
	const n = 300
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.BackendDialTimeout = time.Minute
	cfg.MaxPendingDials = 0
	s := start(t, cfg)
	a := startSilentAgent(t, e, s.AgentAddr(), "stuck-agent")
	s.waitAgents(t, 1)

	f := rawFrontend(t, cfg.UDSName)
	if err := f.Send(dialReq(1, "10.0.0.1:443")); err != nil {
		t.Fatal(err)
	}
	a.next(t, client.PacketType_DIAL_REQ)
	waitPending(t, s, 1)
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := 2; i <= n; i++ {
		if err := f.Send(dialReq(int64(i), "10.0.0.1:443")); err != nil {
			t.Fatal(err)
		}
		a.next(t, client.PacketType_DIAL_REQ)
	}
	waitPending(t, s, n)
	time.Sleep(200 * time.Millisecond)
	if g := runtime.NumGoroutine(); g > base+20 {
		t.Fatalf("goroutines %d -> %d with %d dials pending: more than a constant", base, g, n)
	} else {
		t.Logf("goroutines %d -> %d with %d dials pending", base, g, n)
	}
	if err := f.CloseSend(); err != nil {
		t.Fatal(err)
	}
	waitPending(t, s, 0)
	// Upstream tells the agent to cancel each dial the stream left behind.
	a.next(t, client.PacketType_DIAL_CLS)
}

// TestPendingDialFailsWhenAgentLeaves: an agent that goes away with a dial unanswered fails that dial at once,
// not at the timeout (upstream leaves it pending until the frontend gives up).
func TestPendingDialFailsWhenAgentLeaves(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.BackendDialTimeout = time.Minute
	s := start(t, cfg)
	a := startSilentAgent(t, e, s.AgentAddr(), "leaving-agent")
	s.waitAgents(t, 1)

	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := s.frontend("grpc").Dial(ctx, "10.0.0.1:443")
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	a.next(t, client.PacketType_DIAL_REQ)
	waitPending(t, s, 1)
	a.leave()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), agentGoneText) {
			t.Fatalf("dial: %v, want %q", err, agentGoneText)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dial was still pending 10s after its agent left")
	}
	waitPending(t, s, 0)
}

// TestBlockedDialSendKeepsSlot: an agent that stops reading fills its flow-control window, and upstream's
// goroutines then block in sending it DIAL_REQs. Their dials still time out at the frontend, but keep their
// --max-pending-dials slots until the sends return, so the bound also bounds those goroutines; when the
// agent goes away the sends fail and every slot comes back.
func TestBlockedDialSendKeepsSlot(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.BackendDialTimeout = 300 * time.Millisecond
	cfg.MaxPendingDials = 100
	s := start(t, cfg)
	// A 64 KiB window (gRPC's smallest) plus gRPC's 64 KiB per-stream write quota, and 16 KiB DIAL_REQs:
	// about the ninth send blocks.
	a := connectAgent(t, e, s.AgentAddr(), "stuck-agent", grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	s.waitAgents(t, 1)

	const dials, fit = 16, 8
	address := strings.Repeat("a", 16<<10) + ":443"
	var frontends []client.ProxyService_ProxyClient
	for i := range dials {
		f := rawFrontend(t, cfg.UDSName)
		if err := f.Send(dialReq(int64(i+1), address)); err != nil {
			t.Fatal(err)
		}
		frontends = append(frontends, f)
	}
	for i, f := range frontends {
		pkt, err := f.Recv()
		if err != nil {
			t.Fatalf("frontend %d: %v", i, err)
		}
		if msg := pkt.GetDialResponse().GetError(); !strings.Contains(msg, upstreamTimeoutText) {
			t.Fatalf("frontend %d got %v, want a dial timeout", i, pkt)
		}
	}
	// At most fit DIAL_REQs left; the others are still being sent, each holding its slot.
	if n := s.dials.pending(); n < dials-fit {
		t.Fatalf("%d slots held after the timeouts; want at least %d for the blocked sends", n, dials-fit)
	}
	a.leave()
	waitPending(t, s, 0)
}

// gatedManager holds AddBackend until open is closed: the moment between upstream's handler sending an
// agent's headers and adding its Backend, stretched. entered tells that the handler got there.
type gatedManager struct {
	server.BackendManager
	entered chan struct{}
	open    chan struct{}
}

func (g gatedManager) AddBackend(b *server.Backend) {
	g.entered <- struct{}{}
	<-g.open
	g.BackendManager.AddBackend(b)
}

// TestAgentConnectedOnceDialsReachIt: Status, which readiness and waiting callers read, shows an agent
// connected only once a dial can pick it. Upstream's handler sends the agent its headers before it adds the
// agent's Backend; a dial that followed a mark made at the headers found no agent.
func TestAgentConnectedOnceDialsReachIt(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-open:
		default:
			close(open) // the test failed before opening it: let the handler go
		}
	})
	last := len(srv.ps.BackendManagers) - 1
	w := srv.ps.BackendManagers[last].(addedWatch)
	entered := make(chan struct{}, 1)
	w.BackendManager = gatedManager{BackendManager: w.BackendManager, entered: entered, open: open}
	srv.ps.BackendManagers[last] = w
	s := &running{Server: srv, Daemon: harness.RunDaemon(t, cfg.GracefulTimeout, srv.Run)}

	a := startSilentAgent(t, e, s.AgentAddr(), "gated-agent") // returns once the agent has its headers
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("upstream's handler did not add the agent's Backend")
	}
	for _, st := range s.Status().Agents {
		if st.Connected {
			t.Fatalf("agent shown connected before any dial could reach it: %+v", st)
		}
	}
	close(open)
	s.waitAgents(t, 1)
	holdDial(t, s, "grpc", 7)
	if got := a.next(t, client.PacketType_DIAL_REQ).GetDialRequest().GetRandom(); got != 7 {
		t.Fatalf("dial request %d, want 7", got)
	}
}

// TestCancelledDialLeavesNoPendingGauge: a dial that kube-apiserver's client cancels (DIAL_CLS, then the end
// of its stream) while konnect's agent is still connecting leaves upstream's
// konnectivity_network_proxy_server_pending_backend_dials at 0, as konnect's own pending dials. konnect's
// agent cancels the dial and never answers it, so no late answer corrects the gauge.
func TestCancelledDialLeavesNoPendingGauge(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	s := start(t, cfg)
	startKonnectAgent(t, e, "konnect-agent", s.agentPort())
	s.waitAgents(t, 1)
	hanging := harness.FullBacklogListener(t)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		c, err := s.frontend("grpc").Dial(ctx, hanging)
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	harness.EventuallyTrue(t, 10*time.Second, "the dial pending, in konnect's count and upstream's gauge", func() bool {
		return s.dials.pending() == 1 && upstreamPendingDials(t) == 1
	})
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled dial succeeded")
	}
	waitPending(t, s, 0)
	harness.EventuallyTrue(t, 5*time.Second, "upstream's pending-dials gauge back at 0", func() bool {
		return upstreamPendingDials(t) == 0
	})
}

// upstreamPendingDials reads upstream's konnectivity_network_proxy_server_pending_backend_dials gauge.
func upstreamPendingDials(t *testing.T) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "konnectivity_network_proxy_server_pending_backend_dials" {
			for _, m := range mf.GetMetric() {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}
