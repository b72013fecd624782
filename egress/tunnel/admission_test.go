package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// agentTLS is the TLS config of an agent of e: the server's CA, and the agent's certificate unless
// withCert is false (token mode).
func agentTLS(t *testing.T, e *env, withCert bool) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(e.ca.file)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)
	c := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if withCert {
		cert, err := tls.LoadX509KeyPair(e.agentCert, e.agentKey)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}

// dialFrom opens a TCP connection to addr from the loopback address src (127.0.0.0/8 is all local).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	c, err := harness.DialFrom(src, addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// idleHTTP2 completes TLS and the HTTP/2 preface on c, and then opens no stream.
func idleHTTP2(t *testing.T, c net.Conn, cfg *tls.Config) net.Conn {
	t.Helper()
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	if _, err := tc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := http2.NewFramer(tc, tc).WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// closedBy waits for the server to close c (reading and dropping what it sends) and fails the test if c is
// still open at deadline.
func closedBy(t *testing.T, c net.Conn, deadline time.Time) {
	t.Helper()
	if harness.OpenAfter(c, time.Until(deadline)) {
		t.Fatalf("connection from %s still open after the bound", c.LocalAddr())
	}
}

// refused reports whether a connection from src to addr is reset (or closed) at once, if not already
// while it was being made.
func refused(src, addr string) bool {
	c, err := harness.DialFrom(src, addr)
	if err != nil {
		return true
	}
	defer c.Close()
	return !harness.OpenAfter(c, 2*time.Second)
}

// tokenConfig is e's config with agents authenticated by token through r.
func tokenConfig(e *env, r *reviewer) *Config {
	cfg := e.config("grpc")
	cfg.ClusterCA = ""
	cfg.TokenAuth = &TokenAuth{Namespace: "kube-system", ServiceAccount: "konnectivity-agent", Audience: testAudience, Client: r.client()}
	return cfg
}

// TestAgentPortClosesUnauthenticatedPeers: connections to the agent port that never start TLS are closed
// within the handshake timeout, and TLS+HTTP/2 connections that never open a Connect stream within the
// authentication timeout, with or without a client certificate; a connected agent stays. gRPC's defaults
// are 120 s for the first and forever for the second.
func TestAgentPortClosesUnauthenticatedPeers(t *testing.T) {
	for _, mode := range []string{"mtls", "token"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			r := newReviewer()
			r.add("good", testAgentSA)
			cfg := e.config("grpc")
			if mode == "token" {
				cfg = tokenConfig(e, r)
			}
			cfg.HandshakeTimeout, cfg.AgentAuthTimeout = time.Second, 2*time.Second
			s := start(t, cfg)
			var ag *silentAgent
			if mode == "mtls" {
				ag = connectAgent(t, e, s.AgentAddr(), "agent-1")
			} else {
				ag = connectAgent(t, e, s.AgentAddr(), "agent-1", grpc.WithPerRPCCredentials(tokenCreds("good")))
			}
			_ = ag

			start := time.Now()
			var raw, idle []net.Conn
			for i := 0; i < 20; i++ {
				raw = append(raw, dialFrom(t, "127.0.0.1", s.AgentAddr()))
			}
			for i := 0; i < 10; i++ {
				idle = append(idle, idleHTTP2(t, dialFrom(t, "127.0.0.1", s.AgentAddr()), agentTLS(t, e, mode == "mtls")))
			}
			for _, c := range raw {
				closedBy(t, c, start.Add(cfg.HandshakeTimeout+time.Second))
			}
			for _, c := range idle {
				closedBy(t, c, start.Add(cfg.AgentAuthTimeout+time.Second))
			}
			if got := counterValue(s.authMetrics.connsExpired.WithLabelValues("agent", "handshake")); got != 20 {
				t.Errorf("connections timed out in the handshake: %v counted, want 20", got)
			}
			if got := counterValue(s.authMetrics.connsExpired.WithLabelValues("agent", "auth")); got != 10 {
				t.Errorf("connections timed out before authenticating: %v counted, want 10", got)
			}
			// The agent connected before them is still connected, well past both bounds.
			s.waitAgents(t, 1)
			for _, a := range s.Status().Agents {
				if a.ID == "agent-1" && time.Since(a.Since) < cfg.AgentAuthTimeout {
					t.Errorf("agent-1 reconnected (connected since %v): its connection was closed", a.Since)
				}
			}
			if n := gaugeValue(s.authMetrics.unauthenticated.WithLabelValues("agent")); n != 0 {
				t.Errorf("%v connections still counted as unauthenticated", n)
			}
		})
	}
}

