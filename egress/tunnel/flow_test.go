package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/test/harness"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// A fakeAgent speaks the agent protocol by hand, to play a peer that breaks flow control.
type fakeAgent struct {
	t      *testing.T
	cc     *grpc.ClientConn
	stream agentpb.AgentService_ConnectClient
	offer  *flow.Offer // the server's answer; nil if it did not take flow control up
	answer []string    // the values of the server's answer header
	recv   chan *client.Packet
	done   chan error // the stream's end
	sendMu sync.Mutex
}

// connectFakeAgent opens an agent stream to s with offer ("" offers no flow control).
func connectFakeAgent(t *testing.T, e *env, s *running, id, offer string) *fakeAgent {
	t.Helper()
	var offers []string
	if offer != "" {
		offers = []string{offer}
	}
	return connectFakeAgentOffers(t, e, s, id, offers...)
}

// connectFakeAgentOffers opens an agent stream to s that offers each of offers, one value of the header each.
func connectFakeAgentOffers(t *testing.T, e *env, s *running, id string, offers ...string) *fakeAgent {
	t.Helper()
	cc := connectRaw(t, e, s)
	md := metadata.Pairs(header.AgentID, id)
	for _, o := range offers {
		md.Append(flow.Header, o)
	}
	stream, err := agentpb.NewAgentServiceClient(cc).Connect(metadata.NewOutgoingContext(context.Background(), md))
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := stream.Header()
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{t: t, cc: cc, stream: stream, answer: hdr.Get(flow.Header), recv: make(chan *client.Packet, 1024), done: make(chan error, 1)}
	if o, ok, err := flow.ParseAnswer(a.answer); err != nil {
		t.Fatal(err)
	} else if ok {
		a.offer = &o
	}
	go func() {
		for {
			pkt, err := stream.Recv()
			if err != nil {
				a.done <- err
				close(a.recv)
				return
			}
			if pkt.Type == client.PacketType_CLOSE_REQ {
				// Answered at once, as an agent does: the frontend's client waits for it when it closes.
				id := pkt.GetCloseRequest().ConnectID
				_ = a.sendPacket(&client.Packet{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{
					CloseResponse: &client.CloseResponse{ConnectID: id}}})
			}
			a.recv <- pkt
		}
	}()
	return a
}

// next waits for the next packet of type typ from the server, skipping others.
func (a *fakeAgent) next(typ client.PacketType) *client.Packet {
	a.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case pkt, ok := <-a.recv:
			if !ok {
				a.t.Fatalf("stream ended while waiting for %s", typ)
			}
			if pkt.Type == typ {
				return pkt
			}
		case <-timeout:
			a.t.Fatalf("no %s from the server", typ)
		}
	}
}

// uploadFirst opens the first tunnel through s, which a accepts as connection 1, and writes 1 MiB into it
// in one write, far more than any window: what a then receives of it is what its credit let through.
func uploadFirst(t *testing.T, s *running, a *fakeAgent) {
	t.Helper()
	ch := dialAsync(s.frontend("grpc"), "198.18.0.1:80")
	a.accept(1)
	c := connOf(t, ch)
	go func() { _, _ = c.Write(make([]byte, 1<<20)) }()
}

// dataFor reads the DATA the server sends connection id for d, and returns how many bytes came.
func (a *fakeAgent) dataFor(id int64, d time.Duration) int {
	n, _ := a.readData(id, d, false)
	return n
}

// dataUntilClose reads what the server sends connection id for at most d, until its CLOSE_REQ: the bytes of
// DATA before it, and whether it came.
func (a *fakeAgent) dataUntilClose(id int64, d time.Duration) (int, bool) {
	return a.readData(id, d, true)
}

// readData counts the DATA bytes for connection id that arrive within d; untilClose stops at its CLOSE_REQ,
// and closed says whether one came.
func (a *fakeAgent) readData(id int64, d time.Duration, untilClose bool) (n int, closed bool) {
	end := time.After(d)
	for {
		select {
		case pkt, ok := <-a.recv:
			if !ok {
				return n, false
			}
			switch {
			case pkt.Type == client.PacketType_DATA && pkt.GetData().ConnectID == id:
				n += len(pkt.GetData().Data)
			case untilClose && pkt.Type == client.PacketType_CLOSE_REQ && pkt.GetCloseRequest().ConnectID == id:
				return n, true
			}
		case <-end:
			return n, false
		}
	}
}

