package agent

import (
	"crypto/tls"
	"net"
	"runtime"
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
	kp := pki.ca.Server(t, "konnectivity-server", "127.0.0.1").TLS()
	// Fixed 64 KiB windows: no BDP growth, so the agent's replies fill them quickly.
	srv := grpc.NewServer(grpc.Creds(grpccreds.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}})),
		grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	deaf := &deafServer{n: packets, sent: make(chan struct{})}
	agentpb.RegisterAgentServiceServer(srv, deaf)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	base := runtime.NumGoroutine()
	ra := startAgent(t, pki.config(ln.Addr().String()))
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
