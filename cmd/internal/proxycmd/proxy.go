// Package proxycmd is the `konnect proxy` command: kubectl proxy's flags and behaviour on top of the
// apiproxy package, optionally carried over SSH (--via), and a refusal to serve on a non-loopback address
// unless asked.
package proxycmd

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/cmd/internal/flagerr"
	"github.com/konnect-dev/konnect/cmd/internal/sshflags"
	"github.com/konnect-dev/konnect/pki/uds"
	"github.com/konnect-dev/konnect/socks/apiproxy"
	"github.com/konnect-dev/konnect/socks/sshdial"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"

	// kubectl registers client-go's auth-provider plugins, of which oidc is the one still in use (gcp and
	// azure were replaced by exec plugins): a kubeconfig with auth-provider: oidc works here as there.
	_ "k8s.io/client-go/plugin/pkg/client/auth/oidc"
)

// NewProxyCommand returns `konnect proxy`.
func NewProxyCommand() *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "proxy [--port=PORT] [--www=static-dir] [--www-prefix=prefix] [--api-prefix=prefix]",
		Short: "Run a proxy to the Kubernetes API server (kubectl proxy, drop-in), optionally over SSH",
		Long: `Creates a proxy server between localhost and the Kubernetes API server, with the credentials of your
kubeconfig (client certificates, tokens, exec plugins). It takes kubectl proxy's flags with the same
defaults, and keeps its request filter: only Host headers naming localhost are accepted (this defeats DNS
rebinding, kubernetes issue 8871), and exec and attach are refused unless --reject-paths says otherwise.
Unlike kubectl proxy's, the default --reject-paths also refuses the kubelet's exec, attach, run,
portForward, checkpoint and debug/flags through a node's proxy subresource
(/api/v1/nodes/NODE/proxy/exec/...), which kube-apiserver forwards to the kubelet; a --reject-paths
given on the command line replaces the whole default.

Watches stream, and exec, attach and port-forward (SPDY or WebSocket) pass when the filter allows them.
The kubeconfig's proxy-url is honoured; with --via [user@]host the traffic goes over one SSH connection
instead (host keys checked against known_hosts, reconnects with backoff), the way 'konnect socks' does.
What konnect proxy answers itself (the SSH server is down: 503; the API server could not be reached: 502;
the filter refused: 403 or 400) is a Status, as kube-apiserver answers, so kubectl prints why.

Unlike kubectl proxy, konnect proxy refuses to listen on an address that is not loopback unless
--allow-remote is given, and refuses requests that a browser sends on behalf of a page from another
origin (an Origin header whose host --accept-hosts does not accept): such a page could otherwise open a
WebSocket to a port-forward or a service proxy through it. Clients that send no Origin header (kubectl,
curl, client-go) are not affected. The Origin check belongs to the filter: --disable-filter, which kubectl
proxy warns is dangerous, turns it off with the rest.`,
		Example: `  # Proxy the whole API on localhost:8001
  konnect proxy

  # Pick a free port; the chosen address is printed as "Starting to serve on 127.0.0.1:PORT"
  konnect proxy --port=0

  # Reach an API server that only a bastion can see
  konnect proxy --via alice@bastion.example.com

  # Also serve /livez, /readyz (does the API server answer?) and /metrics
  konnect proxy --health-listen 127.0.0.1:8002

  # Serve the API under /k8s-api/ and static files from ./www under /static/
  konnect proxy --api-prefix=/k8s-api --www=./www`,
		DisableFlagsInUseLine: true,
		Args:                  cobra.NoArgs,
		RunE: names.RunE(func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), o, cmd.OutOrStdout())
		}),
	}
	o.AddFlags(cmd.Flags())
	daemon.AddKlogFlags(cmd.Flags(), "v", "vmodule")
	return cmd
}

// names are the flags behind the Config fields that the libraries' errors name: apiproxy's (kubectl's
// spellings) and the SSH flags of --via.
var names = func() flagerr.Names {
	n := flagerr.Names{
		"APIPrefix":     "--api-prefix",
		"StaticPrefix":  "--www-prefix",
		"REST.Host":     "--server",
		"AcceptPaths":   "--accept-paths",
		"RejectPaths":   "--reject-paths",
		"AcceptHosts":   "--accept-hosts",
		"RejectMethods": "--reject-methods",
	}
	maps.Copy(n, sshflags.Names)
	return n
}()

func run(ctx context.Context, o *Options, out io.Writer) error {
	// The proxy's heap is small and short-lived, so collecting it less often saves CPU per request; the soft
	// limit brings collection back when many connections hold buffers. Here, not in Run, which tests call in
	// their own process.
	daemon.TuneGC(400, 256<<20)
	o.SSH.Quieten()
	config := func() (*Config, error) {
		cfg, err := o.Config()
		if err == nil {
			o.SSH.Notice()
		}
		return cfg, err
	}
	return daemon.RunCommand(ctx, out, config, New)
}

