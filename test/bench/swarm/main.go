// Command swarm is the agent side of konnect's swarm benchmark: one process that connects --agents idle
// Konnectivity agents to one server, each on its own mTLS connection with its own Connect stream, as that
// many nodes would. It speaks the agent protocol of apiserver-network-proxy v0.36.0 and nothing more: a
// DIAL_REQ is answered with a DIAL_RSP, the first DATA of a connection (loadgen's small GET) with a
// fixed HTTP 200 response, and CLOSE_REQ with CLOSE_RSP. There is no backend behind it: the benchmark
// measures the server.
//
// Agents authenticate with the client certificate (--agent-cert) or, as kubelet's projected tokens make them,
// each with a ServiceAccount token of its own (--tokens). An attempt that fails is retried after a pause that
// doubles from 1 s to 10 s, as agents do. --source-cidr spreads the agents over many source addresses, as
// many nodes would be.
//
// It prints one JSON line when every agent is connected (or --timeout passes). With --reconnect, it then
// drops every connection at once and connects them all again (a reconnect storm against a server that kept
// running), and prints a second line. It keeps the agents connected until SIGTERM or SIGINT.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
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
	Phase     string  `json:"phase"` // "connect", or "reconnect"
	Agents    int     `json:"agents"`
	Connected int     `json:"connected"`
	Failed    int     `json:"failed"`
	Attempts  int64   `json:"attempts"` // connection attempts, retries included
	Seconds   float64 `json:"seconds"`
	FirstErr  string  `json:"first_error,omitempty"`
}

