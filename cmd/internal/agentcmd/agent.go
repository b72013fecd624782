// Package agentcmd is the `konnect agent` command: Options (proxy-agent's flags and konnect's) → Config →
// New → Run, with the health, metrics and admin endpoints and the signal handling around the agent. The
// tunnel itself lives in package agent.
package agentcmd

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"

	"github.com/konnect-dev/konnect/agent"
	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/cmd/internal/flagerr"
	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/apiserver/pkg/server/healthz"
)

// NewAgentCommand returns `konnect agent`, a drop-in for upstream proxy-agent v0.36.0.
func NewAgentCommand() *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the Konnectivity tunnel agent (drop-in for proxy-agent)",
		Long: `Run the Konnectivity tunnel agent on a node: it connects to the konnectivity servers and dials
backends (nodes, pods, extension API servers) for kube-apiserver.

It accepts every flag of upstream proxy-agent v0.36.0 with the same defaults, and talks to the upstream
proxy-server as well as to 'konnect server'. Beyond upstream it connects to every server listed in
--proxy-server-host (comma-separated) or resolved from one name, reloads --ca-cert, --agent-cert/--agent-key
and --service-account-token-path when they change, can restrict destinations with --allow-destination, and
on SIGTERM sends DRAIN and lets open connections finish for up to --graceful-timeout.

Health: /livez and /healthz (liveness), /readyz (server-connected and shutdown, as upstream's),
/readyz/all-servers-connected (every server the agent knows of, with those it lacks) and /metrics on
--health-server-host:--health-server-port. On the loopback admin port: /debug/servers (JSON: each server,
its stream and that stream's flow control) and, with --enable-profiling, pprof.`,
		Example: `  konnect agent --ca-cert=ca.crt --proxy-server-host=10.0.0.1,10.0.0.2 --proxy-server-port=8132 \
    --service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token \
    --agent-identifiers=host=node1 --allow-destination=10.0.0.0/8:443,10250`,
		Args: cobra.NoArgs,
		RunE: names.RunE(func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), o, cmd.OutOrStdout())
		}),
	}
	o.AddFlags(cmd.Flags())
	daemon.AddKlogFlags(cmd.Flags())
	return cmd
}

// names are the flags behind the agent.Config fields that the agent's start-up errors name.
var names = flagerr.Names{
	"CAFile":    "--ca-cert",
	"CertFile":  "--agent-cert",
	"KeyFile":   "--agent-key",
	"TokenFile": "--service-account-token-path",
}

func run(ctx context.Context, o *Options, out io.Writer) error {
	return daemon.RunCommand(ctx, out, o.Config, func(_ context.Context, cfg *Config) (*Agent, error) { return New(cfg) })
}

// Agent is a `konnect agent` ready to run: the tunnel agent, its bound health and admin endpoints and, with
// --count-server-leases, the lease watch.
type Agent struct {
	cfg       *Config
	agent     *agent.Agent
	endpoints daemon.Endpoints
	bound     daemon.Bound
	leases    *agent.LeaseCounter // nil without --count-server-leases
}

// New binds the health and admin endpoints and builds the lease watch and the agent, so that a port in use
// or an unreadable certificate fails the start. It starts nothing: Run runs the lease watch and waits for
// it, where a signal can end the wait. Nothing stays bound when New fails.
func New(cfg *Config) (_ *Agent, err error) {
	a := &Agent{cfg: cfg}
	defer a.bound.CloseIfFailed(&err)
	// The kubelet probes the pod IP, so the health port binds all interfaces by default as upstream's does.
	if err := a.endpoints.ListenHealthAdmin(&a.bound, cfg.HealthAddr, "--health-server-host/--health-server-port",
		cfg.AdminAddr, "--admin-bind-address/--admin-server-port", cfg.AllowRemoteAdmin); err != nil {
		return nil, err
	}
	reg := daemon.NewRegistry()
	if err := a.endpoints.RegisterMetrics(reg); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	ac := cfg.Agent
	ac.Registerer = reg
	if l := cfg.Leases; l != nil {
		if a.leases, err = agent.NewLeaseCounter(l.Kubeconfig, l.Namespace, l.Selector, l.ContentType); err != nil {
			return nil, fmt.Errorf("--count-server-leases: %w", err)
		}
		ac.ServerCount, ac.StartAfter = a.leases.Count, a.leases
	}
	if a.agent, err = agent.New(ac); err != nil {
		return nil, err
	}
	certNames := map[string]string{"CertFile": "agent-client", "CAFile": "agent-ca"}
	for field, cert := range a.agent.Certificates() {
		if err := daemon.RegisterCertExpiry(reg, certNames[field], cert); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	// The lease informer of --count-server-leases is upstream's, which counts its lists and watches in
	// prometheus' default registry.
	health := daemon.NewHealthMux(a.agent.LiveChecks(), a.agent.ReadyChecks(),
		prometheus.Gatherers{reg, konnectivity.UpstreamMetrics(agent.UpstreamLeaseMetricsPrefix)})
	// /ready is upstream's deprecated readiness path, kept for probes that still use it.
	healthz.InstallPathHandler(health, "/ready", append([]healthz.HealthChecker{healthz.PingHealthz}, a.agent.ReadyChecks()...)...)
	// Every server: a path of its own beside /readyz's checks, not one of them (agent.AllServersConnected).
	all := a.agent.AllServersConnected()
	health.Handle("/readyz/"+all.Name(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := all.Check(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	a.endpoints.HealthMux = health
	admin := daemon.NewAdminMux(cfg.Profiling, cfg.ContentionProfiling)
	a.endpoints.AdminMux = admin
	// Each server the agent knows, with its stream's flow control: the agent's side of the server's
	// /debug/agents.
	admin.Handle("/debug/servers", a.agent.StatusHandler())
	// Upstream's agent once served /metrics on the admin port, and now sends scrapers there on to the
	// health port.
	healthPort := a.endpoints.Health.Addr().(*net.TCPAddr).Port
	admin.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		dest := *r.URL
		dest.Scheme, dest.Host = "http", net.JoinHostPort(host, strconv.Itoa(healthPort))
		http.Redirect(w, r, dest.String(), http.StatusMovedPermanently)
	})
	return a, nil
}

// Startup names the bound endpoints; the agent prints no line of its own, as upstream's does not.
func (a *Agent) Startup() daemon.Startup {
	return daemon.Startup{KV: []any{"health", a.endpoints.Health.Addr().String(), "admin", a.endpoints.Admin.Addr().String()}}
}

// Close releases what New bound, for an agent that never runs.
func (a *Agent) Close() error { return a.bound.Close() }

// Run connects to the servers and serves until ctx ends. Then the agent drains within its graceful timeout
// while its endpoints still answer; a dead health endpoint would get the pod killed anyway, so it stops the
// agent cleanly instead.
func (a *Agent) Run(ctx context.Context) error {
	g := daemon.Group{StopTimeout: a.cfg.Agent.GracefulTimeout + daemon.ShutdownGrace}
	a.endpoints.AddTo(&g)
	if a.leases != nil {
		// Added before the agent, the watch stops after it: the count stays true while the agent drains.
		g.Add("--count-server-leases", a.leases.Run)
	}
	// With --count-server-leases, the agent waits for the watch to sync before it connects, as upstream's
	// does (agent.Config.StartAfter).
	g.Add("", a.agent.Run)
	return g.Run(ctx)
}
