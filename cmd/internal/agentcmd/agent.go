// Package agentcmd is the `konnect agent` command: flags → agent.Options → agent.Config → agent.Run, with
// the health, metrics and admin endpoints and the signal handling around it. The tunnel itself lives in
// package agent.
package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"

	"github.com/konnect-dev/konnect/agent"
	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
)

// NewAgentCommand returns `konnect agent`, a drop-in for upstream proxy-agent v0.36.0.
func NewAgentCommand() *cobra.Command {
	o := agent.NewOptions()
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

Health: /livez, /readyz (checks server-connected and all-servers-connected), /healthz and /metrics on
--health-server-host:--health-server-port; pprof on the loopback admin port with --enable-profiling.`,
		Example: `  konnect agent --ca-cert=ca.crt --proxy-server-host=10.0.0.1,10.0.0.2 --proxy-server-port=8132 \
    --service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token \
    --agent-identifiers=host=node1 --allow-destination=10.0.0.0/8:443,10250`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), o)
		},
	}
	o.AddFlags(cmd.Flags())
	daemon.AddKlogFlags(cmd.Flags())
	return cmd
}

func run(parent context.Context, o *agent.Options) error {
	if parent == nil {
		parent = context.Background()
	}
	cfg, err := o.Config()
	if err != nil {
		return err
	}
	u := o.Upstream
	ctx, cancel := daemon.SignalContext(parent)
	defer cancel()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg
	for name, file := range map[string]string{"agent-client": u.AgentCert, "agent-ca": u.CaCert} {
		if err := daemon.RegisterCertExpiry(reg, name, file); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}

	// Background work that must outlive the agent's drain (lease watch, health endpoints) stops on bgCtx.
	bgCtx, bgCancel := context.WithCancel(context.Background())
	defer bgCancel()
	if u.CountServerLeases {
		count, err := agent.StartLeaseCounter(bgCtx, u.KubeconfigPath, u.LeaseNamespace, u.LeaseLabel, u.APIContentType)
		if err != nil {
			return fmt.Errorf("--count-server-leases: %w", err)
		}
		cfg.ServerCount = count
	}

	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	// The kubelet probes the pod IP, so the health port binds all interfaces by default as upstream's does;
	// it carries no secrets. The admin port serves pprof and must stay on loopback.
	healthLn, err := daemon.Listen("tcp", net.JoinHostPort(u.HealthServerHost, strconv.Itoa(u.HealthServerPort)), true, "--health-server-host/--health-server-port")
	if err != nil {
		return err
	}
	defer healthLn.Close()
	adminLn, err := daemon.Listen("tcp", net.JoinHostPort(u.AdminBindAddress, strconv.Itoa(u.AdminServerPort)), o.AllowRemoteAdmin, "--admin-bind-address/--admin-server-port", "--allow-remote-admin")
	if err != nil {
		return err
	}
	defer adminLn.Close()
	klog.InfoS("Health endpoints listening", "addr", healthLn.Addr().String())

	healthMux := daemon.NewHealthMux(a.LiveChecks(), a.ReadyChecks(), reg)
	// /ready is upstream's deprecated readiness path, kept for probes that still use it.
	healthz.InstallPathHandler(healthMux, "/ready", append([]healthz.HealthChecker{healthz.PingHealthz}, a.ReadyChecks()...)...)
	adminMux := http.NewServeMux()
	if u.EnableProfiling {
		adminMux = daemon.NewAdminMux()
		if u.EnableContentionProfiling {
			runtime.SetBlockProfileRate(1)
		}
	}

	var wg sync.WaitGroup
	errc := make(chan error, 2)
	serve := func(ln net.Listener, h http.Handler) {
		defer wg.Done()
		if err := daemon.Serve(bgCtx, ln, h); err != nil {
			errc <- err
			cancel() // a dead health endpoint would get the pod killed anyway: stop cleanly instead
		}
	}
	wg.Add(2)
	go serve(healthLn, healthMux)
	go serve(adminLn, adminMux)

	runErr := a.Run(ctx)
	bgCancel()
	wg.Wait()
	close(errc)
	var errs []error
	if runErr != nil {
		errs = append(errs, runErr)
	}
	for err := range errc {
		errs = append(errs, fmt.Errorf("health/admin endpoint: %w", err))
	}
	return errors.Join(errs...)
}
