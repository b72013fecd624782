package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/test/harness"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// scriptedServer plays a server that takes flow control up (or not) and then does what the test says, to
// check the agent against peers that break the protocol.
type scriptedServer struct {
	agentpb.UnimplementedAgentServiceServer
	answers []string // the values of the server's Header answer; none, or "", takes no flow control up
	streams chan *scriptedStream
	addr    string
}

type scriptedStream struct {
	t      *testing.T
	stream agentpb.AgentService_ConnectServer
	offer  string // the agent's offer
	recv   chan *client.Packet
	sendMu sync.Mutex
	end    chan struct{} // closing it ends the stream from the server's side
	// foreign counts the packets of a type upstream's server does not know, which it would ignore
	// without a word.
	foreign atomic.Int32
}

func startScriptedServer(t *testing.T, pki *testPKI, answers ...string) *scriptedServer {
	t.Helper()
	s := &scriptedServer{answers: answers, streams: make(chan *scriptedStream, 10)}
	s.addr = fakeServer(t, pki, s)
	return s
}

func (s *scriptedServer) Connect(stream agentpb.AgentService_ConnectServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	h := metadata.Pairs(header.ServerID, "scripted", header.ServerCount, "1")
	for _, a := range s.answers {
		if a != "" {
			h.Append(flow.Header, a)
		}
	}
	if err := stream.SendHeader(h); err != nil {
		return err
	}
	ss := &scriptedStream{stream: stream, recv: make(chan *client.Packet, 4096), end: make(chan struct{})}
	if v := md.Get(flow.Header); len(v) == 1 {
		ss.offer = v[0]
	}
	go func() {
		defer close(ss.recv)
		for {
			pkt, err := stream.Recv()
			if err != nil {
				return
			}
			if _, known := client.PacketType_name[int32(pkt.Type)]; !known {
				ss.foreign.Add(1)
			}
			ss.recv <- pkt
		}
	}()
	s.streams <- ss
	select {
	case <-ss.end:
	case <-stream.Context().Done():
	}
	return nil
}

func (s *scriptedServer) next(t *testing.T) *scriptedStream {
	t.Helper()
	select {
	case ss := <-s.streams:
		ss.t = t
		return ss
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not connect")
		return nil
	}
}

func (ss *scriptedStream) send(pkt *client.Packet) {
	ss.t.Helper()
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	if err := ss.stream.Send(pkt); err != nil {
		ss.t.Fatalf("send %s: %v", pkt.Type, err)
	}
}

// dial asks the agent to dial addr and returns the connection ID of its answer.
func (ss *scriptedStream) dial(addr string, random int64) int64 {
	ss.t.Helper()
	ss.send(&client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{
		DialRequest: &client.DialRequest{Protocol: "tcp", Address: addr, Random: random}}})
	rsp := ss.wait(client.PacketType_DIAL_RSP).GetDialResponse()
	if rsp.Error != "" || rsp.Random != random {
		ss.t.Fatalf("DIAL_RSP %+v", rsp)
	}
	return rsp.ConnectID
}

// wait returns the next packet of type typ, skipping others.
func (ss *scriptedStream) wait(typ client.PacketType) *client.Packet {
	ss.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case pkt, ok := <-ss.recv:
			if !ok {
				ss.t.Fatalf("the stream ended while waiting for %s", typ)
			}
			if pkt.Type == typ {
				return pkt
			}
		case <-timeout:
			ss.t.Fatalf("no %s from the agent", typ)
		}
	}
}

// dataFor counts the bytes of DATA for connection id that arrive within d.
func (ss *scriptedStream) dataFor(id int64, d time.Duration) int {
	return ss.dataAtLeast(id, math.MaxInt, d)
}

