//go:build integration

package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/test/harness"
	authv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/proxystrategies"
)

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

// TestAgentStreamsByFlowControl: konnect_tunnel_server_agent_streams counts konnect's agent's stream as v1
// and upstream's proxy-agent's as none, and each goes when its agent does; the server's status (konnect
// doctor's source) says the same of each agent.
func TestAgentStreamsByFlowControl(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterCA = e.ca.file
	s := start(t, cfg)
	want := func(v1, none float64) {
		t.Helper()
		if g1, gn := gaugeValue(s.metrics.agentStreams.WithLabelValues("v1")), gaugeValue(s.metrics.agentStreams.WithLabelValues("none")); g1 != v1 || gn != none {
			t.Fatalf("agent_streams v1=%v none=%v, want v1=%v none=%v", g1, gn, v1, none)
		}
	}
	want(0, 0)
	stopKonnect := startKonnectAgent(t, e, "konnect-agent", s.agentPort())
	s.waitAgents(t, 1)
	want(1, 0)
	up := startUpstreamAgent(t, e, "upstream-agent", s.agentPort())
	s.waitAgents(t, 2)
	want(1, 1)
	statusSays := func(id string, fc map[string]int) {
		t.Helper()
		if got := agentStatus(s, id).FlowControl; !maps.Equal(got, fc) {
			t.Errorf("status of %s: flow control %v, want %v", id, got, fc)
		}
	}
	if got := s.Status().FlowControl; got != flow.Version {
		t.Errorf("status: the server's flow control %q, want %q", got, flow.Version)
	}
	statusSays("konnect-agent", map[string]int{flow.Version: 1})
	statusSays("upstream-agent", map[string]int{flow.None: 1})
	up.Kill()
	s.waitAgents(t, 1)
	want(1, 0)
	statusSays("upstream-agent", nil)
	stopKonnect()
	s.waitAgents(t, 0)
	want(0, 0)
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

func TestTokenAuthentication(t *testing.T) {
	const aud = "system:konnectivity-server"
	agentUser := authv1.UserInfo{Username: "system:serviceaccount:kube-system:konnectivity-agent"}
	client := fakeTokenReview(t,
		map[string]authv1.UserInfo{
			"good-token":      agentUser,
			"wrong-aud-token": agentUser,
			"wrong-sa-token":  {Username: "system:serviceaccount:default:intruder"},
		},
		map[string][]string{
			"good-token":      {aud},
			"wrong-aud-token": {"https://kubernetes.default.svc"},
			"wrong-sa-token":  {aud},
		})
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterCA = "" // agents present tokens, no certificates
	cfg.TokenAuth = &TokenAuth{Namespace: "kube-system", ServiceAccount: "konnectivity-agent", Audience: aud, Client: client}
	s := start(t, cfg)

	for _, chk := range s.ReadyChecks() {
		if err := chk.Check(&http.Request{}); err != nil {
			t.Errorf("readiness %s: %v", chk.Name(), err)
		}
	}

	tokenFile := func(name, tok string) string {
		f := filepath.Join(e.dir, name)
		if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		return "--service-account-token-path=" + f
	}
	for _, tc := range []struct{ id, token, wantErr string }{
		{"agent-wrong-aud", "wrong-aud-token", "invalid for the target audiences"},
		{"agent-wrong-sa", "wrong-sa-token", `"default" namespace`},
	} {
		startUpstreamAgent(t, e, tc.id, s.agentPort(), tokenFile(tc.id, tc.token))
		deadline := time.Now().Add(15 * time.Second)
		var got AgentStatus
		for time.Now().Before(deadline) {
			for _, a := range s.Status().Agents {
				if a.ID == tc.id {
					got = a
				}
			}
			if got.LastError != "" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got.Connected || !strings.Contains(got.LastError, tc.wantErr) {
			t.Errorf("%s: want rejected with %q, got %+v", tc.id, tc.wantErr, got)
		}
		if strings.Contains(got.LastError, tc.token) {
			t.Errorf("%s: the token appears in the recorded error", tc.id)
		}
	}
	startUpstreamAgent(t, e, "agent-good", s.agentPort(), tokenFile("good", "good-token"))
	s.waitAgents(t, 1)
	web := startHTTPBackend(t)
	c := dial(t, s.frontend("grpc"), web)
	defer c.Close()
	if res, _ := httpGet(t, c, web, "/"); res.StatusCode != 200 {
		t.Fatalf("status %s", res.Status)
	}
}

func TestWrongCARejected(t *testing.T) {
	e := newEnv(t)
	s := start(t, e.config("grpc"))
	other := newCA(t, e.dir, "other")
	badCert, badKey, _ := other.issue(t, e.dir, "bad-agent", true)

	// The handshake itself fails for a certificate from another CA.
	pair, err := tls.LoadX509KeyPair(badCert, badKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(e.ca.Cert.Cert)
	c, err := tls.Dial("tcp", s.AgentAddr(), &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, NextProtos: []string{"h2"}})
	if err == nil {
		// TLS 1.3 reports the client-certificate failure on the first read.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("handshake with a foreign CA's cert: %v", err)
	}

	// And upstream's agent with such a certificate never gets connected, while one from the cluster CA does.
	startUpstreamAgent(t, e, "bad", s.agentPort(), "--agent-cert="+badCert, "--agent-key="+badKey)
	startUpstreamAgent(t, e, "good", s.agentPort())
	s.waitAgents(t, 1)
	time.Sleep(500 * time.Millisecond) // give the bad agent several retries
	for _, a := range s.Status().Agents {
		if a.ID == "bad" && a.Connected {
			t.Fatal("agent with a foreign CA's certificate is connected")
		}
	}
}

// TestClusterAllowedNames: with allowed names, a client certificate from the cluster CA is not enough; its
// common name must be one of them (a kubelet's certificate from kubeadm's CA is not an agent's).
func TestClusterAllowedNames(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterAllowedNames = []string{"agent"} // the CN of e.agentCert
	s := start(t, cfg)
	nodeCert, nodeKey, _ := e.ca.issue(t, e.dir, "system:node:w1", true)
	startUpstreamAgent(t, e, "impostor", s.agentPort(), "--agent-cert="+nodeCert, "--agent-key="+nodeKey)
	startUpstreamAgent(t, e, "good", s.agentPort())
	s.waitAgents(t, 1)
	time.Sleep(500 * time.Millisecond) // give the impostor several retries
	for _, a := range s.Status().Agents {
		if a.ID == "impostor" && a.Connected {
			t.Fatal("an agent whose certificate CN is not allowed is connected")
		}
	}

	bad := e.config("grpc")
	bad.ClusterCA = ""
	bad.ClusterAllowedNames = []string{"agent"}
	if _, err := New(bad); err == nil || !strings.Contains(err.Error(), "ClusterAllowedNames") {
		t.Fatalf("allowed names without a CA: %v", err)
	}
}

// TestClusterCertReload: a renewed --cluster-cert is served to new agent connections without a restart,
// and a tunnel open during the renewal keeps working.
func TestClusterCertReload(t *testing.T) {
	e := newEnv(t)
	s := start(t, e.config("grpc"))
	startUpstreamAgent(t, e, "agent-1", s.agentPort())
	s.waitAgents(t, 1)
	echo := harness.StartEcho(t).Addr
	c := dial(t, s.frontend("grpc"), echo)
	defer c.Close()
	echoRoundTrip(t, c, 1<<20, 64<<10)

	old := servedSerial(t, s.AgentAddr())
	_, _, renewed := e.ca.issue(t, e.dir, "server", false) // same files, new certificate
	if renewed.Cmp(old) == 0 {
		t.Fatal("test bug: same serial")
	}
	deadline := time.Now().Add(10 * time.Second)
	for servedSerial(t, s.AgentAddr()).Cmp(renewed) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("renewed certificate not served")
		}
		time.Sleep(100 * time.Millisecond)
	}
	echoRoundTrip(t, c, 1<<20, 64<<10) // the open tunnel survived
	startUpstreamAgent(t, e, "agent-2", s.agentPort())
	s.waitAgents(t, 2)
}

