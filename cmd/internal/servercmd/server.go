// Package servercmd is the `konnect server` command: the Konnectivity server, a drop-in for upstream
// proxy-server.
package servercmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/cmd/internal/flagerr"
	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/konnect-dev/konnect/pki/uds"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// NewServerCommand returns `konnect server`.
func NewServerCommand() *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the Konnectivity server (drop-in for proxy-server)",
		Long: `Runs the control-plane end of the Konnectivity tunnel. kube-apiserver dials through it (--mode grpc or
http-connect, over --uds-name or mTLS TCP), and agents connect to --agent-port over TLS, authenticated by
ServiceAccount token (--agent-namespace, --agent-service-account, --authentication-audience, --kubeconfig)
or by client certificate (--cluster-ca-cert).

It takes every flag of upstream proxy-server v0.36.0, so a manifest keeps its args, with upstream's
defaults but three: --backend-dial-timeout is 30s (upstream: 0, off), -v is 0 (upstream: 4), and an empty
--health-bind-address means 127.0.0.1 (upstream: every interface). Also
konnect's own: --max-pending-dials (default 2000) bounds the dials waiting for agents. Agents must
authenticate: without --cluster-ca-cert or the token flags the server refuses to start, unless
--allow-unauthenticated-agents. Peers of --agent-port that have not authenticated are bounded
(--agent-auth-timeout, --max-unauthenticated-agent-connections[-per-source]), and tokens are reviewed with
upstream's checks but a cache (--token-review-cache-ttl) and a bound on reviews in flight
(--max-concurrent-token-reviews) instead of a 5-per-second rate limit. Other differences:
every listener is bound before serving ("address in use" fails the start); --server-count=0 is taken as
1, as upstream's agents take it; a relative --uds-name is refused (kube-apiserver dials only an absolute
one); a stale socket is replaced but a live one refused, a file that is not a socket is never
replaced, and a socket directory that another user could change (or one above it) is refused unless
--allow-shared-uds-dir;
SIGTERM drains within --graceful-timeout (or --graceful-shutdown-timeout when set) and then exits even
with tunnels open; port 0 picks a free port.

Endpoints: health port /livez and /healthz (liveness) /readyz /metrics; admin port (loopback) /metrics, /debug/agents
(JSON status for konnect doctor) and, with --enable-profiling, /debug/pprof/.`,
		Example: `  # On a control-plane node, with the files konnect init writes into its --dir (default /etc/kubernetes),
  # as the static pod does; agents authenticate with ServiceAccount tokens, reviewed by kube-apiserver:
  konnect server --uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket \
    --cluster-cert=/etc/kubernetes/pki/konnectivity-server.crt --cluster-key=/etc/kubernetes/pki/konnectivity-server.key \
    --mode=grpc --server-port=0 --agent-port=8132 --admin-port=8133 --health-port=8134 \
    --agent-namespace=kube-system --agent-service-account=konnectivity-agent \
    --kubeconfig=/etc/kubernetes/konnectivity-server.conf --authentication-audience=system:konnectivity-server

  # No kube-apiserver at hand (konnect init --agent-auth mtls): agents present a client certificate from the
  # agents' CA instead, and everything listens on loopback:
  konnect server --uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket \
    --cluster-cert=/etc/kubernetes/pki/konnectivity-server.crt --cluster-key=/etc/kubernetes/pki/konnectivity-server.key \
    --cluster-ca-cert=/etc/kubernetes/pki/konnectivity-agent-ca.crt --agent-bind-address=127.0.0.1 \
    --mode=grpc --server-port=0 --agent-port=8132 --admin-port=8133 --health-port=8134`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd.Flags())
	daemon.AddKlogFlags(cmd.Flags())
	return cmd
}

func run(ctx context.Context, o *Options, out io.Writer) error {
	return daemon.RunCommand(ctx, out, o.Config, func(_ context.Context, cfg *Config) (*Server, error) { return New(cfg) })
}

// Server is a `konnect server` ready to run: the tunnel server and its endpoints, all bound.
type Server struct {
	cfg       *Config
	tunnel    *tunnel.Server
	endpoints daemon.Endpoints
	bound     daemon.Bound
}