// dataAtLeast counts DATA bytes for connection id until there are want of them, or d has passed.
func (ss *scriptedStream) dataAtLeast(id int64, want int, d time.Duration) int {
	n := 0
	end := time.After(d)
	for n < want {
		select {
		case pkt, ok := <-ss.recv:
			if !ok {
				return n
			}
			if pkt.Type == client.PacketType_DATA && pkt.GetData().ConnectID == id {
				n += len(pkt.GetData().Data)
			}
		case <-end:
			return n
		}
	}
	return n
}

func dataPacket(id int64, n int) *client.Packet {
	return &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: bytes.Repeat([]byte{'x'}, n)}}}
}

// firehose is a backend that writes to every connection as fast as it is read, and counts what it wrote.
func firehose(t *testing.T) (string, *atomic.Int64, chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wrote atomic.Int64
	closed := make(chan struct{}, 10)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { closed <- struct{}{} }()
				buf := make([]byte, 32<<10)
				for {
					_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
					n, err := c.Write(buf)
					wrote.Add(int64(n))
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), &wrote, closed
}

const serverAnswer = "v1;window=65536;max=1048576"

// TestFlowAgentOffers: the agent offers its windows, and with a server that answers nothing (upstream's)
// it sends without waiting for grants, as before, and sends nothing but upstream's packet types, grants
// included, also for data it receives.
func TestFlowAgentOffers(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, "")
	hose, _, _ := firehose(t)
	startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	if want := (flow.Offer{Window: flow.DefaultWindow, Max: flow.DefaultMaxWindow}).String(); ss.offer != want {
		t.Fatalf("the agent offered %q, want %q", ss.offer, want)
	}
	id := ss.dial(hose, 1)
	// With flow control it would stop at its first window; unthrottled, it passes the largest window
	// without a single grant. Only how much is checked, not how fast, which a loaded machine decides.
	// Data to the agent, past its window: a receiver under flow control would grant it back.
	for range 4 {
		ss.send(dataPacket(id, flow.DefaultWindow))
	}
	if got := ss.dataAtLeast(id, 2*flow.DefaultMaxWindow, 30*time.Second); got < 2*flow.DefaultMaxWindow {
		t.Fatalf("without flow control and without grants the agent sent %d bytes, want it unthrottled", got)
	}
	if n := ss.foreign.Load(); n > 0 {
		t.Fatalf("the agent sent a server without flow control %d packets of a type upstream does not know", n)
	}
}

// TestFlowServerNeverGrants: the agent sends a connection exactly the server's window and then stops reading
// its backend, which waits in its own socket; a grant releases exactly that much more. The time without
// credit is counted.
func TestFlowServerNeverGrants(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer)
	hose, wrote, _ := firehose(t)
	began := time.Now()
	ra := startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	id := ss.dial(hose, 1)
	if got := ss.dataFor(id, time.Second); got != 65536 {
		t.Fatalf("the agent sent %d bytes of a 65536-byte window", got)
	}
	// The backend is held back by TCP: what it wrote is what the agent read plus the kernel's buffers.
	if w := wrote.Load(); w > 64<<20 {
		t.Fatalf("the backend wrote %d bytes: the agent kept reading it", w)
	}
	ss.send(flow.EncodeGrants(map[int64]int64{id: 10000}))
	if got := ss.dataFor(id, time.Second); got != 10000 {
		t.Fatalf("a grant of 10000 released %d bytes", got)
	}
	// The agent ran out of credit as the first second began, and got some only with the grant after it: most
	// of that second is counted (not all of it: the agent reached its wait a moment after the test began to
	// count), and never more than the whole test took.
	if v := counterValue(ra.m.creditWait); v < 0.5 || v > time.Since(began).Seconds() {
		t.Errorf("konnect_agent_flow_credit_wait_seconds_total %.3f after a second without credit, %s into the test", v, time.Since(began))
	}
}