// tokenCreds sends an agent token as upstream's agent does.
type tokenCreds string

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{header.AuthenticationTokenContextKey: header.AuthenticationTokenContextSchemePrefix + string(c)}, nil
}
func (tokenCreds) RequireTransportSecurity() bool { return true }

// TestAgentPortCapsUnauthenticated: at most MaxUnauthenticatedPerSource connections from one source and
// MaxUnauthenticated in all may be unauthenticated at once; beyond the first, a new connection is reset at
// once, beyond the second it waits to be accepted until a slot frees. Agents that authenticated do not count.
func TestAgentPortCapsUnauthenticated(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.MaxUnauthenticatedPerSource, cfg.MaxUnauthenticated = 4, 6
	cfg.HandshakeTimeout, cfg.AgentAuthTimeout = time.Minute, time.Minute
	s := start(t, cfg)
	connectAgent(t, e, s.AgentAddr(), "agent-1")
	s.waitAgents(t, 1)

	var fromA []net.Conn
	for i := 0; i < 4; i++ {
		fromA = append(fromA, dialFrom(t, "127.0.0.1", s.AgentAddr()))
	}
	if !refused("127.0.0.1", s.AgentAddr()) {
		t.Fatal("a fifth unauthenticated connection from one source was kept")
	}
	for _, c := range fromA {
		if !harness.OpenAfter(c, 100*time.Millisecond) {
			t.Fatal("a connection within the per-source bound was closed")
		}
	}
	b1, b2 := dialFrom(t, "127.0.0.2", s.AgentAddr()), dialFrom(t, "127.0.0.2", s.AgentAddr())
	harness.EventuallyTrue(t, 5*time.Second, "six unauthenticated connections", func() bool {
		return gaugeValue(s.authMetrics.unauthenticated.WithLabelValues("agent")) == 6
	})
	// A seventh is not accepted, nor reset: it waits in the accept queue until a slot frees.
	seventh := tls.Client(dialFrom(t, "127.0.0.3", s.AgentAddr()), agentTLS(t, e, true))
	handshook := make(chan error, 1)
	go func() {
		_ = seventh.SetDeadline(time.Now().Add(20 * time.Second))
		handshook <- seventh.Handshake()
	}()
	select {
	case err := <-handshook:
		t.Fatalf("a seventh unauthenticated connection was served at once (%v)", err)
	case <-time.After(time.Second):
	}
	if !harness.OpenAfter(b1, 100*time.Millisecond) || !harness.OpenAfter(b2, 100*time.Millisecond) {
		t.Fatal("connections within the total bound were closed")
	}
	if got := counterValue(s.authMetrics.connsRefused.WithLabelValues("agent")); got != 1 {
		t.Errorf("refused for their source: %v, want 1", got)
	}
	if got := counterValue(s.authMetrics.acceptWaits.WithLabelValues("agent")); got < 1 {
		t.Errorf("waits for a slot counted: %v, want at least 1", got)
	}
	// A slot that frees is taken by the waiting connection, and an agent that authenticates leaves its slot.
	fromA[0].Close()
	if err := <-handshook; err != nil {
		t.Fatalf("the waiting connection's handshake once a slot freed: %v", err)
	}
	seventh.Close()
	harness.EventuallyTrue(t, 5*time.Second, "the closed connections' slots freed", func() bool {
		return gaugeValue(s.authMetrics.unauthenticated.WithLabelValues("agent")) == 5
	})
	for _, c := range append(fromA[1:], b1, b2) {
		c.Close()
	}
	harness.EventuallyTrue(t, 5*time.Second, "every slot freed", func() bool {
		return gaugeValue(s.authMetrics.unauthenticated.WithLabelValues("agent")) == 0
	})
	connectAgent(t, e, s.AgentAddr(), "agent-2")
	s.waitAgents(t, 2)
	// The server counts the agent out once it has sent the headers the agent waited for.
	harness.EventuallyTrue(t, 5*time.Second, "agent-2 counted as authenticated", func() bool {
		return gaugeValue(s.authMetrics.unauthenticated.WithLabelValues("agent")) == 0
	})
	for i := 0; i < 4; i++ {
		if c := dialFrom(t, "127.0.0.1", s.AgentAddr()); !harness.OpenAfter(c, 100*time.Millisecond) {
			t.Fatal("connected agents count against the per-source bound")
		}
	}
}