func (a *fakeAgent) send(pkt *client.Packet) {
	a.t.Helper()
	if err := a.sendPacket(pkt); err != nil {
		a.t.Fatalf("send %s: %v", pkt.Type, err)
	}
}

func (a *fakeAgent) sendPacket(pkt *client.Packet) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.stream.Send(pkt)
}

// accept answers the next DIAL_REQ with connection id.
func (a *fakeAgent) accept(id int64) {
	a.t.Helper()
	req := a.next(client.PacketType_DIAL_REQ).GetDialRequest()
	a.send(&client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
		DialResponse: &client.DialResponse{Random: req.Random, ConnectID: id}}})
}

func data(id int64, n int) *client.Packet {
	return &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: bytes.Repeat([]byte{'x'}, n)}}}
}

// flowServer runs a gRPC-mode server that authenticates agents by client certificate.
func flowServer(t *testing.T, tune func(*Config)) (*env, *running) {
	t.Helper()
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterCA = e.ca.file
	if tune != nil {
		tune(cfg)
	}
	s := start(t, cfg)
	return e, s
}

const agentOffer = "v1;window=65536;max=1048576"

// dialAsync dials addr through s on a goroutine; the fake agent must answer.
func dialAsync(f Frontend, addr string) chan net.Conn {
	ch := make(chan net.Conn, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := f.Dial(ctx, addr)
		if err != nil {
			close(ch)
			return
		}
		ch <- c
	}()
	return ch
}

