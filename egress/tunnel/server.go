package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/konnectivity/batchtls"
	"github.com/konnect-dev/konnect/egress/konnectivity/wire"
	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/reload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/leases"
	"sigs.k8s.io/apiserver-network-proxy/proto/agent"
)

// Transport tuning for both gRPC links. Upstream keeps gRPC's defaults (64 KiB stream window grown by BDP
// estimation, 32 KiB buffers); with every connection multiplexed on one agent stream, a fixed large window
// and larger buffers keep the link full.
const (
	streamWindow = 8 << 20
	connWindow   = 32 << 20
	ioBufferSize = 256 << 10
	// frontendBufferSize is gRPC's default. Each of kube-apiserver's tunnels is its own connection, and
	// every connection that writes at the same moment borrows a buffer from a pool that keeps them until
	// the next GC: with 256 KiB buffers, opening 1,000 tunnels left about 17 MB in that pool. Bulk
	// throughput through one tunnel did not change measurably.
	frontendBufferSize = 32 << 10
	maxAgentMessage    = 32 << 20
	// tokenReviewCacheFor limits how often readiness probes reach kube-apiserver.
	tokenReviewCacheFor = 5 * time.Second
	// leaseDuration and friends follow upstream proxy-server.
	leaseDuration = 30 * time.Second
	leaseRenew    = 15 * time.Second
	leaseGC       = 15 * time.Second
	// leaseDeleteTimeout bounds the deletion of the server's Lease when it stops.
	leaseDeleteTimeout = 5 * time.Second
)

// Server is a running Konnectivity server. New binds every listener; Run serves until its context ends.
type Server struct {
	cfg Config
	ps  *server.ProxyServer

	frontendLn   net.Listener
	agentLn      net.Listener
	frontendGRPC *grpc.Server
	frontendHTTP *http.Server
	agentGRPC    *grpc.Server
	socketIno    uint64
	leases       *leases.Controller
	dials        *pendingDials

	// The certificates in use, for Certificates.
	agentCerts    tlsCerts
	frontendCerts tlsCerts // zero on the Unix socket

	metrics   *metrics
	agents    agentTracker
	frontends atomic.Int64
	draining  atomic.Bool

	// Agent authentication and the bounds on unauthenticated peers (auth.go, admission.go); tokens is nil
	// without token authentication, frontendAdm without the mTLS TCP frontend.
	authMetrics *authMetrics
	tokens      *tokenAuthenticator
	nodes       *nodeAddresses // the addresses of agents' nodes, in token mode (identity.go)
	frontendAdm *admission

	connMu sync.Mutex
	conns  map[*connectStream]struct{} // open HTTP CONNECT tunnels, which http.Server.Shutdown does not see

	tokenMu      sync.Mutex
	tokenChecked time.Time
	tokenErr     error

	runOnce atomic.Bool

	// firstDataHold is konnectivity.FirstDataHold; tests lengthen it to see who waits.
	firstDataHold time.Duration
}