// TestOneConnectStreamPerConnection: a connection that opens hundreds of Connect streams with bogus tokens
// before it has authenticated costs one TokenReview, and a genuine agent connects meanwhile. Upstream
// reviews every stream.
func TestOneConnectStreamPerConnection(t *testing.T) {
	e := newEnv(t)
	r := newReviewer()
	r.add("good", testAgentSA)
	r.delay = 50 * time.Millisecond
	s := start(t, tokenConfig(e, r))

	cc, err := grpc.NewClient("passthrough:///"+s.AgentAddr(), grpc.WithTransportCredentials(credentials.NewTLS(agentTLS(t, e, false))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	const streams = 300
	codesSeen := map[codes.Code]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, header.AgentID, fmt.Sprintf("flood-%d", i),
				header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+fmt.Sprintf("bogus-%d", i))
			st, err := agent.NewAgentServiceClient(cc).Connect(ctx)
			if err == nil {
				_, err = st.Recv()
			}
			mu.Lock()
			codesSeen[status.Code(err)]++
			mu.Unlock()
		}()
	}
	// A genuine agent on its own connection gets in while the flood is refused.
	begin := time.Now()
	connectAgent(t, e, s.AgentAddr(), "genuine", grpc.WithPerRPCCredentials(tokenCreds("good")))
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("the genuine agent took %v to connect during the flood", d)
	}
	wg.Wait()
	if n := r.reviews.Load(); n != 2 { // one for the flood's connection, one for the genuine agent
		t.Errorf("%d Connect streams on one connection and one genuine agent sent %d TokenReviews, want 2", streams, n)
	}
	if codesSeen[codes.OK] > 0 {
		t.Errorf("a bogus token was accepted: %v", codesSeen)
	}
	if codesSeen[codes.Unknown] != 1 {
		t.Errorf("want one stream rejected by the TokenReview (Unknown, upstream's code): %v", codesSeen)
	}
	if got := counterValue(s.authMetrics.authRefused.WithLabelValues("stream")); got != streams-1 {
		t.Errorf("streams refused without a review: %v counted, want %d (codes %v)", got, streams-1, codesSeen)
	}
}

// TestAuthenticatedConnectionMayOpenMoreStreams: once a connection has authenticated, each further Connect
// stream is authenticated on its own (as upstream does), from the cache.
func TestAuthenticatedConnectionMayOpenMoreStreams(t *testing.T) {
	e := newEnv(t)
	r := newReviewer()
	r.add("good", testAgentSA)
	s := start(t, tokenConfig(e, r))
	cc, err := grpc.NewClient("passthrough:///"+s.AgentAddr(), grpc.WithTransportCredentials(credentials.NewTLS(agentTLS(t, e, false))),
		grpc.WithPerRPCCredentials(tokenCreds("good")))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), header.AgentID, fmt.Sprintf("a-%d", i)))
		defer cancel()
		st, err := agent.NewAgentServiceClient(cc).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if h, err := st.Header(); err != nil || len(h.Get(header.ServerID)) != 1 {
			t.Fatalf("stream %d on an authenticated connection: %v %v", i, h, err)
		}
	}
	s.waitAgents(t, 3)
	if n := r.reviews.Load(); n != 1 {
		t.Errorf("%d TokenReviews for one token, want 1", n)
	}
}

