// Package servercmd is the `konnect server` command (the Konnectivity server, a drop-in for upstream
// proxy-server) and `konnect doctor`, which inspects and dials through running servers.
package servercmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// NewServerCommand returns `konnect server`.
func NewServerCommand() *cobra.Command {
	o := tunnel.NewOptions()
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the Konnectivity server (drop-in for proxy-server)",
		Long: `Runs the control-plane end of the Konnectivity tunnel. kube-apiserver dials through it (--mode grpc or
http-connect, over --uds-name or mTLS TCP), and agents connect to --agent-port over TLS, authenticated by
ServiceAccount token (--agent-namespace, --agent-service-account, --authentication-audience, --kubeconfig)
or by client certificate (--cluster-ca-cert).

It takes every flag of upstream proxy-server v0.36.0 with the same defaults, so a manifest keeps its args.
Differences: every listener is bound before serving ("address in use" fails the start); a stale socket
is replaced but a live one refused; SIGTERM drains within --graceful-timeout (or
--graceful-shutdown-timeout when set) and then exits even with tunnels open; --health-bind-address ""
means 127.0.0.1; port 0 picks a free port.

Endpoints: health port /livez /readyz /healthz /metrics; admin port (loopback) /metrics, /debug/agents
(JSON status for konnect doctor) and, with --enable-profiling, /debug/pprof/.`,
		Example: `  konnect server --uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket \
    --cluster-cert=/etc/kubernetes/pki/apiserver.crt --cluster-key=/etc/kubernetes/pki/apiserver.key \
    --mode=grpc --server-port=0 --agent-port=8132 --admin-port=8133 --health-port=8134 \
    --agent-namespace=kube-system --agent-service-account=konnectivity-agent \
    --kubeconfig=/etc/kubernetes/konnectivity-server.conf --authentication-audience=system:konnectivity-server`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			ctx, cancel := daemon.SignalContext(cmd.Context())
			defer cancel()
			return run(ctx, o, cmd)
		},
	}
	o.AddFlags(cmd.Flags())
	daemon.AddKlogFlags(cmd.Flags())
	return cmd
}

func run(ctx context.Context, o *tunnel.Options, cmd *cobra.Command) error {
	u := o.Upstream
	healthHost := u.HealthBindAddress
	if healthHost == "" {
		healthHost = "127.0.0.1"
	}
	// An explicit --health-bind-address is the user saying otherwise; the empty default stays on loopback.
	healthLn, err := daemon.Listen("tcp", net.JoinHostPort(healthHost, strconv.Itoa(u.HealthPort)), true, "--health-bind-address/--health-port")
	if err != nil {
		return err
	}
	defer healthLn.Close()
	adminLn, err := daemon.Listen("tcp", net.JoinHostPort(u.AdminBindAddress, strconv.Itoa(u.AdminPort)), o.AllowRemoteAdmin, "--admin-bind-address/--admin-port", "--allow-remote-admin")
	if err != nil {
		return err
	}
	defer adminLn.Close()

	cfg, err := o.Config()
	if err != nil {
		return err
	}
	srv, err := tunnel.New(cfg)
	if err != nil {
		return err
	}
	for _, c := range []struct{ name, file string }{{"cluster-cert", u.ClusterCert}, {"server-cert", u.ServerCert}} {
		if err := daemon.RegisterCertExpiry(prometheus.DefaultRegisterer, c.name, c.file); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return fmt.Errorf("register certificate expiry metric for %s: %w", c.file, err)
			}
		}
	}

	health := daemon.NewHealthMux(nil, srv.ReadyChecks(), nil)
	// Upstream's deprecated /ready, kept for probes that still use it.
	health.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/readyz"
		health.ServeHTTP(w, r2)
	})
	admin := http.NewServeMux()
	if u.EnableProfiling {
		admin = daemon.NewAdminMux()
		if u.EnableContentionProfiling {
			runtime.SetBlockProfileRate(1)
			runtime.SetMutexProfileFraction(1)
		}
	}
	admin.Handle("/metrics", health) // upstream serves /metrics on the admin port too
	admin.Handle("/debug/agents", srv.StatusHandler())

	fmt.Fprintf(cmd.OutOrStdout(), "konnect server: frontend %s (%s), agents %s, health %s, admin %s\n",
		srv.FrontendAddr(), cfg.Mode, srv.AgentAddr(), healthLn.Addr(), adminLn.Addr())

	// Health and admin keep serving while the tunnel drains, so probes see /readyz fail during it.
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, s := range []struct {
		ln net.Listener
		h  http.Handler
	}{{healthLn, health}, {adminLn, admin}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := daemon.Serve(httpCtx, s.ln, s.h); err != nil {
				errs <- err
			}
		}()
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go func() {
		// An endpoint that dies takes the server down with it rather than leaving it unobservable.
		select {
		case err := <-errs:
			errs <- err
			stopRun()
		case <-runCtx.Done():
		}
	}()
	runErr := srv.Run(runCtx)
	stopHTTP()
	wg.Wait()
	if runErr != nil {
		return runErr
	}
	select {
	case err := <-errs:
		if ctx.Err() == nil {
			return fmt.Errorf("health/admin endpoint: %w", err)
		}
	default:
	}
	return nil
}