// New builds the server and binds its frontend (socket or mTLS TCP) and agent listeners. An error with one
// Config field is a *field.Error naming it ("Mode", "FlowWindow" (with FlowMaxWindow), "ClusterAllowedNames",
// "ServerAllowedNames", "AgentAuth", "AgentAddr", "ServerAddr", "UDSName", "ClusterCert" or "ServerCert" (each
// with its key and CA)), and nothing stays bound when New fails.
func New(c *Config) (_ *Server, err error) {
	cfg := c.withDefaults()
	if cfg.Mode != server.ModeGRPC && cfg.Mode != server.ModeHTTPConnect {
		return nil, field.Errorf("{Mode}: must be grpc or http-connect, not %q", cfg.Mode)
	}
	if !cfg.DisableFlowControl {
		if err := cfg.flowOffer().Validate(); err != nil {
			return nil, field.Errorf("{FlowWindow}: %w", err)
		}
	}
	if len(cfg.ClusterAllowedNames) > 0 && cfg.ClusterCA == "" {
		return nil, field.Errorf("{ClusterAllowedNames}: apply only to agents' client certificates, which need a CA to verify them")
	}
	if len(cfg.ServerAllowedNames) > 0 && (cfg.ServerCA == "" || cfg.UDSName != "") {
		return nil, field.Errorf("{ServerAllowedNames}: apply only to kube-apiserver's client certificate on the mTLS TCP frontend")
	}
	if cfg.ClusterCA == "" && cfg.TokenAuth == nil && !cfg.AllowUnauthenticatedAgents {
		return nil, field.Errorf("{AgentAuth}: agents must authenticate, by client certificate (ClusterCA) or ServiceAccount token (TokenAuth)")
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("tunnel: register metrics: %w", err)
	}
	am, err := newAuthMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("tunnel: register metrics: %w", err)
	}
	// Upstream's token authentication stays off: agentAuthInterceptor does it, bounded, before upstream's
	// handler runs (auth.go).
	auth := &server.AgentTokenAuthenticationOptions{}
	s := &Server{
		cfg:     cfg,
		ps:      server.NewProxyServer(cfg.ServerID, cfg.ProxyStrategies, cfg.ServerCount, auth, cfg.XfrChannelSize),
		agents:  newAgentTracker(),
		conns:   map[*connectStream]struct{}{},
		metrics: m,

		firstDataHold: konnectivity.FirstDataHold,
	}
	s.authMetrics = am
	if n := len(s.ps.BackendManagers); n > 0 {
		s.ps.BackendManagers[n-1] = addedWatch{s.ps.BackendManagers[n-1]}
	}
	if cfg.TokenAuth != nil {
		s.tokens = newTokenAuthenticator(*cfg.TokenAuth, am)
		s.nodes = newNodeAddresses(cfg.TokenAuth.Client)
	}
	// Dials are timed out by s.dials in both modes: upstream would hold a goroutine per dial for the whole
	// timeout (dials.go).
	s.dials = newPendingDials(s.ps, cfg.MaxPendingDials, cfg.BackendDialTimeout, s.metrics)
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()

	if err := s.newAgentServer(); err != nil {
		return nil, err
	}
	if err := s.newFrontendServer(); err != nil {
		return nil, err
	}

	if l := cfg.Leases; l != nil {
		s.leases = leases.NewController(l.Client, cfg.ServerID, int32(leaseDuration.Seconds()), leaseRenew, leaseGC,
			"konnectivity-proxy-server-"+cfg.ServerID, l.Namespace, l.Labels)
	}
	return s, nil
}

// newAgentServer binds the agent listener and builds its gRPC server: mutual TLS with batched records.
func (s *Server) newAgentServer() error {
	cfg := s.cfg
	agentTLS, certs, err := serverTLS(cfg.ClusterCert, cfg.ClusterKey, cfg.ClusterCA, cfg.ClusterAllowedNames, []string{"h2"}, cfg.MinTLSVersion, cfg.CipherSuites)
	if err != nil {
		return field.Errorf("{ClusterCert}: %w", err)
	}
	s.agentCerts = certs
	if s.agentLn, err = net.Listen("tcp", cfg.AgentAddr); err != nil {
		return field.Errorf("{AgentAddr}: listen on %s: %w", cfg.AgentAddr, err)
	}
	adm := newAdmission("agent", cfg.HandshakeTimeout, cfg.AgentAuthTimeout, cfg.MaxUnauthenticated, cfg.MaxUnauthenticatedPerSource, s.authMetrics)
	s.agentLn = adm.listen(s.agentLn)
	s.agentGRPC = grpc.NewServer(
		grpc.Creds(admitCreds{batchtls.Credentials(credentials.NewTLS(agentTLS)), adm}),
		// The admission closes slow handshakes first; gRPC's own bound (120 s by default) stays behind it.
		grpc.ConnectionTimeout(cfg.AgentAuthTimeout+time.Second),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.KeepaliveTime}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// An idle agent should cost little: batchtls already buffers reads under TLS, so gRPC's own read
		// buffer is a second copy, and its write buffer is borrowed only while a write is in flight.
		grpc.ReadBufferSize(0),
		grpc.WriteBufferSize(ioBufferSize),
		grpc.SharedWriteBuffer(true),
		grpc.MaxRecvMsgSize(maxAgentMessage),
		grpc.MaxHeaderListSize(konnectivity.MaxHeaderList),
		// Authentication comes first: nothing a peer sends is acted on before it authenticates (agents.go).
		grpc.ChainStreamInterceptor(s.agentAuthInterceptor, s.agentInterceptor, s.dials.agentInterceptor),
		// Every DATA payload sent to an agent is its own: received from a frontend, or copied out of a CONNECT
		// read (connect.go).
		grpc.ForceServerCodecV2(wire.Codec{AliasReceived: true, ZeroCopySend: true}),
		// The transport's frame and write buffers come from the codec's pool, which does not clear them:
		// every frame is read in full, and only what was written is flushed.
		experimental.BufferPool(wire.Pool),
	)
	agent.RegisterAgentServiceServer(s.agentGRPC, s.ps)
	return nil
}