func connOf(t *testing.T, ch chan net.Conn) net.Conn {
	t.Helper()
	c, ok := <-ch
	if !ok {
		t.Fatal("dial through the server failed")
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestFlowOffered: the server answers a flow-control offer with its own windows, and an agent that offers
// nothing gets no answer, as from upstream's server.
func TestFlowOffered(t *testing.T) {
	e, s := flowServer(t, func(c *Config) { c.FlowWindow, c.FlowMaxWindow = 32<<10, 2<<20 })
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	if a.offer == nil || *a.offer != (flow.Offer{Window: 32 << 10, Max: 2 << 20}) {
		t.Fatalf("server's answer: %+v", a.offer)
	}
	if b := connectFakeAgent(t, e, s, "b", ""); b.offer != nil {
		t.Fatalf("the server answered an agent that offered nothing: %+v", b.offer)
	}
	if c := connectFakeAgent(t, e, s, "c", "v2;window=1"); c.offer != nil {
		t.Fatalf("the server answered an offer of another version: %+v", c.offer)
	}
	e2, s2 := flowServer(t, func(c *Config) { c.DisableFlowControl = true })
	if d := connectFakeAgent(t, e2, s2, "d", agentOffer); d.offer != nil {
		t.Fatalf("a server without flow control answered: %+v", d.offer)
	}
}

// TestFlowOfferWithUnknownFields: fields this server does not know, with a value that is not a number or
// with no value at all, are skipped, as the specification reserves them for later versions: the server
// answers v1 and holds its uploads to the agent's window.
func TestFlowOfferWithUnknownFields(t *testing.T) {
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", "v1;window=65536;max=1048576;codec=zstd;zerocopy")
	if a.offer == nil {
		t.Fatal("the server did not take up a v1 offer with unknown fields")
	}
	s.waitAgents(t, 1)
	uploadFirst(t, s, a)
	if got := a.dataFor(1, time.Second); got != 65536 {
		t.Fatalf("the agent got %d bytes of a connection it granted 65536", got)
	}
}

// TestFlowSeveralVersionsOffered: an agent that offers a later version first, and v1 after it, gets v1: the
// answer is one value, of v1 and the server's windows, and the server holds its uploads to the agent's v1
// window.
func TestFlowSeveralVersionsOffered(t *testing.T) {
	e, s := flowServer(t, func(c *Config) { c.FlowWindow, c.FlowMaxWindow = 32<<10, 2<<20 })
	a := connectFakeAgentOffers(t, e, s, "a", "v2;window=16384;max=16384;codec=zstd", "v1;window=65536;max=1048576")
	if want := (flow.Offer{Window: 32 << 10, Max: 2 << 20}).String(); len(a.answer) != 1 || a.answer[0] != want {
		t.Fatalf("the server answered %q, want [%q]", a.answer, want)
	}
	s.waitAgents(t, 1)
	uploadFirst(t, s, a)
	if got := a.dataFor(1, time.Second); got != 65536 {
		t.Fatalf("the agent got %d bytes of a connection it granted 65536 in its v1 offer", got)
	}
	// Only versions the server does not know: no flow control, as with no offer.
	if b := connectFakeAgentOffers(t, e, s, "b", "v3;window=65536", "v2;window=65536;max=65536"); len(b.answer) != 0 {
		t.Fatalf("the server answered offers of other versions only: %q", b.answer)
	}
}

// TestFlowAgentStreamsCounted: konnect_tunnel_server_agent_streams counts a stream as v1 only when flow
// control was taken up: an offer of versions the server does not know, no offer, and any offer to a server
// with --flow-control=false count as none. The connect log says which, at Info when a server that offers
// flow control does not get it, with an offer of unknown versions.
func TestFlowAgentStreamsCounted(t *testing.T) {
	logs := harness.CaptureKlog(t)
	want := func(s *running, v1, none float64) {
		t.Helper()
		if g1, gn := gaugeValue(s.metrics.agentStreams.WithLabelValues(flow.Version)), gaugeValue(s.metrics.agentStreams.WithLabelValues(flow.None)); g1 != v1 || gn != none {
			t.Fatalf("agent_streams v1=%v none=%v, want v1=%v none=%v", g1, gn, v1, none)
		}
	}
	e, s := flowServer(t, nil)
	connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	want(s, 1, 0)
	connectFakeAgent(t, e, s, "b", "v2;window=65536;max=65536")
	connectFakeAgent(t, e, s, "c", "")
	s.waitAgents(t, 3)
	want(s, 1, 2)
	e2, s2 := flowServer(t, func(c *Config) { c.DisableFlowControl = true })
	connectFakeAgent(t, e2, s2, "d", agentOffer)
	s2.waitAgents(t, 1)
	want(s2, 0, 1)
	lines := strings.Split(logs(), "\n")
	for agent, msg := range map[string]string{
		"a": `] "Agent stream connected; flow control: v1"`,
		"b": `] "Agent offered only flow-control versions this server does not know (v1): connections of this agent share the stream's pace, as with upstream" agentID="b"`,
		"c": `] "Agent did not take up flow control: connections of this agent share the stream's pace, as with upstream" agentID="c"`,
		"d": `] "Agent stream connected; flow control is off (--flow-control=false)"`,
	} {
		n := 0
		for _, l := range lines {
			if strings.Contains(l, msg) && strings.Contains(l, `agentID="`+agent+`"`) {
				n++
				if agent == "b" && !strings.Contains(l, `offer=["v2;window=65536;max=65536"]`) {
					t.Errorf("the log of an offer of unknown versions does not show it: %s", l)
				}
			}
		}
		if n != 1 {
			t.Errorf("agent %s: %d lines with %s, want 1", agent, n, msg)
		}
	}
	for _, l := range lines {
		if (strings.Contains(l, "did not take up") || strings.Contains(l, "does not know")) && strings.Contains(l, `agentID="a"`) {
			t.Errorf("a v1 stream logged as without flow control: %s", l)
		}
	}
}

// TestFlowAgentIgnoresWindow: an agent that sends a connection more than the server's window gets that
// connection closed, counted, and its excess is never delivered; the agent's other connections carry on.
func TestFlowAgentIgnoresWindow(t *testing.T) {
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	f := s.frontend("grpc")
	window := a.offer.Window

	good := dialAsync(f, "198.18.0.1:80")
	a.accept(1)
	gc := connOf(t, good)
	bad := dialAsync(f, "198.18.0.1:81")
	a.accept(2)
	bc := connOf(t, bad)

	// Connection 1 gets exactly its window before any grant: fine. Connection 2 gets a byte more.
	a.send(data(1, window))
	_ = gc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(gc, make([]byte, window)); err != nil {
		t.Fatalf("the window's worth: %v", err)
	}
	a.send(data(2, window+1))
	harness.EventuallyTrue(t, 10*time.Second, "a window_exceeded violation", func() bool {
		return counterValue(s.metrics.flowViolations.WithLabelValues(flowWindowExceeded)) == 1
	})
	_ = bc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, _ := io.Copy(io.Discard, bc); n != 0 {
		t.Errorf("the frontend got %d bytes of data that broke the window", n)
	}
	if pkt := a.next(client.PacketType_CLOSE_REQ); pkt.GetCloseRequest().ConnectID != 2 {
		t.Fatalf("CLOSE_REQ for %d", pkt.GetCloseRequest().ConnectID)
	}
	// The other connection is untouched.
	a.send(data(1, 1000))
	_ = gc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(gc, make([]byte, 1000)); err != nil {
		t.Fatalf("the other connection: %v", err)
	}
}

// TestFlowAgentNeverGrants: an agent that grants no credit gets exactly its window of a connection's
// upload, and nothing more; the frontend's writer is held back, not the server, and the agent's other
// connections carry on. A grant releases exactly that much more. The time without credit is counted.
func TestFlowAgentNeverGrants(t *testing.T) {
	began := time.Now()
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	f := s.frontend("grpc")

	uploadFirst(t, s, a)

	if got := a.dataFor(1, time.Second); got != 65536 {
		t.Fatalf("the agent got %d bytes of a connection it granted 65536", got)
	}
	other := dialAsync(f, "198.18.0.1:81")
	a.accept(2)
	oc := connOf(t, other)
	if _, err := oc.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if got := a.dataFor(2, 500*time.Millisecond); got != 5 {
		t.Fatalf("the other connection's 5 bytes: got %d", got)
	}
	a.send(flow.EncodeGrants(map[int64]int64{1: 10000}))
	if got := a.dataFor(1, time.Second); got != 10000 {
		t.Fatalf("a grant of 10000 released %d bytes", got)
	}
	// Connection 1 ran out of credit as the first second began, and got some only with the grant after the
	// 1.5 s: most of that is counted, and never more than the whole test took.
	if v := counterValue(s.metrics.creditWait); v < 1 || v > time.Since(began).Seconds() {
		t.Errorf("konnect_tunnel_server_flow_credit_wait_seconds_total %.3f after 1.5 s without credit, %s into the test", v, time.Since(began))
	}
	// The rest, so that the writer finishes and the connection closes in order.
	a.send(flow.EncodeGrants(map[int64]int64{1: 1<<20 - 65536 - 10000}))
	if got := a.dataFor(1, time.Second); got != 1<<20-65536-10000 {
		t.Fatalf("the rest: %d bytes", got)
	}
}

// TestFlowCloseFollowsWaitingData: kube-apiserver writes 1 MiB into a tunnel and closes it at once, while
// the agent has granted only its first window. The CLOSE_REQ waits behind the data that waits for credit:
// none comes while the agent grants nothing, and once it grants the rest, every byte reaches it before the
// CLOSE_REQ does. A close that overtook its data would cut the upload short at the backend.
func TestFlowCloseFollowsWaitingData(t *testing.T) {
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	ch := dialAsync(s.frontend("grpc"), "198.18.0.1:80")
	a.accept(1)
	c := connOf(t, ch)
	go func() {
		_, _ = c.Write(make([]byte, 1<<20))
		c.Close()
	}()
	const total = 1 << 20
	got, closed := a.dataUntilClose(1, 1500*time.Millisecond)
	if closed || got != 65536 {
		t.Fatalf("with only the first window granted: %d bytes, CLOSE_REQ %v; want 65536 and no CLOSE_REQ yet", got, closed)
	}
	a.send(flow.EncodeGrants(map[int64]int64{1: total - 65536}))
	rest, closed := a.dataUntilClose(1, 20*time.Second)
	if !closed || got+rest != total {
		t.Fatalf("after the grant: %d of %d bytes before the CLOSE_REQ (CLOSE_REQ %v)", got+rest, total, closed)
	}
}

// TestFlowAgentGrantsTooMuch: credit beyond the agent's announced largest window closes that connection.
func TestFlowAgentGrantsTooMuch(t *testing.T) {
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	ch := dialAsync(s.frontend("grpc"), "198.18.0.1:80")
	a.accept(7)
	c := connOf(t, ch)
	a.send(flow.EncodeGrants(map[int64]int64{7: 1 << 20})) // 64 KiB + 1 MiB of credit, with a 1 MiB largest window
	harness.EventuallyTrue(t, 10*time.Second, "a credit_overflow violation", func() bool {
		return counterValue(s.metrics.flowViolations.WithLabelValues(flowCreditOverflow)) == 1
	})
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection stayed open")
	}
}

// TestFlowGrantRacesClose: a grant for a connection that just closed, or never existed, is no fault.
func TestFlowGrantRacesClose(t *testing.T) {
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	ch := dialAsync(s.frontend("grpc"), "198.18.0.1:80")
	a.accept(3)
	c := connOf(t, ch)
	c.Close()
	a.next(client.PacketType_CLOSE_REQ)
	a.send(flow.EncodeGrants(map[int64]int64{3: 1000, 99: 1000}))
	ch = dialAsync(s.frontend("grpc"), "198.18.0.1:80")
	a.accept(4)
	c = connOf(t, ch)
	a.send(data(4, 10))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
		t.Fatalf("after stray grants: %v", err)
	}
	for _, r := range []string{flowWindowExceeded, flowCreditOverflow, flowMalformed} {
		if v := counterValue(s.metrics.flowViolations.WithLabelValues(r)); v != 0 {
			t.Errorf("%s: %v", r, v)
		}
	}
}

