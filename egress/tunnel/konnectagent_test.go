package tunnel

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/agent"
	"github.com/konnect-dev/konnect/test/harness"
)

// startKonnectAgent runs konnect's own agent in-process against the server's agent port.
func startKonnectAgent(t testing.TB, e *env, id string, port int) func() {
	t.Helper()
	a, err := agent.New(agent.Config{
		Servers:         []string{fmt.Sprintf("127.0.0.1:%d", port)},
		CAFile:          e.ca.file,
		CertFile:        e.agentCert,
		KeyFile:         e.agentKey,
		AgentID:         id,
		SyncInterval:    100 * time.Millisecond,
		SyncIntervalCap: 500 * time.Millisecond,
		GracefulTimeout: time.Second,
	})
	if err != nil {
		t.Fatalf("konnect agent: %v", err)
	}
	d := harness.RunDaemon(t, time.Second, a.Run)
	return func() { _ = d.Stop(t) }
}

// TestTunnelKonnectAgent runs the server with konnect's own agent in both frontend modes.
func TestTunnelKonnectAgent(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			cfg.ClusterCA = e.ca.file
			s := start(t, cfg)
			startKonnectAgent(t, e, "konnect-agent", s.agentPort())
			s.waitAgents(t, 1)
			web, echo := startHTTPBackend(t), harness.StartEcho(t).Addr
			f := s.frontend(mode)

			c := dial(t, f, web)
			res, body := httpGet(t, c, web, "/")
			c.Close()
			if res.StatusCode != 200 || string(body) != "hello from backend\n" {
				t.Fatalf("got %s %q", res.Status, body)
			}
			c = dial(t, f, echo)
			echoRoundTrip(t, c, 16<<20, 0)
			c.Close()
			c = dial(t, f, echo)
			echoRoundTrip(t, c, 64<<20, 256<<10)
			c.Close()
			download(t, f, web, 64<<20)
		})
	}
}

// TestTwoServersOneAgent: konnect's agent, given both servers' addresses, holds a connection to each (no
// load balancer), tunnels work through either, and a server that goes away and comes back is rejoined.
func TestTwoServersOneAgent(t *testing.T) {
	e := newEnv(t)
	cfgs := make([]*Config, 2)
	servers := make([]*running, 2)
	for i := range servers {
		cfgs[i] = e.config("grpc")
		cfgs[i].ServerID = fmt.Sprintf("server-%d", i)
		cfgs[i].ServerCount = 2
		cfgs[i].UDSName = fmt.Sprintf("%s/s%d.sock", e.dir, i)
		servers[i] = start(t, cfgs[i])
	}
	a, err := agent.New(agent.Config{
		Servers: []string{servers[0].AgentAddr(), servers[1].AgentAddr()},
		CAFile:  e.ca.file, CertFile: e.agentCert, KeyFile: e.agentKey,
		AgentID:      "ha-agent",
		SyncInterval: 100 * time.Millisecond, SyncIntervalCap: 500 * time.Millisecond, GracefulTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	web := startHTTPBackend(t)
	check := func(s *running) {
		t.Helper()
		s.waitAgents(t, 1)
		c := dial(t, s.frontend("grpc"), web)
		defer c.Close()
		if res, _ := httpGet(t, c, web, "/"); res.StatusCode != 200 {
			t.Fatalf("through %s: %s", s.cfg.ServerID, res.Status)
		}
	}
	check(servers[0])
	check(servers[1])

	// Server 1 goes away: server 0 keeps working; server 1 comes back on the same port and is rejoined.
	addr := servers[1].AgentAddr()
	servers[1].Stop(t)
	check(servers[0])
	cfgs[1].AgentAddr = addr
	servers[1] = start(t, cfgs[1])
	check(servers[1])
}

// TestKonnectAgentFirstDataNotHeldTwice: konnect's agent holds a connection's first data itself
// (konnectivity.FirstDataHold), so the server adds no hold of its own for it: with the server's hold made a
// minute long, a server-first backend's data still comes at once, after the agent's own short hold, whole.
func TestKonnectAgentFirstDataNotHeldTwice(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			s := startWithFirstDataHold(t, cfg, time.Minute)
			startKonnectAgent(t, e, "konnect-agent", s.agentPort())
			s.waitAgents(t, 1)
			addr := startServerFirstBackend(t, 1<<20)
			for range 5 {
				start := time.Now()
				c := dial(t, s.frontend(mode), addr)
				got, err := readAllWithin(c, 20*time.Second)
				c.Close()
				if err != nil || len(got) != 1<<20 {
					t.Fatalf("%d bytes, %v", len(got), err)
				}
				checkPattern(t, got, 0)
				if d := time.Since(start); d > 10*time.Second {
					t.Fatalf("a server-first backend's data took %v: the server held it too", d)
				}
			}
		})
	}
}
