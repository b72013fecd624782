package agent

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/dns/dnsmessage"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/proxystrategies"
)

// dnsServer answers A queries for name with addrs (and nothing else) on a loopback UDP port.
func dnsServer(t *testing.T, name string, addrs ...netip.Addr) *net.Resolver {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
			b.EnableCompression()
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			if strings.EqualFold(q.Name.String(), name+".") && q.Type == dnsmessage.TypeA {
				for _, a := range addrs {
					_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: a.As4()})
				}
			}
			msg, err := b.Finish()
			if err == nil {
				_, _ = pc.WriteTo(msg, from)
			}
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// TestOneNameSeveralServers: one --proxy-server-host name that resolves to two addresses gives two servers,
// each verified against the name, with no load balancer in front (ANP issue 394).
func TestOneNameSeveralServers(t *testing.T) {
	const name = "servers.konnect.test"
	pki := newTestPKI(t)
	s1 := startUpstreamServer(t, serverOpts{id: "s1", count: 2, ca: pki.ca, serverHost: name})
	_, port, _ := net.SplitHostPort(s1.agentAddr)
	s2 := startUpstreamServer(t, serverOpts{id: "s2", count: 2, ca: pki.ca, serverHost: name, addr: "127.0.0.2:" + port})
	cfg := pki.config(net.JoinHostPort(name, port))
	cfg.Resolver = dnsServer(t, name, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	ra := startAgent(t, cfg)
	eventually(t, 10*time.Second, "agent on both addresses of the name", func() bool {
		n, _ := ra.Connected()
		return s1.backends() == 1 && s2.backends() == 1 && n == 2
	})
	st := ra.Status()
	if len(st) != 2 || st[0].Address != "127.0.0.1:"+port || st[1].Address != "127.0.0.2:"+port ||
		st[0].ServerName != name || !st[0].Connected || !st[1].Connected {
		t.Fatalf("status %+v", st)
	}
	echo := harness.StartEcho(t)
	for _, s := range []*upstreamServer{s1, s2} {
		if err := echoOnce(t, s, echo); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTwoAddressesOneServer: a name whose two addresses lead to the same server (dual-stack, or a name and
// an address of one server) gives one server, not a second one that never connects.
func TestTwoAddressesOneServer(t *testing.T) {
	const name = "server.konnect.test"
	pki := newTestPKI(t)
	s1 := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca, serverHost: name})
	_, port, _ := net.SplitHostPort(s1.agentAddr)
	tcpForwarder(t, "127.0.0.2:"+port, s1.agentAddr)
	cfg := pki.config(net.JoinHostPort(name, port))
	cfg.Resolver = dnsServer(t, name, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	ra := startAgent(t, cfg)
	eventually(t, 10*time.Second, "both addresses seen, one server", func() bool {
		st := ra.Status()
		return len(st) == 2 && st[0].Connected && st[1].Connected
	})
	if n, known := ra.Connected(); n != 1 || known != 1 {
		t.Fatalf("Connected() = %d, %d; want 1, 1", n, known)
	}
	if err := readyErr(ra, "all-servers-connected"); err != nil {
		t.Fatal(err)
	}
	if st := ra.Status(); st[0].ServerID != "s1" || st[1].ServerID != "s1" || st[0].Alias == st[1].Alias {
		t.Fatalf("status %+v", st)
	}
	if s1.backends() != 1 {
		t.Fatalf("server has %d streams from the agent, want 1", s1.backends())
	}
}

// TestAgentIdentifiers: the identifiers reach the server, whose destHost strategy routes by them.
func TestAgentIdentifiers(t *testing.T) {
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca, strategies: []proxystrategies.ProxyStrategy{
		proxystrategies.ProxyStrategyDestHost, proxystrategies.ProxyStrategyDefault}})
	ca := pki.config(srv.agentAddr)
	ca.AgentID, ca.Identifiers = "node-a", "ipv4=127.0.0.1&host=node-a"
	cb := pki.config(srv.agentAddr)
	cb.AgentID, cb.Identifiers = "node-b", "ipv4=127.0.0.9&host=node-b"
	a, b := startAgent(t, ca), startAgent(t, cb)
	eventually(t, 10*time.Second, "both agents connected", func() bool {
		na, _ := a.Connected()
		nb, _ := b.Connected()
		return na == 1 && nb == 1
	})
	echo := harness.StartEcho(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 10 {
		c, err := srv.dial(ctx, echo.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if a.OpenConnections() != 10 || b.OpenConnections() != 0 {
		t.Fatalf("connections on node-a %d, node-b %d; want all 10 on node-a (ipv4=127.0.0.1)", a.OpenConnections(), b.OpenConnections())
	}
}