// TestBadOfferIsOneAttempt: a connection that has not authenticated and opens many Connect streams with a
// bad flow-control offer gets one attempt, as with any other Connect stream, and a peer that did not
// authenticate does not change what the status says of a connected agent whose ID it claims. A bad offer
// from an agent that authenticated is still refused (InvalidArgument) and recorded under its ID.
func TestBadOfferIsOneAttempt(t *testing.T) {
	const streams, badOffer = 100, "v1;window=x"
	for _, mode := range []string{"token", "mtls"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			r := newReviewer()
			r.add("good", testAgentSA)
			cfg := e.config("grpc")
			var good, bogus []grpc.DialOption
			if mode == "token" {
				cfg = tokenConfig(e, r)
				good = []grpc.DialOption{grpc.WithPerRPCCredentials(tokenCreds("good"))}
				bogus = []grpc.DialOption{grpc.WithPerRPCCredentials(tokenCreds("bogus"))}
			}
			s := start(t, cfg)
			connectAgent(t, e, s.AgentAddr(), "genuine", good...)
			s.waitAgents(t, 1)
			before := agentStatus(s, "genuine")

			// With a certificate, the connection's peer is authenticated and may claim any ID, as upstream
			// lets it; without a token it is not, and claims the connected agent's.
			claimed := "genuine"
			if mode == "mtls" {
				claimed = "claimed"
			}
			cc, err := grpc.NewClient("passthrough:///"+s.AgentAddr(), append(bogus,
				grpc.WithTransportCredentials(credentials.NewTLS(agentTLS(t, e, mode == "mtls"))))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			codesSeen := map[codes.Code]int{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					ctx = metadata.AppendToOutgoingContext(ctx, header.AgentID, claimed, flow.Header, badOffer)
					st, err := agent.NewAgentServiceClient(cc).Connect(ctx)
					if err == nil {
						_, err = st.Recv()
					}
					mu.Lock()
					codesSeen[status.Code(err)]++
					mu.Unlock()
				}()
			}
			wg.Wait()
			// The one attempt fails on the token (upstream's code, Unknown), or with a certificate on the offer.
			attempt := codes.Unknown
			if mode == "mtls" {
				attempt = codes.InvalidArgument
			}
			if codesSeen[attempt] != 1 || codesSeen[codes.PermissionDenied]+codesSeen[codes.ResourceExhausted] != streams-1 {
				t.Errorf("%d Connect streams with a bad offer on one connection: %v, want one %v and the rest refused as further attempts",
					streams, codesSeen, attempt)
			}
			if got := counterValue(s.authMetrics.authRefused.WithLabelValues("stream")); got != streams-1 {
				t.Errorf("streams refused as further attempts: %v counted, want %d", got, streams-1)
			}
			if after := agentStatus(s, "genuine"); !reflect.DeepEqual(after, before) {
				t.Errorf("the connected agent's status changed:\nbefore %+v\nafter  %+v", before, after)
			}

			// An agent that authenticates and offers badly is refused for its offer, which its status says.
			cc2, err := grpc.NewClient("passthrough:///"+s.AgentAddr(), append(good,
				grpc.WithTransportCredentials(credentials.NewTLS(agentTLS(t, e, mode == "mtls"))))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cc2.Close()
			ctx := metadata.AppendToOutgoingContext(context.Background(), header.AgentID, "bad-offer", flow.Header, badOffer)
			st, err := agent.NewAgentServiceClient(cc2).Connect(ctx)
			if err == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("an authenticated agent's bad offer: %v, want InvalidArgument", err)
			}
			if got := agentStatus(s, "bad-offer"); got.Connected || !strings.Contains(got.LastError, "InvalidArgument") {
				t.Errorf("the bad offer is not recorded: %+v", got)
			}
		})
	}
}

