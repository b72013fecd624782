package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/proxystrategies"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// upstreamServer is upstream apiserver-network-proxy's server library (pkg/server), wired the way its
// proxy-server binary wires it: a TLS gRPC agent listener and a gRPC frontend on a unix socket.
type upstreamServer struct {
	t         testing.TB
	id        string
	ps        *server.ProxyServer
	agentAddr string
	uds       string
	agentSrv  *grpc.Server
	feSrv     *grpc.Server
	tokens    chan string // Authorization tokens seen, newest last
	stopOnce  sync.Once
}

type serverOpts struct {
	id         string
	count      int
	addr       string // agent listener; "" means 127.0.0.1:0
	ca         *pkitest.Cert
	clientCA   *pkitest.Cert // non-nil: require a client certificate from it
	serverHost string        // SAN of the server certificate; default 127.0.0.1
	bigFrames  bool          // frontend accepts messages larger than gRPC's 4 MiB default
	wantToken  string        // non-empty: refuse agents without this bearer token
	strategies []proxystrategies.ProxyStrategy
}

func startUpstreamServer(t testing.TB, o serverOpts) *upstreamServer {
	t.Helper()
	if o.count == 0 {
		o.count = 1
	}
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
	}
	if o.serverHost == "" {
		o.serverHost = "127.0.0.1"
	}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{o.ca.Server(t, "konnectivity-server", o.serverHost).TLS()}, MinVersion: tls.VersionTLS12}
	if o.clientCA != nil {
		tlsCfg.ClientCAs = o.clientCA.Pool()
		tlsCfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	s := &upstreamServer{t: t, id: o.id, tokens: make(chan string, 100)}
	if len(o.strategies) == 0 {
		o.strategies = []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDefault}
	}
	s.ps = server.NewProxyServer(o.id, o.strategies, o.count, &server.AgentTokenAuthenticationOptions{}, 150)
	intercept := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		tok := ""
		if v := md.Get(header.AuthenticationTokenContextKey); len(v) == 1 {
			tok = strings.TrimPrefix(v[0], header.AuthenticationTokenContextSchemePrefix)
		}
		select {
		case s.tokens <- tok:
		default:
		}
		if o.wantToken != "" && tok != o.wantToken {
			return status.Error(codes.Unauthenticated, "bad token")
		}
		return h(srv, ss)
	}
	s.agentSrv = grpc.NewServer(grpc.Creds(grpccreds.NewTLS(tlsCfg)), grpc.StreamInterceptor(intercept))
	agentpb.RegisterAgentServiceServer(s.agentSrv, s.ps)
	var ln net.Listener
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for {
		// A restarted server takes its old port back; the old socket may linger for a moment.
		ln, err = net.Listen("tcp", o.addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.agentAddr = ln.Addr().String()
	go func() { _ = s.agentSrv.Serve(ln) }()

	dir, err := os.MkdirTemp("", "konnect-uds")
	if err != nil {
		t.Fatal(err)
	}
	s.uds = filepath.Join(dir, "s.sock")
	uln, err := net.Listen("unix", s.uds)
	if err != nil {
		t.Fatal(err)
	}
	var feOpts []grpc.ServerOption
	if o.bigFrames {
		feOpts = append(feOpts, grpc.MaxRecvMsgSize(64<<20))
	}
	s.feSrv = grpc.NewServer(feOpts...)
	client.RegisterProxyServiceServer(s.feSrv, s.ps)
	go func() { _ = s.feSrv.Serve(uln) }()
	t.Cleanup(func() { s.stop(); os.RemoveAll(dir) })
	return s
}

// stop kills the server hard (upstream's GracefulStop would wait for open tunnels forever, ANP issue 866).
func (s *upstreamServer) stop() {
	s.stopOnce.Do(func() {
		s.agentSrv.Stop()
		s.feSrv.Stop()
	})
}

// backends reports how many agents the server has.
func (s *upstreamServer) backends() int { return s.ps.BackendManagers[0].NumBackends() }

// dial opens one tunnel through the server's UDS and dials addr through it, as kube-apiserver does.
func (s *upstreamServer) dial(ctx context.Context, addr string) (net.Conn, error) {
	tun, err := konnectivity.CreateSingleUseGrpcTunnel(ctx, "passthrough:///"+s.uds,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", s.uds)
		}))
	if err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	return tun.DialContext(ctx, "tcp", addr)
}

// testPKI is the CA, client certificate and token files an agent reads.
type testPKI struct {
	dir                                string
	ca                                 *pkitest.Cert
	caFile, certFile, keyFile, tokFile string
}

func newTestPKI(t testing.TB) *testPKI {
	p := &testPKI{dir: t.TempDir(), ca: pkitest.NewCA(t, "cluster-ca")}
	p.caFile = p.ca.WriteCert(t, filepath.Join(p.dir, "ca.crt"))
	p.certFile, p.keyFile = p.ca.Client(t, "konnectivity-agent").Write(t, p.dir, "agent")
	p.tokFile = filepath.Join(p.dir, "token")
	pkitest.WriteFile(t, p.tokFile, []byte("token-1\n"))
	return p
}

func (p *testPKI) config(servers ...string) Config {
	return Config{
		Servers:         servers,
		CAFile:          p.caFile,
		CertFile:        p.certFile,
		KeyFile:         p.keyFile,
		TokenFile:       p.tokFile,
		AgentID:         "agent-1",
		SyncInterval:    50 * time.Millisecond,
		SyncIntervalCap: 200 * time.Millisecond,
		ProbeInterval:   100 * time.Millisecond,
		GracefulTimeout: 2 * time.Second,
	}
}

// runningAgent is an agent started by a test, stopped at cleanup.
type runningAgent struct {
	*Agent
	*harness.Daemon
}

func startAgent(t testing.TB, cfg Config) *runningAgent {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &runningAgent{Agent: a, Daemon: harness.RunDaemon(t, cfg.GracefulTimeout, a.Run)}
}

// waitBackends waits until n agents are connected to s.
func (s *upstreamServer) waitBackends(t testing.TB, n int) {
	t.Helper()
	harness.EventuallyTrue(t, 10*time.Second, fmt.Sprintf("%d agent(s) on server %s", n, s.id), func() bool { return s.backends() == n })
}

// agentOnServer starts upstream's server and one agent, configured by tune (nil: the defaults of
// testPKI.config), and waits until the agent is connected.
func agentOnServer(t *testing.T, tune func(*Config)) (*testPKI, *upstreamServer, *runningAgent) {
	t.Helper()
	pki := newTestPKI(t)
	srv := startUpstreamServer(t, serverOpts{id: "s1", ca: pki.ca})
	cfg := pki.config(srv.agentAddr)
	if tune != nil {
		tune(&cfg)
	}
	ra := startAgent(t, cfg)
	srv.waitBackends(t, 1)
	return pki, srv, ra
}