func main() {
	server := flag.String("server", "127.0.0.1:8132", "the server's agent address")
	serverName := flag.String("server-name", "127.0.0.1", "the name to verify the server's certificate for")
	caFile := flag.String("ca-cert", "", "CA of the server's agent-facing certificate")
	certFile := flag.String("agent-cert", "", "client certificate every agent presents (the server's --cluster-ca-cert signs it)")
	keyFile := flag.String("agent-key", "", "its key")
	tokensFile := flag.String("tokens", "", "ServiceAccount tokens, one a line: agent i presents line i (modulo their number)")
	sourceCIDR := flag.String("source-cidr", "", "spread the agents' source addresses over this range (it must be local, e.g. a `local` route on lo)")
	agents := flag.Int("agents", 1000, "how many agents to connect")
	parallel := flag.Int("parallel", 64, "agents connecting at once (each retries until it is connected)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up connecting after this long")
	reconnect := flag.Duration("reconnect", 0, "once all are connected, wait this long, drop every connection and connect them all again (0: no)")
	flag.Parse()

	tlsCfg, err := clientTLS(*caFile, *certFile, *keyFile, *serverName)
	if err != nil {
		fail(err)
	}
	var tokens []string
	if *tokensFile != "" {
		data, err := os.ReadFile(*tokensFile)
		if err != nil {
			fail(fmt.Errorf("--tokens: %w", err))
		}
		tokens = strings.Fields(string(data))
		if len(tokens) == 0 {
			fail(fmt.Errorf("--tokens %s: no token", *tokensFile))
		}
	}
	var sources []netip.Addr
	if *sourceCIDR != "" {
		p, err := netip.ParsePrefix(*sourceCIDR)
		if err != nil {
			fail(fmt.Errorf("--source-cidr: %w", err))
		}
		for a := p.Masked().Addr().Next(); p.Contains(a) && len(sources) < *agents; a = a.Next() {
			sources = append(sources, a)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	swarm := make([]*swarmAgent, *agents)
	for i := range swarm {
		a := &swarmAgent{id: "swarm-" + strconv.Itoa(i), server: *server, tls: tlsCfg}
		if len(tokens) > 0 {
			a.token = tokens[i%len(tokens)]
		}
		if len(sources) > 0 {
			a.source = sources[i%len(sources)]
		}
		swarm[i] = a
	}
	var wg sync.WaitGroup
	if !connectAll(ctx, "connect", swarm, *parallel, *timeout, &wg) {
		<-ctx.Done()
		return
	}
	if *reconnect > 0 {
		select {
		case <-time.After(*reconnect):
		case <-ctx.Done():
			return
		}
		for _, a := range swarm {
			a.cc.Close() // its serve loop ends
		}
		wg.Wait()
		connectAll(ctx, "reconnect", swarm, *parallel, *timeout, &wg)
	}
	<-ctx.Done()
	wg.Wait()
}

// connectAll connects every agent, parallel at a time, each retrying until it is connected or timeout
// passes, prints the phase's report, and leaves the connected agents serving (counted in wg). It reports
// whether all got connected.
func connectAll(life context.Context, phase string, swarm []*swarmAgent, parallel int, timeout time.Duration, wg *sync.WaitGroup) bool {
	connectCtx, cancel := context.WithTimeout(life, timeout)
	defer cancel()
	var (
		connected, failed, attempts atomic.Int64
		firstErr                    atomic.Value
	)
	start := time.Now()
	sem := make(chan struct{}, parallel)
	ready := make(chan struct{}, len(swarm))
	for _, a := range swarm {
		sem <- struct{}{}
		go func() {
			err := a.connectRetrying(connectCtx, life, &attempts)
			<-sem
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				ready <- struct{}{}
				return
			}
			connected.Add(1)
			wg.Add(1)
			ready <- struct{}{}
			go func() {
				defer wg.Done()
				a.serve()
			}()
		}()
	}
	for range swarm {
		<-ready
	}
	r := report{Phase: phase, Agents: len(swarm), Connected: int(connected.Load()), Failed: int(failed.Load()),
		Attempts: attempts.Load(), Seconds: time.Since(start).Seconds()}
	if e, ok := firstErr.Load().(string); ok {
		r.FirstErr = e
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return r.Failed == 0
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
	c := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if certFile == "" && keyFile == "" {
		return c, nil // agents present tokens
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--agent-cert/--agent-key: %w", err)
	}
	c.Certificates = []tls.Certificate{pair}
	return c, nil
}

// swarmAgent is one agent: one connection, one Connect stream.
type swarmAgent struct {
	id     string
	server string
	tls    *tls.Config
	token  string     // "": the client certificate authenticates
	source netip.Addr // the zero Addr: any
	cc     *grpc.ClientConn
	stream agentpb.AgentService_ConnectClient
	sendMu sync.Mutex
	nextID int64
	// answered holds the connections whose request has had its response.
	answered map[int64]bool
}

// response is what every tunnel gets back for its request.
var response = []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

// connectRetrying connects the agent, retrying after 1 s, 2 s, … up to 10 s (with 10% jitter), as
// agents do, until connectCtx ends.
func (a *swarmAgent) connectRetrying(connectCtx, life context.Context, attempts *atomic.Int64) error {
	pause := time.Second
	for {
		attempts.Add(1)
		err := a.connect(connectCtx, life)
		if err == nil {
			return nil
		}
		jitter := time.Duration(rand.Int64N(int64(pause / 10)))
		select {
		case <-connectCtx.Done():
			return fmt.Errorf("%w (last attempt: %v)", connectCtx.Err(), err)
		case <-time.After(pause + jitter):
		}
		pause = min(2*pause, 10*time.Second)
	}
}

func (a *swarmAgent) connect(connectCtx, life context.Context) error {
	// Small transport buffers: the load generator's own memory is not what is measured, and a few
	// thousand agents with gRPC's 32 KiB defaults would crowd the machine.
	d := &net.Dialer{}
	if a.source.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: a.source.AsSlice()}
	}
	cc, err := grpc.NewClient("passthrough:///"+a.server,
		grpc.WithTransportCredentials(credentials.NewTLS(a.tls)),
		grpc.WithReadBufferSize(4096), grpc.WithWriteBufferSize(4096),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		return err
	}
	md := metadata.Pairs(header.AgentID, a.id, header.AgentIdentifiers, "")
	if a.token != "" {
		md.Set(header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+a.token)
	}
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
