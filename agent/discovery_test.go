package agent

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/dns/dnsmessage"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/proxystrategies"
)

// dnsResponder answers A queries for one name on a loopback UDP port, with addresses that a test may change.
type dnsResponder struct {
	pc       net.PacketConn
	mu       sync.Mutex
	addrs    []netip.Addr
	queries  atomic.Int64 // queries for the name itself (not with a search domain), answered or not
	received atomic.Int64 // all queries
}

// dnsServer answers A and AAAA queries for name with addrs (and nothing else) on a loopback UDP port.
func dnsServer(t *testing.T, name string, addrs ...netip.Addr) *net.Resolver {
	return startDNS(t, name, true, addrs...).resolver()
}

// startDNS starts a responder; with answer false it reads queries and never answers them.
func startDNS(t *testing.T, name string, answer bool, addrs ...netip.Addr) *dnsResponder {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	r := &dnsResponder{pc: pc, addrs: addrs}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			r.received.Add(1)
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			if strings.EqualFold(q.Name.String(), name+".") {
				r.queries.Add(1)
			}
			if !answer {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
			b.EnableCompression()
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			if strings.EqualFold(q.Name.String(), name+".") {
				rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
				r.mu.Lock()
				for _, a := range r.addrs {
					switch {
					case q.Type == dnsmessage.TypeA && a.Is4():
						_ = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
					case q.Type == dnsmessage.TypeAAAA && a.Is6():
						_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
					}
				}
				r.mu.Unlock()
			}
			msg, err := b.Finish()
			if err == nil {
				_, _ = pc.WriteTo(msg, from)
			}
		}
	}()
	return r
}

func (r *dnsResponder) set(addrs ...netip.Addr) {
	r.mu.Lock()
	r.addrs = addrs
	r.mu.Unlock()
}