// Proxy is a `konnect proxy` ready to run: the API proxy on its bound listener, with --via the SSH
// connection under it, and with --health-listen its health and metrics endpoint.
type Proxy struct {
	cfg       *Config
	dialer    *sshdial.Dialer
	server    *apiproxy.Server
	endpoints daemon.Endpoints // health only
	bound     daemon.Bound
}

// probeTimeout bounds the readiness check's request to the API server.
const probeTimeout = 5 * time.Second

// New prepares the SSH dialer and the proxy and binds the listeners, so that a bad kubeconfig or an address
// in use fails the start. Nothing stays bound when New fails. With --via, the SSH config file's Match exec
// commands, which run here, are stopped when ctx ends.
func New(ctx context.Context, cfg *Config) (_ *Proxy, err error) {
	p := &Proxy{cfg: cfg}
	defer p.bound.CloseIfFailed(&err)
	pc := cfg.Proxy
	if cfg.SSH != nil {
		ssh := *cfg.SSH
		ssh.Log = klog.NewKlogr()
		if p.dialer, err = sshdial.NewContext(ctx, ssh); err != nil {
			return nil, fmt.Errorf("--via: %w", err)
		}
		pc.Dial = p.dialer.DialContext
	}
	var reg *prometheus.Registry
	if cfg.HealthAddr != "" {
		reg = daemon.NewRegistry()
		pc.Registerer = reg
		if p.endpoints.Health, err = p.bound.Listen("tcp", cfg.HealthAddr, cfg.AllowRemote, "--health-listen"); err != nil {
			return nil, err
		}
	}
	if pc.Listener, err = listen(cfg); err != nil {
		return nil, err
	}
	p.bound.Add(pc.Listener)
	if p.server, err = apiproxy.New(pc); err != nil {
		return nil, err
	}
	if reg != nil {
		if err := p.endpoints.RegisterMetrics(reg); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		p.endpoints.HealthMux = daemon.NewHealthMux(nil, names.Checks(p.readyChecks()), reg)
	}
	return p, nil
}

// readyChecks are ready while the API server answers its /readyz through the proxy's own connections, and
// with --via while the SSH connection is up.
func (p *Proxy) readyChecks() []healthz.HealthChecker {
	checks := []healthz.HealthChecker{healthz.NamedCheck("apiserver", func(r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
		defer cancel()
		return p.server.Probe(ctx)
	})}
	if p.dialer != nil {
		checks = append(checks, healthz.NamedCheck("ssh", func(*http.Request) error { return p.dialer.Ready() }))
	}
	return checks
}

// listen binds the proxy's address: TCP on loopback unless --allow-remote, or a Unix socket private to the
// user, as kubectl proxy's is, replacing a stale socket but never another kind of file or a live socket.
func listen(cfg *Config) (net.Listener, error) {
	if cfg.Network != "unix" {
		return daemon.Listen("tcp", cfg.Address, cfg.AllowRemote, "--address/--port")
	}
	ln, err := uds.Listen(cfg.Address, uds.Options{Mode: 0o600, DirMode: 0o700, ReplaceStale: true})
	if err != nil {
		return nil, fmt.Errorf("--unix-socket: %w", err)
	}
	return ln, nil
}

// Startup is kubectl proxy's line, which scripts read the port from when --port=0, and the addresses.
func (p *Proxy) Startup() daemon.Startup {
	kv := []any{"addr", p.server.Addr().String()}
	if p.dialer != nil {
		kv = append(kv, "via", p.dialer.Target())
	}
	if p.endpoints.Health != nil {
		kv = append(kv, "health", p.endpoints.Health.Addr().String())
	}
	st := daemon.Startup{Line: fmt.Sprintf("Starting to serve on %s", p.server.Addr()), KV: kv}
	if p.dialer != nil {
		// The line above is kubectl proxy's, which scripts wait for: it stays at once. The log says "Serving"
		// only once the SSH connection of --via is up.
		st.Ready, st.Waiting = p.dialer.Ready, "Listening; connecting to the SSH server"
	}
	return st
}

// Close releases what New bound, for a proxy that never runs.
func (p *Proxy) Close() error { return p.bound.Close() }

// Run serves until ctx ends and then stops within the proxy's shutdown grace. With --via it also keeps the
// SSH connection up, and returns its error if SSH refuses for good (an untrusted host key, failed
// authentication).
func (p *Proxy) Run(ctx context.Context) error {
	// The proxy finishes requests in flight within its own grace; the bound sits above it.
	g := daemon.Group{StopTimeout: p.cfg.Proxy.ShutdownGrace + daemon.ShutdownGrace}
	p.endpoints.AddTo(&g)
	if p.dialer != nil {
		// The dialer's errors name the SSH server; the prefix names the flag.
		g.Add("--via", p.dialer.Run)
	}
	g.Add("", p.server.Run)
	return g.Run(ctx)
}