// TestMTLSFrontend: kube-apiserver's TCP transport, in both protocols, with a client certificate; a client
// without one is refused.
func TestMTLSFrontend(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			s := start(t, e.tcpConfig(mode))
			startUpstreamAgent(t, e, "agent-1", s.agentPort())
			s.waitAgents(t, 1)
			web := startHTTPBackend(t)

			f := e.tcpFrontend(t, s, mode)
			c := dial(t, f, web)
			if res, _ := httpGet(t, c, web, "/"); res.StatusCode != 200 {
				t.Fatalf("status %s", res.Status)
			}
			c.Close()

			f.TLS = &tls.Config{RootCAs: f.TLS.RootCAs}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if c, err := f.Dial(ctx, web); err == nil {
				c.Close()
				t.Fatal("frontend accepted a client without a certificate")
			}
		})
	}
}

// TestProxyStrategies: destHost routes by the agents' identifiers, defaultRoute only to agents that say
// default-route=true, as upstream does.
func TestProxyStrategies(t *testing.T) {
	// A backend on 127.0.0.2, which only the agent identified with it may serve under destHost. It answers
	// only after the client speaks: konnectivity-client drops DATA that arrives right behind its DIAL_RSP,
	// before the connection is registered (an upstream client race that client-first protocols never hit).
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on this host: %v", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b := make([]byte, 1)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(b); err == nil {
				c.Write([]byte("hi"))
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	target := ln.Addr().String()

	for _, tc := range []struct {
		name       string
		strategies []proxystrategies.ProxyStrategy
		idents     string
		wantOK     bool
	}{
		{"destHost match", []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDestHost}, "ipv4=127.0.0.2", true},
		{"destHost other host", []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDestHost}, "ipv4=127.0.0.3", false},
		{"destHost then default", []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDestHost, proxystrategies.ProxyStrategyDefault}, "ipv4=127.0.0.3", true},
		{"defaultRoute agent", []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDefaultRoute}, "default-route=true", true},
		{"defaultRoute without", []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDefaultRoute}, "host=node-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config("grpc")
			cfg.ProxyStrategies = tc.strategies
			s := start(t, cfg)
			startUpstreamAgent(t, e, "agent-1", s.agentPort(), "--agent-cert="+e.agentCert, "--agent-key="+e.agentKey, "--agent-identifiers="+tc.idents)
			s.waitAgents(t, 1)
			if got := s.Status().Agents[0].Identifiers; got != tc.idents {
				t.Errorf("identifiers %q, want %q", got, tc.idents)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := s.frontend("grpc").Dial(ctx, target)
			if tc.wantOK {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				b := make([]byte, 2)
				if _, err := c.Write([]byte("?")); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, b); err != nil || string(b) != "hi" {
					t.Errorf("read %q, %v", b, err)
				}
				c.Close()
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded without a matching agent")
			}
			if !strings.Contains(err.Error(), "No agent available") {
				t.Errorf("error %v", err)
			}
		})
	}
}