// newFrontendServer binds kube-apiserver's listener and builds the gRPC or HTTP CONNECT server behind it.
func (s *Server) newFrontendServer() error {
	if err := s.listenFrontend(); err != nil {
		return err
	}
	if s.cfg.Mode == server.ModeGRPC {
		return s.newFrontendGRPC()
	}
	return s.newFrontendHTTP()
}

// listenFrontend binds the Unix socket, or without one the mutual-TLS TCP address.
func (s *Server) listenFrontend() error {
	cfg := s.cfg
	if cfg.UDSName == "" {
		ln, err := net.Listen("tcp", cfg.ServerAddr)
		if err != nil {
			return field.Errorf("{ServerAddr}: listen on %s: %w", cfg.ServerAddr, err)
		}
		// kube-apiserver authenticates in the TLS handshake; until then a peer is bounded like an agent.
		s.frontendAdm = newAdmission("frontend", cfg.HandshakeTimeout, cfg.HandshakeTimeout, maxFrontendHandshakes, 0, s.authMetrics)
		s.frontendAdm.onHandshake = true
		s.frontendLn = s.frontendAdm.listen(ln)
		return nil
	}
	ln, err := listenUDS(cfg.UDSName, cfg.DeleteExistingUDS, cfg.UDSSharedDir)
	if err != nil {
		return err
	}
	s.frontendLn = ln
	if fi, err := os.Stat(cfg.UDSName); err == nil {
		s.socketIno = reload.Inode(fi)
	}
	return nil
}

func (s *Server) newFrontendGRPC() error {
	cfg := s.cfg
	creds := insecure.NewCredentials()
	if cfg.UDSName == "" {
		tc, certs, err := serverTLS(cfg.ServerCert, cfg.ServerKey, cfg.ServerCA, cfg.ServerAllowedNames, []string{"h2"}, cfg.MinTLSVersion, cfg.CipherSuites)
		if err != nil {
			return field.Errorf("{ServerCert}: %w", err)
		}
		s.frontendCerts = certs
		creds = admitCreds{credentials.NewTLS(tc), s.frontendAdm}
	}
	s.frontendGRPC = grpc.NewServer(
		grpc.Creds(tunnelCreds{creds}),
		// The admission closes slow handshakes first; this bounds the HTTP/2 preface after one.
		grpc.ConnectionTimeout(cfg.HandshakeTimeout+time.Second),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.FrontendKeepaliveTime}),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(streamWindow),
		grpc.ReadBufferSize(frontendBufferSize),
		grpc.WriteBufferSize(frontendBufferSize),
		// A tunnel is one connection, mostly idle or short: its write buffer goes back to a pool
		// between flushes instead of staying with the connection.
		grpc.SharedWriteBuffer(true),
		grpc.MaxRecvMsgSize(cfg.MaxFrontendMessage),
		grpc.MaxHeaderListSize(konnectivity.MaxHeaderList),
		grpc.ChainStreamInterceptor(s.frontendInterceptor, s.dials.interceptor),
		grpc.ForceServerCodecV2(wire.Codec{AliasReceived: true, ZeroCopySend: true}),
		experimental.BufferPool(wire.Pool),
	)
	client.RegisterProxyServiceServer(s.frontendGRPC, s.ps)
	return nil
}