// TestFlowMalformedGrant ends the agent's stream with the reason, and counts it.
func TestFlowMalformedGrant(t *testing.T) {
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	a.send(&client.Packet{Type: flow.GrantType, Payload: &client.Packet_Data{Data: &client.Data{Data: []byte{0x80}}}})
	select {
	case err := <-a.done:
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("stream ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream stayed open")
	}
	if v := counterValue(s.metrics.flowViolations.WithLabelValues(flowMalformed)); v != 1 {
		t.Fatalf("malformed: %v", v)
	}
}

// TestFlowBadOfferRefused: a v1 offer out of bounds is refused with the reason.
func TestFlowBadOfferRefused(t *testing.T) {
	e, s := flowServer(t, nil)
	for _, offer := range []string{"v1;window=1;max=2", "v1;window=65536;max=1099511627776", "v1;window=x"} {
		cc := connectRaw(t, e, s)
		md := metadata.Pairs(header.AgentID, "bad", flow.Header, offer)
		stream, err := agentpb.NewAgentServiceClient(cc).Connect(metadata.NewOutgoingContext(context.Background(), md))
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("offer %q: %v", offer, err)
		}
	}
}

// connectRaw opens a gRPC connection to s's agent port with the agent's client certificate.
func connectRaw(t *testing.T, e *env, s *running) *grpc.ClientConn {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(e.agentCert, e.agentKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := os.ReadFile(e.ca.file)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	cc, err := grpc.NewClient("passthrough:///"+s.AgentAddr(), grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestFlowUpstreamAgentKeepsConnectionBuffer: an agent that offers no flow control (upstream's) gets
// --connection-buffer-bytes per connection, as before flow control, even on a server that uses it: a
// connection whose reader stops holds that much, and the agent stream waits, not the server's memory. And
// it is sent nothing but upstream's packet types: upstream's agent ignores an unknown type without a word,
// so only this check would see a grant sent to it.
func TestFlowUpstreamAgentKeepsConnectionBuffer(t *testing.T) {
	const limit = 64 << 10
	e, s := flowServer(t, func(c *Config) { c.ConnectionBuffer = limit; c.StallTimeout = 3 * time.Second })
	a := connectFakeAgent(t, e, s, "up", "") // upstream's agent: no offer
	s.waitAgents(t, 1)
	ch := dialAsync(s.frontend("grpc"), "198.18.0.1:80")
	a.accept(1)
	pc := connOf(t, ch) // not read until the queue is full
	// Only after the DIAL_REQ, which accept reads from the same channel.
	var foreign atomic.Int32 // packets of a type upstream does not know
	go func() {
		for p := range a.recv {
			if _, known := client.PacketType_name[int32(p.Type)]; !known {
				foreign.Add(1)
			}
		}
	}()
	go func() {
		for range 64 {
			if a.sendPacket(data(1, 64<<10)) != nil {
				return
			}
		}
	}()
	// The queue is full once a push waits for the reader; without a limit, it grows instead.
	deadline := time.Now().Add(10 * time.Second)
	for counterValue(s.metrics.stalledWaits) == 0 && gaugeValue(s.metrics.queuedBytes) <= 2*limit {
		if time.Now().After(deadline) {
			t.Fatalf("the queue neither filled nor grew in 10 s: %v bytes queued", gaugeValue(s.metrics.queuedBytes))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if q := gaugeValue(s.metrics.queuedBytes); q > 2*limit {
		t.Errorf("%v bytes queued for one reader with --connection-buffer-bytes=%d", q, limit)
	}
	// The reader comes back in time, and gets everything.
	_ = pc.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(pc, make([]byte, 64*64<<10)); err != nil {
		t.Fatalf("the reader, once back: %v", err)
	}
	if n := foreign.Load(); n > 0 {
		t.Fatalf("the server sent an agent without flow control %d packets of a type upstream does not know", n)
	}
}

// TestFlowSmallPacketsWithinWindow: a connection whose reader stopped takes its whole window, even in tiny
// DATA packets, without ever making the agent stream wait: another connection of that agent gets its data at
// once, and the paused one is not closed as stalled.
func TestFlowSmallPacketsWithinWindow(t *testing.T) {
	e, s := flowServer(t, func(c *Config) {
		c.ConnectionBuffer = 64 << 10
		c.FlowWindow, c.FlowMaxWindow = 1<<20, 1<<20
		c.StallTimeout = 2 * time.Second
	})
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	f := s.frontend("grpc")
	paused := dialAsync(f, "198.18.0.1:80")
	a.accept(1)
	pc := connOf(t, paused) // not read until the end
	other := dialAsync(f, "198.18.0.1:81")
	a.accept(2)
	oc := connOf(t, other)
	go func() {
		for range a.recv {
		}
	}()
	// Exactly the window, in 16-byte packets: counted with their packets, 5 MiB, more than the 2 MiB that
	// frontend queues took before small packets were merged, and than what the frontend's client buffers.
	const packets, size = (1 << 20) / 16, 16
	start := time.Now()
	sent := make(chan time.Time, 1)
	go func() {
		for range packets {
			if a.sendPacket(data(1, size)) != nil {
				return
			}
		}
		sent <- time.Now()
		_ = a.sendPacket(data(2, 10))
	}()
	got := make(chan error, 1)
	go func() { _, err := io.ReadFull(oc, make([]byte, 10)); got <- err }()
	select {
	case err := <-got:
		at := time.Now()
		if err != nil {
			t.Fatalf("the other connection: %v", err)
		}
		last := <-sent
		t.Logf("the window went out in %v; the other connection's 10 bytes came %v after it", last.Sub(start), at.Sub(last))
		// Under the race detector the server takes seconds just to read 65536 messages.
		if at.Sub(last) > time.Second && !raceDetector {
			t.Errorf("the other connection's 10 bytes came %v after the paused one's window", at.Sub(last))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the other connection got nothing in 60 s")
	}
	if v := counterValue(s.metrics.stalledWaits); v != 0 {
		t.Errorf("the agent stream waited %v times for a connection within its window", v)
	}
	if v := counterValue(s.metrics.stalledClosed); v != 0 {
		t.Errorf("a connection within its window was closed as stalled (%v)", v)
	}
	if raceDetector {
		// The window can take longer than konnectivity-client's 10 s read timeout to arrive, after which
		// the client itself closes the tunnel it was not reading.
		return
	}
	// The paused reader still gets its whole window.
	_ = pc.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(pc, make([]byte, packets*size)); err != nil {
		t.Fatalf("the paused reader, once back: %v", err)
	}
}

// TestFlowDialedAfterFrontendEnded: a DIAL_RSP that binds a connection to a frontend that has just ended
// leaves nothing behind on the agent: no one would ever forget it, and it would hold its window's accounting
// for the agent stream's lifetime.
func TestFlowDialedAfterFrontendEnded(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{metrics: m, cfg: Config{FlowWindow: 64 << 10, FlowMaxWindow: 1 << 20}}
	f := &frontendFlow{close: func() {}, queue: newFrontendQueue(s, nil, func() {})}
	s.dials = &pendingDials{dials: map[int64]*pendingDial{7: {random: 7, s: &dialStream{flow: f}}}}
	a := newAgentFlow(s, flow.Offer{Window: 64 << 10, Max: 1 << 20}, func(*client.Packet) error { return nil })
	defer a.end()
	f.end() // the frontend ends as the agent's answer passes
	a.dialed(&client.DialResponse{Random: 7, ConnectID: 3})
	if c := a.conn(3); c != nil {
		t.Error("the agent stream keeps a connection whose frontend had ended")
	}
	if f.conn(3) != nil {
		t.Error("an ended frontend took a connection")
	}
}

// TestFlowViolationCountedOnce: an agent that keeps sending past a connection's window breaks flow control
// once, on that connection: it is counted, logged and closed once, and the rest of its data is dropped.
func TestFlowViolationCountedOnce(t *testing.T) {
	e, s := flowServer(t, nil)
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	f := s.frontend("grpc")
	good := dialAsync(f, "198.18.0.1:80")
	a.accept(1)
	gc := connOf(t, good)
	bad := dialAsync(f, "198.18.0.1:81")
	a.accept(2)
	_ = connOf(t, bad)
	a.send(data(2, a.offer.Window+1))
	for range 50 {
		a.send(data(2, 1000))
	}
	a.send(data(1, 1000)) // after all of them on the stream
	_ = gc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(gc, make([]byte, 1000)); err != nil {
		t.Fatalf("the other connection: %v", err)
	}
	if v := counterValue(s.metrics.flowViolations.WithLabelValues(flowWindowExceeded)); v != 1 {
		t.Errorf("one connection's violation was counted %v times", v)
	}
}

// TestFlowPausedReaderHoldsItsWindow: a frontend reader that stops makes the agent send that connection no
// more than what the reader's own gRPC window took plus the server's window. The server grants a message
// back only once its connection to kube-apiserver has carried it, not when gRPC took it: gRPC would hold
// up to two more messages for a reader that takes nothing.
func TestFlowPausedReaderHoldsItsWindow(t *testing.T) {
	const window = 64 << 10
	// A window that cannot grow: the reader's window fills at full speed, which would let it double once.
	e, s := flowServer(t, func(c *Config) { c.FlowWindow, c.FlowMaxWindow = window, window })
	a := connectFakeAgent(t, e, s, "a", agentOffer)
	s.waitAgents(t, 1)
	const readerWindow = 64 << 10 // set, so that gRPC's estimate does not grow it
	fe := rawFrontend(t, s.cfg.UDSName, grpc.WithInitialWindowSize(readerWindow), grpc.WithInitialConnWindowSize(readerWindow))
	if err := fe.Send(dialReq(1, "198.18.0.1:80")); err != nil {
		t.Fatal(err)
	}
	a.accept(1)
	if rsp, err := fe.Recv(); err != nil || rsp.GetDialResponse().GetConnectID() != 1 {
		t.Fatalf("dial: %v %v", rsp, err)
	}
	// The agent sends whatever it is granted, 16 KiB at a time, until no grant has come for a second.
	credit, sent := int64(a.offer.Window), int64(0)
	for {
		for credit > 0 {
			n := min(credit, 16<<10)
			a.send(data(1, int(n)))
			credit -= n
			sent += n
		}
		select {
		case pkt, ok := <-a.recv:
			if !ok {
				t.Fatal("agent stream ended")
			}
			if pkt.Type == flow.GrantType {
				if err := flow.DecodeGrants(pkt, func(id, n int64) error {
					if id == 1 {
						credit += n
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			continue
		case <-time.After(time.Second):
		}
		break
	}
	// One packet more may come of grants a little early (sentLedger counts a message at its fewest bytes).
	if bound := int64(readerWindow + window + 16<<10); sent > bound {
		t.Fatalf("a paused reader got the agent to send %d bytes, want at most %d (its gRPC window and the server's window)", sent, bound)
	}
	t.Logf("sent %d bytes for a paused reader", sent)
}