// TestMTLSFrontendBoundsHandshakes: on the mutual-TLS TCP frontend, a connection that does not complete its
// TLS handshake is closed within the handshake timeout (gRPC's default is 120 s, net/http's here 10 s),
// and beyond the bound on handshakes in progress a connection waits its turn instead of being refused, so
// that kube-apiserver's tunnels still get through.
func TestMTLSFrontendBoundsHandshakes(t *testing.T) {
	old := maxFrontendHandshakes
	maxFrontendHandshakes = 4
	t.Cleanup(func() { maxFrontendHandshakes = old })
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.tcpConfig(mode)
			cfg.HandshakeTimeout = time.Second
			s := start(t, cfg)
			startUpstreamAgent(t, e, "agent-1", s.agentPort())
			s.waitAgents(t, 1)
			web := startHTTPBackend(t)

			begin := time.Now()
			var raw []net.Conn
			for i := 0; i < maxFrontendHandshakes; i++ {
				raw = append(raw, dialFrom(t, "127.0.0.1", s.FrontendAddr()))
			}
			c := dial(t, e.tcpFrontend(t, s, mode), web) // waits for a slot, which the silent connections free when they time out
			if res, _ := httpGet(t, c, web, "/"); res.StatusCode != 200 {
				t.Fatalf("status %s", res.Status)
			}
			c.Close()
			for _, c := range raw {
				closedBy(t, c, begin.Add(cfg.HandshakeTimeout+time.Second))
			}
			if got := counterValue(s.authMetrics.connsExpired.WithLabelValues("frontend", "handshake")); got != float64(maxFrontendHandshakes) {
				t.Errorf("frontend connections timed out: %v, want %d", got, maxFrontendHandshakes)
			}
		})
	}
}

func servedSerial(t *testing.T, addr string) *big.Int {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}