// New binds the health and admin endpoints and the tunnel's frontend and agent listeners, so that a port in
// use or an unreadable certificate fails the start, naming the flag. Nothing stays bound when New fails.
func New(cfg *Config) (_ *Server, err error) {
	s := &Server{cfg: cfg}
	defer s.bound.CloseIfFailed(&err)
	// An explicit --health-bind-address is the user saying otherwise; the empty default is loopback.
	if err := s.endpoints.ListenHealthAdmin(&s.bound, cfg.HealthAddr, "--health-bind-address/--health-port",
		cfg.AdminAddr, "--admin-bind-address/--admin-port", cfg.AllowRemoteAdmin); err != nil {
		return nil, err
	}
	reg := daemon.NewRegistry()
	if err := s.endpoints.RegisterMetrics(reg); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	tc := cfg.Tunnel
	tc.Registerer = reg
	if s.tunnel, err = tunnel.New(&tc); err != nil {
		return nil, flagError(err)
	}
	s.bound.Add(s.tunnel)
	// Named by their flags.
	certNames := map[string]string{"ClusterCert": "cluster-cert", "ClusterCA": "cluster-ca-cert", "ServerCert": "server-cert", "ServerCA": "server-ca-cert"}
	for field, cert := range s.tunnel.Certificates() {
		if err := daemon.RegisterCertExpiry(reg, certNames[field], cert); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	if tc.AllowUnauthenticatedAgents {
		klog.Warningf("Agents are not authenticated (--allow-unauthenticated-agents, and neither --cluster-ca-cert nor --agent-namespace): "+
			"anyone who reaches %s can register as an agent and receive kube-apiserver's traffic", s.tunnel.AgentAddr())
	}
	// konnect's metrics come from the server's own registry, upstream's from the default registry, where
	// upstream's package puts them (see tunnel.UpstreamMetrics).
	health := daemon.NewHealthMux(nil, names.Checks(s.tunnel.ReadyChecks()), prometheus.Gatherers{reg, tunnel.UpstreamMetrics()})
	// Upstream's deprecated /ready, kept for probes that still use it.
	health.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/readyz"
		health.ServeHTTP(w, r2)
	})
	admin := daemon.NewAdminMux(cfg.Profiling, cfg.ContentionProfiling)
	admin.Handle("/metrics", health) // upstream serves /metrics on the admin port too
	admin.Handle("/debug/agents", s.tunnel.StatusHandler())
	s.endpoints.HealthMux, s.endpoints.AdminMux = health, admin
	return s, nil
}

// Startup is the line scripts read, with every bound address.
func (s *Server) Startup() daemon.Startup {
	return daemon.Startup{
		Line: fmt.Sprintf("konnect server: frontend %s (%s), agents %s, health %s, admin %s", s.tunnel.FrontendAddr(),
			s.cfg.Tunnel.Mode, s.tunnel.AgentAddr(), s.endpoints.Health.Addr(), s.endpoints.Admin.Addr()),
		KV: []any{"serverID", s.tunnel.ID(), "mode", s.cfg.Tunnel.Mode, "frontend", s.tunnel.FrontendAddr(),
			"agent", s.tunnel.AgentAddr(), "health", s.endpoints.Health.Addr().String(), "admin", s.endpoints.Admin.Addr().String()},
	}
}

// Close releases what New bound, for a server that never runs.
func (s *Server) Close() error { return s.bound.Close() }

// Run serves until ctx ends. Then the tunnel drains within its graceful timeout while the endpoints still
// answer, so that probes see /readyz fail during it.
func (s *Server) Run(ctx context.Context) error {
	g := daemon.Group{StopTimeout: s.cfg.Tunnel.GracefulTimeout + daemon.ShutdownGrace}
	// Added first, it stops last: the collector stays paced while the tunnel drains.
	g.Add("", daemon.ServerGC.Run)
	s.endpoints.AddTo(&g)
	g.Add("", s.tunnel.Run)
	return g.Run(ctx)
}

// names are the flags behind the tunnel.Config fields that the tunnel's errors name.
var names = flagerr.Names{
	"Mode":                "--mode",
	"AgentAddr":           "--agent-bind-address/--agent-port",
	"ServerAddr":          "--server-bind-address/--server-port",
	"UDSName":             "--uds-name",
	"ClusterCert":         "--cluster-cert/--cluster-key/--cluster-ca-cert",
	"ServerCert":          "--server-cert/--server-key/--server-ca-cert",
	"ClusterAllowedNames": "--cluster-allowed-names (with --cluster-ca-cert)",
	"ServerAllowedNames":  "--server-allowed-names (with --server-ca-cert)",
	"AgentAuth":           "--cluster-ca-cert or --agent-namespace/--agent-service-account/--authentication-audience (or --allow-unauthenticated-agents)",
	// Options.Validate checks the flow-control flags first, so the tunnel's own check is not reached.
	"FlowWindow":       "--flow-control-window-bytes/--flow-control-max-window-bytes",
	"TokenAuth.Client": "--kubeconfig",
}

// flagError names the flags behind the tunnel.Config field that tunnel.New could not use, with the flag
// that gets past the two socket refusals an operator may override.
func flagError(err error) error {
	named := names.Error(err)
	if errors.Is(err, uds.ErrStale) {
		return fmt.Errorf("%w; remove it or pass --delete-existing-uds-file", named)
	}
	if errors.Is(err, uds.ErrSharedDir) {
		return fmt.Errorf("%w; use a directory of its own, or pass --allow-shared-uds-dir if only kube-apiserver's pod can write there", named)
	}
	return named
}