func (r *dnsResponder) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", r.pc.LocalAddr().String())
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
	harness.EventuallyTrue(t, 10*time.Second, "agent on both addresses of the name", func() bool {
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
	harness.EventuallyTrue(t, 10*time.Second, "both addresses seen, one server", func() bool {
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
	// Once the second address is known to lead to the connected server, it is not dialled again while no
	// server is missing: five times the longest retry interval brings no new stream.
	for len(s1.tokens) > 0 {
		<-s1.tokens
	}
	time.Sleep(5 * cfg.SyncIntervalCap)
	if n := len(s1.tokens); n > 0 {
		t.Errorf("the alias address was dialled %d more times", n)
	}
}

// TestDualStackNameWithoutIPv6Route: a name with an A and an AAAA record for one server, reachable only over
// IPv4, is one server: the agent is ready, not waiting for a second server at the IPv6 address.
func TestDualStackNameWithoutIPv6Route(t *testing.T) {
	const name = "server.konnect.test"
	pki := newTestPKI(t)
	s1 := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca, serverHost: name})
	_, port, _ := net.SplitHostPort(s1.agentAddr) // nothing listens on [::1]:port
	cfg := pki.config(net.JoinHostPort(name, port))
	cfg.Resolver = dnsServer(t, name, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"))
	ra := startAgent(t, cfg)
	harness.EventuallyTrue(t, 10*time.Second, "the IPv6 address tried and failed", func() bool {
		st := ra.Status()
		return len(st) == 2 && st[0].Connected && st[1].LastError != "" // sorted: 127.0.0.1 before [::1]
	})
	if n, known := ra.Connected(); n != 1 || known != 1 {
		t.Fatalf("Connected() = %d, %d; want 1, 1; status %+v", n, known, ra.Status())
	}
	if err := readyErr(ra, "all-servers-connected"); err != nil {
		t.Fatal(err)
	}
}

// TestLoadBalancerWithDeadAddress: two servers behind a load balancer whose name has an address that never
// answers (here the AAAA record of a dual-stack name without an IPv6 route). The agent still dials through
// the address that works until it has reached both servers.
func TestLoadBalancerWithDeadAddress(t *testing.T) {
	const name = "lb.konnect.test"
	pki := newTestPKI(t)
	s1 := startUpstreamServer(t, serverOpts{id: "s1", count: 2, ca: pki.ca, serverHost: name})
	s2 := startUpstreamServer(t, serverOpts{id: "s2", count: 2, ca: pki.ca, serverHost: name})
	_, port, _ := net.SplitHostPort(tcpBalancer(t, s1.agentAddr, s2.agentAddr))
	cfg := pki.config(net.JoinHostPort(name, port))
	cfg.Resolver = dnsServer(t, name, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"))
	ra := startAgent(t, cfg)
	harness.EventuallyTrue(t, 10*time.Second, "the agent on both servers behind the load balancer, and ready", func() bool {
		return s1.backends() == 1 && s2.backends() == 1 && readyErr(ra, "all-servers-connected") == nil
	})
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
	harness.EventuallyTrue(t, 10*time.Second, "both agents connected", func() bool {
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

// serversBehindName starts servers s2 on 127.0.0.2 and s3 on 127.0.0.3, on one port, and a DNS responder
// that answers their name with 127.0.0.2 only; cfg points an agent at the name through that responder.
func serversBehindName(t *testing.T) (s2, s3 *upstreamServer, dns *dnsResponder, cfg Config) {
	const name = "servers.konnect.test"
	pki := newTestPKI(t)
	s2 = startUpstreamServer(t, serverOpts{id: "s2", ca: pki.ca, serverHost: name, addr: "127.0.0.2:0"})
	_, port, _ := net.SplitHostPort(s2.agentAddr)
	s3 = startUpstreamServer(t, serverOpts{id: "s3", ca: pki.ca, serverHost: name, addr: "127.0.0.3:" + port})
	dns = startDNS(t, name, true, netip.MustParseAddr("127.0.0.2"))
	cfg = pki.config(net.JoinHostPort(name, port))
	cfg.Resolver = dns.resolver()
	return s2, s3, dns, cfg
}

// TestServersFollowDNS: when the name's answer changes, the agent connects to the new address within
// Config.ResolveInterval, without losing a stream or restarting (ANP issue 273).
func TestServersFollowDNS(t *testing.T) {
	s2, s3, dns, cfg := serversBehindName(t)
	cfg.ResolveInterval = 300 * time.Millisecond
	ra := startAgent(t, cfg)
	harness.EventuallyTrue(t, 10*time.Second, "agent on 127.0.0.2", func() bool { return s2.backends() == 1 })
	dns.set(netip.MustParseAddr("127.0.0.3"))
	// Nothing was lost, so only the periodic lookup can find the new address.
	harness.EventuallyTrue(t, 10*time.Second, "agent on 127.0.0.3", func() bool { return s3.backends() == 1 })
	// The server counts the stream before the agent has read its ID from the handshake.
	harness.EventuallyTrue(t, 10*time.Second, "status with s2 kept and s3 added", func() bool {
		st := ra.Status()
		return len(st) == 2 && st[0].ServerID == "s2" && st[0].Connected && st[1].ServerID == "s3" && st[1].Connected
	})
	if s2.backends() != 1 {
		t.Fatalf("s2 has %d streams from the agent; want the first one kept", s2.backends())
	}
}

// TestLostServerReresolves: the name is not looked up on every sync tick, but at once when a stream to one
// of its addresses ends.
func TestLostServerReresolves(t *testing.T) {
	s2, s3, dns, cfg := serversBehindName(t)
	cfg.ResolveInterval = time.Hour
	ra := startAgent(t, cfg)
	harness.EventuallyTrue(t, 10*time.Second, "agent on 127.0.0.2", func() bool {
		st := ra.Status()
		return s2.backends() == 1 && len(st) == 1 && st[0].Connected
	})
	// A window of many sync ticks (50 ms each): a lookup per tick would be seen here.
	connected := ra.Status()[0].Since
	harness.EventuallyTrue(t, 10*time.Second, "ten sync ticks", func() bool { return time.Since(connected) > 10*cfg.SyncInterval })
	if q := dns.queries.Load(); q > 2 { // one lookup: A and AAAA for the name
		t.Fatalf("%d DNS queries while connected; want one lookup", q)
	}
	// A failure counted against the old address: its series goes when the address does.
	old := ra.Status()[0].Address
	ra.m.connectFailures.WithLabelValues(old).Inc()
	dns.set(netip.MustParseAddr("127.0.0.3"))
	s2.stop()
	harness.EventuallyTrue(t, 10*time.Second, "agent on 127.0.0.3", func() bool { return s3.backends() == 1 })
	harness.EventuallyTrue(t, 10*time.Second, "127.0.0.2 dropped", func() bool {
		st := ra.Status()
		return len(st) == 1 && st[0].ServerID == "s3"
	})
	if ra.m.connectFailures.DeleteLabelValues(old) {
		t.Errorf("konnect_agent_server_connect_failures_total{address=%q} outlived the address", old)
	}
}

// TestStopDuringLookup: a server name whose DNS server never answers does not hold up Run once its context
// is cancelled.
func TestStopDuringLookup(t *testing.T) {
	pki := newTestPKI(t)
	dns := startDNS(t, "servers.konnect.test", false)
	cfg := pki.config("servers.konnect.test:8091")
	cfg.Resolver = dns.resolver()
	ra := startAgent(t, cfg)
	harness.EventuallyTrue(t, 10*time.Second, "a lookup in progress", func() bool { return dns.received.Load() > 0 })
	start := time.Now()
	if err := ra.Stop(t); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Run returned %v after cancel; want under 1s", d)
	}
}
