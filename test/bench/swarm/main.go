// Command swarm is the agent side of konnect's swarm benchmark: one process that connects --agents idle
// Konnectivity agents to one server, each on its own mTLS connection with its own Connect stream, as that
// many nodes would. It speaks the agent protocol of apiserver-network-proxy v0.36.0 and nothing more: a
// DIAL_REQ is answered with a DIAL_RSP, the first DATA of a connection (loadgen's small GET) with a
// fixed HTTP 200 response, and CLOSE_REQ with CLOSE_RSP. There is no backend behind it: the benchmark
// measures the server.
//
// It prints one JSON line when every agent is connected (or --timeout passes), and keeps the agents
// connected until SIGTERM or SIGINT.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

type report struct {
	Agents    int     `json:"agents"`
	Connected int     `json:"connected"`
	Failed    int     `json:"failed"`
	Seconds   float64 `json:"seconds"`
	FirstErr  string  `json:"first_error,omitempty"`
}

func main() {
	server := flag.String("server", "127.0.0.1:8132", "the server's agent address")
	serverName := flag.String("server-name", "127.0.0.1", "the name to verify the server's certificate for")
	caFile := flag.String("ca-cert", "", "CA of the server's agent-facing certificate")
	certFile := flag.String("agent-cert", "", "client certificate every agent presents (the server's --cluster-ca-cert signs it)")
	keyFile := flag.String("agent-key", "", "its key")
	agents := flag.Int("agents", 1000, "how many agents to connect")
	parallel := flag.Int("parallel", 64, "connection attempts in flight at once")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up connecting after this long")
	flag.Parse()

	tlsCfg, err := clientTLS(*caFile, *certFile, *keyFile, *serverName)
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	connectCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	var (
		connected, failed atomic.Int64
		firstErr          atomic.Value
		wg                sync.WaitGroup
	)
	start := time.Now()
	sem := make(chan struct{}, *parallel)
	ready := make(chan struct{}, *agents)
	for i := 0; i < *agents; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			a := &swarmAgent{id: "swarm-" + strconv.Itoa(i)}
			err := a.connect(connectCtx, ctx, *server, tlsCfg)
			<-sem
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				ready <- struct{}{}
				return
			}
			connected.Add(1)
			ready <- struct{}{}
			a.serve()
		}(i)
	}
	for i := 0; i < *agents; i++ {
		<-ready
	}
	r := report{Agents: *agents, Connected: int(connected.Load()), Failed: int(failed.Load()), Seconds: time.Since(start).Seconds()}
	if e, ok := firstErr.Load().(string); ok {
		r.FirstErr = e
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	<-ctx.Done()
	wg.Wait()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "swarm:", err)
	os.Exit(2)
}

func clientTLS(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-cert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("--ca-cert %s: no PEM certificate", caFile)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--agent-cert/--agent-key: %w", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, ServerName: serverName, MinVersion: tls.VersionTLS12}, nil
}

// swarmAgent is one agent: one connection, one Connect stream.
type swarmAgent struct {
	id     string
	cc     *grpc.ClientConn
	stream agentpb.AgentService_ConnectClient
	sendMu sync.Mutex
	nextID int64
	// answered holds the connections whose request has had its response.
	answered map[int64]bool
}

// response is what every tunnel gets back for its request.
var response = []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

func (a *swarmAgent) connect(connectCtx, life context.Context, server string, tlsCfg *tls.Config) error {
	// Small transport buffers: the load generator's own memory is not what is measured, and a few
	// thousand agents with gRPC's 32 KiB defaults would crowd the machine.
	cc, err := grpc.NewClient("passthrough:///"+server,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithReadBufferSize(4096), grpc.WithWriteBufferSize(4096),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		return err
	}
	md := metadata.Pairs(header.AgentID, a.id, header.AgentIdentifiers, "")
	streamCtx := metadata.NewOutgoingContext(life, md)
	stream, err := agentpb.NewAgentServiceClient(cc).Connect(streamCtx)
	if err != nil {
		cc.Close()
		return err
	}
	// The server answers with its ID in the response headers once it has taken the agent.
	hdr := make(chan error, 1)
	go func() {
		h, err := stream.Header()
		if err == nil && len(h.Get(header.ServerID)) != 1 {
			err = errors.New("the server sent no server ID (refused?)")
		}
		hdr <- err
	}()
	select {
	case err = <-hdr:
	case <-connectCtx.Done():
		err = connectCtx.Err()
	}
	if err != nil {
		cc.Close()
		return err
	}
	a.cc, a.stream = cc, stream
	return nil
}

func (a *swarmAgent) send(p *client.Packet) {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	_ = a.stream.Send(p)
}

// serve answers the server until the stream ends.
func (a *swarmAgent) serve() {
	defer a.cc.Close()
	a.answered = map[int64]bool{}
	for {
		p, err := a.stream.Recv()
		if err != nil {
			return
		}
		switch p.Type {
		case client.PacketType_DIAL_REQ:
			req := p.GetDialRequest()
			a.nextID++
			a.send(&client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
				DialResponse: &client.DialResponse{Random: req.Random, ConnectID: a.nextID}}})
		case client.PacketType_DATA:
			id := p.GetData().ConnectID
			if !a.answered[id] {
				a.answered[id] = true
				a.send(&client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
					Data: &client.Data{ConnectID: id, Data: response}}})
			}
		case client.PacketType_CLOSE_REQ:
			id := p.GetCloseRequest().ConnectID
			delete(a.answered, id)
			a.send(&client.Packet{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{
				CloseResponse: &client.CloseResponse{ConnectID: id}}})
		}
	}
}