// TestFlowAnswerWithUnknownFields: the agent skips fields of the server's answer it does not know, with a
// value that is not a number or with none, and uses v1 with the server's window.
func TestFlowAnswerWithUnknownFields(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer+";codec=zstd;zerocopy")
	hose, _, _ := firehose(t)
	ra := startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	id := ss.dial(hose, 1)
	if got := ss.dataFor(id, time.Second); got != 65536 {
		t.Fatalf("the agent sent %d bytes of a 65536-byte window", got)
	}
	if err := notReady(ra); err != nil {
		t.Fatalf("not ready: %v", err)
	}
}

// TestFlowAnswerNotOffered: an answer the agent cannot take, of a version it did not offer or with more than
// one value, ends the stream with the reason: the server would go on under a protocol the agent does not
// speak, and wait for grants that never come.
func TestFlowAnswerNotOffered(t *testing.T) {
	for _, answers := range [][]string{
		{"v2;window=65536;max=1048576"},
		{serverAnswer, serverAnswer},
	} {
		t.Run(answers[0], func(t *testing.T) {
			pki := newTestPKI(t)
			srv := startScriptedServer(t, pki, answers...)
			ra := startAgent(t, pki.config(srv.addr))
			srv.next(t)
			harness.EventuallyTrue(t, 10*time.Second, "the answer refused", func() bool {
				st := ra.Status()
				return len(st) == 1 && !st[0].Connected && strings.Contains(st[0].LastError, flow.Header+" answer")
			})
			if err := notReady(ra); err == nil {
				t.Fatal("ready on a server whose answer it refused")
			}
		})
	}
}

// TestFlowServerStreamsByFlowControl: konnect_agent_server_streams and the agent's status count a stream to
// konnect's server as v1, and one to upstream's server as none; each goes when its stream does.
func TestFlowServerStreamsByFlowControl(t *testing.T) {
	streams := func(ra *runningAgent) (v1, none float64) {
		var m dto.Metric
		for fc, v := range map[string]*float64{flow.Version: &v1, flow.None: &none} {
			if err := ra.m.serverStreams.WithLabelValues(fc).Write(&m); err != nil {
				t.Fatal(err)
			}
			*v = m.GetGauge().GetValue()
		}
		return v1, none
	}
	const notTaken = `"Server did not take up flow control: connections of this agent share the stream's pace, as with upstream"`
	t.Run("konnect", func(t *testing.T) {
		logs := harness.CaptureKlog(t)
		pki := newTestPKI(t)
		ks := startKonnectServer(t, pki, "k1", 1, "grpc")
		ra := startAgent(t, pki.config(ks.srv.AgentAddr()))
		harness.EventuallyTrue(t, 10*time.Second, "one v1 stream", func() bool {
			v1, none := streams(ra)
			return v1 == 1 && none == 0
		})
		if l := logs(); !strings.Contains(l, `"Connected to server" serverID="k1"`) || !strings.Contains(l, `flowControl="v1"`) || strings.Contains(l, notTaken) {
			t.Errorf("the connect log does not say the stream runs flow control v1:\n%s", l)
		}
		rep := statusReport(t, ra)
		if rep.FlowControl != flow.Version || len(rep.Servers) != 1 {
			t.Fatalf("status %+v: want the agent offering %s, and one server", rep, flow.Version)
		}
		if s := rep.Servers[0]; !s.Connected || s.ServerID != "k1" || s.FlowControl != flow.Version ||
			s.ServerWindow != flow.DefaultWindow || s.ServerMaxWindow != flow.DefaultMaxWindow {
			t.Errorf("status of the server %+v: want k1 connected, flow control %s with the server's default windows", s, flow.Version)
		}
	})
	t.Run("upstream", func(t *testing.T) {
		logs := harness.CaptureKlog(t)
		_, srv, ra := agentOnServer(t, nil)
		harness.EventuallyTrue(t, 10*time.Second, "one stream without flow control", func() bool {
			v1, none := streams(ra)
			return v1 == 0 && none == 1
		})
		if l := logs(); !strings.Contains(l, `flowControl="none"`) || !strings.Contains(l, notTaken+` serverID="s1"`) {
			t.Errorf("the connect log does not say the server did not take up flow control:\n%s", l)
		}
		if rep := statusReport(t, ra); len(rep.Servers) != 1 || rep.Servers[0].FlowControl != flow.None || rep.Servers[0].ServerWindow != 0 {
			t.Errorf("status %+v: want one server without flow control", rep)
		}
		srv.stop()
		harness.EventuallyTrue(t, 10*time.Second, "no stream once the server is gone", func() bool {
			v1, none := streams(ra)
			return v1 == 0 && none == 0
		})
	})
}

