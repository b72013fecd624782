package agent

import (
	"crypto/tls"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// fakeServer serves impl, a stand-in for konnect's server, over TLS with a certificate from pki, on a
// loopback port until the test ends, and returns its address.
func fakeServer(t *testing.T, pki *testPKI, impl agentpb.AgentServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	kp := pki.ca.Server(t, "konnectivity-server", "127.0.0.1").TLS()
	srv := grpc.NewServer(append([]grpc.ServerOption{
		grpc.Creds(grpccreds.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}}))}, opts...)...)
	agentpb.RegisterAgentServiceServer(srv, impl)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// deafServer is a misbehaving server: it sends DATA for n connections the agent never had and never reads
// what the agent sends back.
type deafServer struct {
	agentpb.UnimplementedAgentServiceServer
	n    int
	sent chan struct{}
}

func (d *deafServer) Connect(stream agentpb.AgentService_ConnectServer) error {
	if err := stream.SendHeader(metadata.Pairs(header.ServerID, "deaf", header.ServerCount, "1")); err != nil {
		return err
	}
	for i := range d.n {
		pkt := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
			Data: &client.Data{ConnectID: int64(i + 1), Data: []byte("x")}}}
		if err := stream.Send(pkt); err != nil {
			return err
		}
	}
	close(d.sent)
	<-stream.Context().Done()
	return nil
}

// TestControlRepliesBounded: every DATA for an unknown connection asks for a CLOSE_RSP, and a server that
// never reads them blocks the stream. The agent must hold them in one bounded queue, not one goroutine each.
func TestControlRepliesBounded(t *testing.T) {
	const packets = 6000 // well past what fits in the stream's flow-control and write windows
	pki := newTestPKI(t)
	deaf := &deafServer{n: packets, sent: make(chan struct{})}
	// Fixed 64 KiB windows: no BDP growth, so the agent's replies fill them quickly.
	addr := fakeServer(t, pki, deaf, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))

	base := runtime.NumGoroutine()
	ra := startAgent(t, pki.config(addr))
	harness.EventuallyTrue(t, 30*time.Second, "agent received every DATA packet", func() bool {
		return counterValue(ra.m.dataFromServer) == packets
	})
	<-deaf.sent
	// The session's own goroutines (receive loop, probe, control writer) and gRPC's transport: a few dozen
	// at most, not one per reply.
	if n := runtime.NumGoroutine() - base; n > 50 {
		t.Fatalf("%d goroutines more than before the agent started, want at most 50", n)
	}
	if counterValue(ra.m.controlDropped) == 0 {
		t.Fatal("no reply was dropped: the server's windows did not fill")
	}
	if err := ra.Stop(t); err != nil {
		t.Fatal(err)
	}
}

// pausedServer sends DATA for n connections the agent never had, so that the agent queues a CLOSE_RSP for
// each, and reads nothing until release is closed; then it reads and closes drained when DRAIN arrives.
type pausedServer struct {
	agentpb.UnimplementedAgentServiceServer
	n       int
	release chan struct{}
	drained chan struct{}
}

func (p *pausedServer) Connect(stream agentpb.AgentService_ConnectServer) error {
	if err := stream.SendHeader(metadata.Pairs(header.ServerID, "paused", header.ServerCount, "1")); err != nil {
		return err
	}
	for i := range p.n {
		pkt := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
			Data: &client.Data{ConnectID: int64(i + 1), Data: []byte("x")}}}
		if err := stream.Send(pkt); err != nil {
			return err
		}
		if i%100 == 99 {
			// Slower than the agent's replies, which then fill the stream's windows, not the queue alone:
			// once the windows are full, the control writer is stuck in Send and the queue stays full.
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case <-p.release:
	case <-stream.Context().Done():
		return nil
	}
	for {
		pkt, err := stream.Recv()
		if err != nil {
			return nil
		}
		if pkt.Type == client.PacketType_DRAIN {
			close(p.drained)
			<-stream.Context().Done()
			return nil
		}
	}
}

// TestDrainSurvivesFullControlQueue: replies may be dropped when the server stops reading, but DRAIN may
// not. It is sent once, and a server that never gets it keeps sending new dials to a draining agent.
func TestDrainSurvivesFullControlQueue(t *testing.T) {
	const packets = 20000 // replies well past what fits in the stream's windows and the control queue
	pki := newTestPKI(t)
	paused := &pausedServer{n: packets, release: make(chan struct{}), drained: make(chan struct{})}
	addr := fakeServer(t, pki, paused, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))

	ra := startAgent(t, pki.config(addr))
	harness.EventuallyTrue(t, 30*time.Second, "agent received every DATA packet", func() bool {
		return counterValue(ra.m.dataFromServer) == packets
	})
	// The control writer is stuck in Send, so the queue stays full.
	harness.EventuallyTrue(t, 10*time.Second, "the control queue is full", func() bool {
		ra.mu.Lock()
		defer ra.mu.Unlock()
		for _, s := range ra.sessions {
			return len(s.ctrl) == cap(s.ctrl)
		}
		return false
	})
	dropped := counterValue(ra.m.controlDropped)
	ra.drain() // what Run does when its context ends, without ending the sessions
	if counterValue(ra.m.controlDropped) != dropped {
		t.Error("DRAIN was dropped")
	}
	close(paused.release)
	select {
	case <-paused.drained:
	case <-time.After(30 * time.Second):
		t.Fatal("the server never received DRAIN")
	}
	if err := ra.Stop(t); err != nil {
		t.Fatal(err)
	}
}

// floodServer answers the agent's Connect with response headers of the given size and reports what
// sending them returned.
type floodServer struct {
	agentpb.UnimplementedAgentServiceServer
	size int
	sent chan error
}

func (f *floodServer) Connect(stream agentpb.AgentService_ConnectServer) error {
	md := metadata.Pairs(header.ServerID, "flood", header.ServerCount, "1", "x-flood", strings.Repeat("v", f.size))
	err := stream.SendHeader(md)
	select {
	case f.sent <- err:
	default:
	}
	<-stream.Context().Done()
	return nil
}

// TestServerHeadersBounded: the agent bounds the headers it decodes from a server, as the server bounds
// those of agents, instead of gRPC's 16 MiB default. gRPC announces the bound in HTTP/2's
// SETTINGS_MAX_HEADER_LIST_SIZE and a gRPC server refuses to send past it, so a server's 1 MiB header
// fails to leave; a peer that sent it anyway would have its stream reset by the agent's framer.
func TestServerHeadersBounded(t *testing.T) {
	pki := newTestPKI(t)
	flood := &floodServer{size: 1 << 20, sent: make(chan error, 1)}
	ra := startAgent(t, pki.config(fakeServer(t, pki, flood)))
	select {
	case err := <-flood.sent:
		if err == nil {
			t.Fatal("1 MiB of response headers went to the agent: it announced no bound below gRPC's 16 MiB default")
		}
		if !strings.Contains(err.Error(), "header list size") {
			t.Fatalf("sending the headers failed for another reason: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never opened its stream")
	}
	if err := ra.Stop(t); err != nil {
		t.Fatal(err)
	}
}