func (s *Server) newFrontendHTTP() error {
	cfg := s.cfg
	s.frontendHTTP = &http.Server{
		Handler: http.HandlerFunc(s.serveConnect),
		// Only the CONNECT request itself is subject to these; the hijacked tunnel is not.
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	if cfg.UDSName == "" {
		tc, certs, err := serverTLS(cfg.ServerCert, cfg.ServerKey, cfg.ServerCA, cfg.ServerAllowedNames, []string{"http/1.1"}, cfg.MinTLSVersion, cfg.CipherSuites)
		if err != nil {
			return field.Errorf("{ServerCert}: %w", err)
		}
		s.frontendCerts = certs
		s.frontendHTTP.TLSConfig = tc
		// CONNECT tunnels are HTTP/1.1 only.
		s.frontendHTTP.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
		// net/http completes the handshake (with the client certificate verified) before a connection turns
		// active.
		s.frontendHTTP.ConnState = func(c net.Conn, st http.ConnState) {
			if tc, ok := c.(*tls.Conn); ok && st == http.StateActive {
				if ac, ok := tc.NetConn().(*admitConn); ok {
					ac.authenticated()
				}
			}
		}
	}
	return nil
}

// Close closes the listeners New bound, for a server that never runs.
func (s *Server) Close() error {
	s.closeListeners()
	return nil
}

func (s *Server) closeListeners() {
	if s.agentLn != nil {
		s.agentLn.Close()
	}
	if s.frontendLn != nil {
		s.frontendLn.Close()
	}
}

// FrontendAddr is the bound frontend address: the socket path or host:port.
func (s *Server) FrontendAddr() string { return s.frontendLn.Addr().String() }

// ID is the server's ID (Config.ServerID, or the one New chose).
func (s *Server) ID() string { return s.cfg.ServerID }

// AgentAddr is the bound agent address (host:port), with the real port when 0 was asked for.
func (s *Server) AgentAddr() string { return s.agentLn.Addr().String() }

// Run serves until ctx ends, then drains: new tunnels are refused, open ones get GracefulTimeout to finish,
// and whatever is left is closed. It returns nil after a drain that ctx asked for, and never blocks longer
// than GracefulTimeout plus a moment (unlike upstream, whose GracefulStop waits for every stream; ANP issue
// 866). Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.runOnce.CompareAndSwap(false, true) {
		return errors.New("tunnel server: Run called twice")
	}
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := s.agentGRPC.Serve(s.agentLn); err != nil {
			errc <- fmt.Errorf("agent listener: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		var err error
		if s.frontendGRPC != nil {
			err = s.frontendGRPC.Serve(s.frontendLn)
		} else if s.cfg.UDSName == "" {
			err = s.frontendHTTP.ServeTLS(s.frontendLn, "", "")
		} else {
			err = s.frontendHTTP.Serve(s.frontendLn)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("frontend listener: %w", err)
		}
	}()
	leaseCtx, stopLeases := context.WithCancel(context.WithoutCancel(ctx))
	if s.leases != nil {
		s.leases.Run(leaseCtx)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.shutdown()
	stopLeases()
	if s.leases != nil {
		s.deleteLease()
	}
	wg.Wait()
	return runErr
}

// deleteLease has upstream's lease controller delete this server's Lease, so that agents stop counting the
// server at once, but waits at most leaseDeleteTimeout: the controller asks with no deadline, and a
// kube-apiserver that does not answer must not hold the exit. A Lease left behind expires by itself.
func (s *Server) deleteLease() {
	done := make(chan struct{})
	go func() {
		s.leases.Stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(leaseDeleteTimeout):
		klog.InfoS("Kube-apiserver did not answer the deletion of the server's Lease; it expires by itself",
			"waited", leaseDeleteTimeout, "expiresWithin", leaseDuration)
	}
}

// shutdown stops the frontend first (no new tunnels; open ones may finish within GracefulTimeout), then the
// agent link, which only open tunnels needed.
func (s *Server) shutdown() {
	s.draining.Store(true)
	deadline := time.Now().Add(s.cfg.GracefulTimeout)
	klog.InfoS("Draining tunnel server", "openTunnels", s.frontends.Load(), "gracefulTimeout", s.cfg.GracefulTimeout)
	if s.frontendGRPC != nil {
		stopped := make(chan struct{})
		go func() { s.frontendGRPC.GracefulStop(); close(stopped) }()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-stopped:
		case <-t.C:
			klog.InfoS("Graceful timeout reached; closing open tunnels", "openTunnels", s.frontends.Load())
			s.frontendGRPC.Stop()
			<-stopped
		}
		t.Stop()
	} else {
		sctx, cancel := context.WithDeadline(context.Background(), deadline)
		_ = s.frontendHTTP.Shutdown(sctx) // stops accepting; hijacked tunnels are ours to wait for
		for s.openConns() > 0 && sctx.Err() == nil {
			select {
			case <-sctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		cancel()
		_ = s.frontendHTTP.Close()
		s.closeConns()
	}
	s.agentGRPC.Stop()
	// Wait briefly for tunnel writers to see their streams end, so that Run leaves nothing behind.
	end := time.Now().Add(2 * time.Second)
	for s.frontends.Load() > 0 && time.Now().Before(end) {
		time.Sleep(10 * time.Millisecond)
	}
	klog.InfoS("Tunnel server stopped")
}

func (s *Server) trackConn(c *connectStream, add bool) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if add {
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
}

func (s *Server) openConns() int {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return len(s.conns)
}

func (s *Server) closeConns() {
	s.connMu.Lock()
	conns := make([]*connectStream, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.connMu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// ReadyChecks are the server's readiness checks: the frontend socket is still ours, the server is not
// draining, and (with token authentication) kube-apiserver answers TokenReviews.
func (s *Server) ReadyChecks() []healthz.HealthChecker {
	checks := []healthz.HealthChecker{
		healthz.NamedCheck("shutdown", func(*http.Request) error {
			if s.draining.Load() {
				return errors.New("draining")
			}
			return nil
		}),
	}
	if s.cfg.UDSName != "" {
		checks = append(checks, healthz.NamedCheck("frontend-socket", func(*http.Request) error {
			return socketPresent(s.cfg.UDSName, s.socketIno)
		}))
	}
	if s.cfg.TokenAuth != nil {
		checks = append(checks, healthz.NamedCheck("tokenreview", func(r *http.Request) error {
			return s.checkTokenReview(r.Context())
		}))
	}
	return checks
}

// checkTokenReview sends a TokenReview for a token that cannot be valid. Any TokenReview answer proves that
// kube-apiserver is reachable and that this server may create TokenReviews (the manifests grant just that); an
// error (refused, unauthorized, forbidden) is what would make every agent fail to authenticate.
func (s *Server) checkTokenReview(ctx context.Context) error {
	s.tokenMu.Lock()
	defer s.tokenMu.Unlock()
	if time.Since(s.tokenChecked) < tokenReviewCacheFor {
		return s.tokenErr
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ta := s.cfg.TokenAuth
	client := ta.ProbeClient
	if client == nil {
		client = ta.Client
	}
	_, err := client.AuthenticationV1().TokenReviews().Create(ctx, &authv1.TokenReview{
		Spec: authv1.TokenReviewSpec{Token: "konnect-readiness-probe", Audiences: []string{ta.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		s.authMetrics.readinessReview.WithLabelValues("error").Inc()
		err = field.Errorf("TokenReview through {TokenAuth.Client}: %w", err)
	} else {
		s.authMetrics.readinessReview.WithLabelValues("ok").Inc()
	}
	// /readyz?verbose withholds a check's reason, and kube-style health endpoints log it only at -v=2: say
	// here, once per change, why agents cannot authenticate, and when they can again.
	switch {
	case err != nil && (s.tokenErr == nil || s.tokenErr.Error() != err.Error()):
		klog.ErrorS(err, "Not ready: agents cannot authenticate while kube-apiserver does not answer TokenReviews")
	case err == nil && s.tokenErr != nil:
		klog.InfoS("Ready again: kube-apiserver answers TokenReviews")
	}
	s.tokenChecked, s.tokenErr = time.Now(), err
	return err
}

// Status reports the server and the agents it knows.
func (s *Server) Status() Status {
	return Status{
		ServerID:    s.cfg.ServerID,
		ServerCount: s.cfg.ServerCount,
		Mode:        s.cfg.Mode,
		Frontend:    s.FrontendAddr(),
		Agent:       s.AgentAddr(),
		Frontends:   s.frontends.Load(),
		Draining:    s.draining.Load(),
		FlowControl: s.cfg.flowControl(),
		Agents:      s.agents.list(),
	}
}