// TestFlowServerIgnoresWindow: a server that sends a connection more than the agent's window gets that
// connection closed with the reason, and counted; the agent's other connections carry on.
func TestFlowServerIgnoresWindow(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer)
	echo := harness.StartEcho(t).Addr
	ra := startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	good, bad := ss.dial(echo, 1), ss.dial(echo, 2)
	ss.send(dataPacket(bad, flow.DefaultWindow+1))
	rsp := ss.wait(client.PacketType_CLOSE_RSP).GetCloseResponse()
	if rsp.ConnectID != bad || !strings.Contains(rsp.Error, "flow control") {
		t.Fatalf("CLOSE_RSP %+v", rsp)
	}
	if v := counterValue(ra.m.flowViolations.WithLabelValues(flowWindowExceeded)); v != 1 {
		t.Fatalf("window_exceeded: %v", v)
	}
	ss.send(dataPacket(good, 1000))
	if got := ss.dataFor(good, 2*time.Second); got != 1000 {
		t.Fatalf("the other connection echoed %d of 1000 bytes", got)
	}
}

// TestFlowServerGrantsTooMuch: credit beyond the server's announced largest window closes that connection.
func TestFlowServerGrantsTooMuch(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer)
	echo := harness.StartEcho(t).Addr
	ra := startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	id := ss.dial(echo, 1)
	ss.send(flow.EncodeGrants(map[int64]int64{id: 1 << 20}))
	rsp := ss.wait(client.PacketType_CLOSE_RSP).GetCloseResponse()
	if rsp.ConnectID != id || !strings.Contains(rsp.Error, "flow control") {
		t.Fatalf("CLOSE_RSP %+v", rsp)
	}
	if v := counterValue(ra.m.flowViolations.WithLabelValues(flowCreditOverflow)); v != 1 {
		t.Fatalf("credit_overflow: %v", v)
	}
}

// TestFlowGrantAfterClose: grants for a connection that is closed, or was never open, are no fault.
func TestFlowGrantAfterClose(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer)
	echo := harness.StartEcho(t).Addr
	ra := startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	id := ss.dial(echo, 1)
	ss.send(&client.Packet{Type: client.PacketType_CLOSE_REQ, Payload: &client.Packet_CloseRequest{CloseRequest: &client.CloseRequest{ConnectID: id}}})
	ss.wait(client.PacketType_CLOSE_RSP)
	ss.send(flow.EncodeGrants(map[int64]int64{id: 1000, 12345: 1000}))
	next := ss.dial(echo, 2)
	ss.send(dataPacket(next, 100))
	if got := ss.dataFor(next, 2*time.Second); got != 100 {
		t.Fatalf("after stray grants the next connection echoed %d of 100 bytes", got)
	}
	for _, r := range []string{flowWindowExceeded, flowCreditOverflow, flowMalformed} {
		if v := counterValue(ra.m.flowViolations.WithLabelValues(r)); v != 0 {
			t.Errorf("%s: %v", r, v)
		}
	}
}

// TestFlowMalformedGrant ends the session, and the agent connects again.
func TestFlowMalformedGrant(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer)
	ra := startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	ss.send(&client.Packet{Type: flow.GrantType, Payload: &client.Packet_Data{Data: &client.Data{Data: []byte{0x80}}}})
	srv.next(t) // a new stream
	if v := counterValue(ra.m.flowViolations.WithLabelValues(flowMalformed)); v != 1 {
		t.Fatalf("malformed: %v", v)
	}
}