// agentStatus is what s's status says of the agent id (the zero value if nothing).
func agentStatus(s *running, id string) AgentStatus {
	for _, a := range s.Status().Agents {
		if a.ID == id {
			return a
		}
	}
	return AgentStatus{}
}

// TestNewRefusesUnauthenticatedAgents: without a CA for agents' certificates or token authentication, New
// refuses to start unless the Config opts out; upstream registers any agent then.
func TestNewRefusesUnauthenticatedAgents(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterCA = ""
	var fe *field.Error
	if _, err := New(cfg); !errors.As(err, &fe) || !slices.Equal(fe.Fields(), []string{"AgentAuth"}) {
		t.Fatalf("New without agent authentication: %v", err)
	}
	cfg.AllowUnauthenticatedAgents = true
	s := start(t, cfg)
	// Then any agent is taken, as upstream takes it (the server asks for no certificate, so none is sent).
	connectAgent(t, e, s.AgentAddr(), "anyone")
	s.waitAgents(t, 1)
}

// TestHeaderFloodIsReset: a stream whose headers decode to far more than an agent or kube-apiserver sends
// is reset, on the agent port by a peer without a token and on the frontend, instead of being decoded and
// held until an interceptor looks at it. HPACK sends each repeat of a field in one byte, so the 100,000
// fields below are about 100 KB on the wire and 3.4 MB decoded (RFC 7541 counts 32 bytes a field), within
// gRPC's default bound of 16 MiB a stream: before the bound was set, 24 such connections of about 450 KB
// each took the server's heap to 1.4 GiB.
func TestHeaderFloodIsReset(t *testing.T) {
	e := newEnv(t)
	s := start(t, tokenConfig(e, newReviewer()))
	for _, tc := range []struct {
		name, path string
		dial       func() net.Conn
	}{
		{"agent port", "/agent.AgentService/Connect", func() net.Conn {
			c := tls.Client(dialFrom(t, "127.0.0.1", s.AgentAddr()), agentTLS(t, e, false))
			if err := c.Handshake(); err != nil {
				t.Fatalf("TLS handshake: %v", err)
			}
			return c
		}},
		{"frontend", "/konnectivity.ProxyService/Proxy", func() net.Conn {
			c, err := net.Dial("unix", s.frontend("grpc").UDSName)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.dial()
			defer c.Close()
			if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(c, c)
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", tc.path},
				{":authority", "127.0.0.1"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
				_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			for range 100_000 {
				_ = enc.WriteField(hpack.HeaderField{Name: "x", Value: "v"})
			}
			// The server reads while we write: what it sends back is read below, once all is written.
			go func() {
				b := block.Bytes()
				const frag = 16 << 10
				first := b[:min(frag, len(b))]
				if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(b) <= frag}) != nil {
					return
				}
				for b = b[len(first):]; len(b) > 0; {
					n := min(frag, len(b))
					if fr.WriteContinuation(1, n == len(b), b[:n]) != nil {
						return
					}
					b = b[n:]
				}
			}()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatal("the server neither reset the stream nor closed the connection: it took the headers")
					}
					return // the connection was closed: the headers were refused
				}
				switch f := f.(type) {
				case *http2.RSTStreamFrame, *http2.GoAwayFrame:
					return
				case *http2.HeadersFrame:
					if f.StreamID == 1 {
						t.Fatal("the server answered the stream: it decoded the headers and passed them on")
					}
				}
			}
		})
	}
}