// TestFlowReconnectDuringTransfer: a session that ends while a connection waits for credit closes that
// connection's backend at once, and the agent connects again and serves new dials.
func TestFlowReconnectDuringTransfer(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer)
	hose, _, closed := firehose(t)
	startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	id := ss.dial(hose, 1)
	if got := ss.dataFor(id, 500*time.Millisecond); got != 65536 {
		t.Fatalf("%d bytes of a 65536-byte window", got)
	}
	close(ss.end) // the server goes away while the agent waits for credit
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend connection stayed open after its session ended")
	}
	ss2 := srv.next(t)
	echo := harness.StartEcho(t).Addr
	id2 := ss2.dial(echo, 2)
	ss2.send(dataPacket(id2, 100))
	if got := ss2.dataFor(id2, 2*time.Second); got != 100 {
		t.Fatalf("after the reconnect: %d of 100 bytes", got)
	}
}

// TestFlowTinyPacketsAreMerged: a window of 1-byte DATA packets for a backend that is not writing yet waits
// as a few merged buffers, in order, not as a slice and an allocation per byte.
func TestFlowTinyPacketsAreMerged(t *testing.T) {
	a := &Agent{cfg: Config{ConnectionBuffer: flow.DefaultLimit, StallTimeout: time.Minute,
		FlowWindow: flow.DefaultWindow, FlowMaxWindow: flow.DefaultMaxWindow}}
	s := &session{a: a, ctx: context.Background(), flow: &flow.Offer{Window: flow.DefaultWindow, Max: flow.DefaultMaxWindow},
		budget: flow.NewBudget(flow.DefaultMaxWindow)}
	c := newConn(s, 1, nil)
	const window = flow.DefaultWindow
	for i := range window {
		c.enqueue([]byte{byte(i)})
	}
	if c.q.Len() != window {
		t.Fatalf("%d bytes queued for %d", c.q.Len(), window)
	}
	c.q.Close()
	var got []byte
	items := 0
	ended := make(chan error, 1)
	c.q.Start(func(batch [][]byte) error {
		for _, b := range batch {
			items++
			got = append(got, b...)
		}
		return nil
	}, func(err error) { ended <- err })
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != byte(i) {
			t.Fatalf("byte %d mangled", i)
		}
	}
	if len(got) != window || items > window/flow.Piece+1 {
		t.Errorf("%d 1-byte packets were written as %d items (%d bytes)", window, items, len(got))
	}
}

// TestFlowViolationCountedOnce: a server that keeps sending past a connection's window breaks flow control
// once, on that connection: it is counted, logged and closed once, and the rest of its data is dropped.
func TestFlowViolationCountedOnce(t *testing.T) {
	pki := newTestPKI(t)
	srv := startScriptedServer(t, pki, serverAnswer)
	echo := harness.StartEcho(t).Addr
	ra := startAgent(t, pki.config(srv.addr))
	ss := srv.next(t)
	good, bad := ss.dial(echo, 1), ss.dial(echo, 2)
	ss.send(dataPacket(bad, flow.DefaultWindow+1))
	for range 50 {
		ss.send(dataPacket(bad, 1000))
	}
	ss.send(dataPacket(good, 1000)) // after all of them on the stream
	if got := ss.dataFor(good, 5*time.Second); got != 1000 {
		t.Fatalf("the other connection echoed %d of 1000 bytes", got)
	}
	if v := counterValue(ra.m.flowViolations.WithLabelValues(flowWindowExceeded)); v != 1 {
		t.Errorf("one connection's violation was counted %v times", v)
	}
}

// statusReport reads the agent's status as its status endpoint serves it.
func statusReport(t *testing.T, ra *runningAgent) StatusReport {
	t.Helper()
	rec := httptest.NewRecorder()
	ra.StatusHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/servers", nil))
	var rep StatusReport
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatalf("status: %v: %s", err, rec.Body)
	}
	return rep
}
