// Package proxycmd is the `konnect proxy` command: kubectl proxy's flags and behaviour on top of the
// apiproxy package, optionally carried over SSH (--via), and a refusal to serve on a non-loopback address
// unless asked.
package proxycmd

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/socks/apiproxy"
	"github.com/konnect-dev/konnect/socks/sshdial"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
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

Watches stream, and exec, attach and port-forward (SPDY or WebSocket) pass when the filter allows them.
The kubeconfig's proxy-url is honoured; with --via [user@]host the traffic goes over one SSH connection
instead (host keys checked against known_hosts, reconnects with backoff), the way 'konnect socks' does.

Unlike kubectl proxy, konnect proxy refuses to listen on an address that is not loopback unless
--allow-remote is given, and refuses requests that a browser sends on behalf of a page from another
origin (an Origin header whose host --accept-hosts does not accept): such a page could otherwise open a
WebSocket to a port-forward or a service proxy through it. Clients that send no Origin header (kubectl,
curl, client-go) are not affected.`,
		Example: `  # Proxy the whole API on localhost:8001
  konnect proxy

  # Pick a free port; the chosen address is printed as "Starting to serve on 127.0.0.1:PORT"
  konnect proxy --port=0

  # Reach an API server that only a bastion can see
  konnect proxy --via alice@bastion.example.com

  # Serve the API under /k8s-api/ and static files from ./www under /static/
  konnect proxy --api-prefix=/k8s-api --www=./www`,
		DisableFlagsInUseLine: true,
		Args:                  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			cfg, err := o.Config()
			if err != nil {
				return err
			}
			// The proxy's heap is small and short-lived, so collecting it less often saves CPU per request;
			// the soft limit brings collection back when many connections hold buffers.
			daemon.TuneGC(400, 256<<20)
			ctx, cancel := daemon.SignalContext(cmd.Context())
			defer cancel()
			return Run(ctx, cfg, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd.Flags())
	daemon.AddKlogFlags(cmd.Flags(), "v", "vmodule")
	return cmd
}

// Run binds the proxy, prints kubectl's "Starting to serve on ADDR" line to out, and serves until ctx ends.
// With cfg.SSH it also keeps the SSH connection up, and returns its error if SSH refuses for good (an
// untrusted host key, failed authentication).
func Run(ctx context.Context, cfg *Config, out io.Writer) error {
	var dialer *sshdial.Dialer
	if cfg.SSH != nil {
		d, err := sshdial.New(*cfg.SSH)
		if err != nil {
			return fmt.Errorf("--via: %w", err)
		}
		dialer = d
		cfg.Proxy.Dial = d.DialContext
	}
	srv, err := apiproxy.New(cfg.Proxy)
	if err != nil {
		return err
	}
	// The exact line kubectl prints: scripts read the port from it when --port=0.
	fmt.Fprintf(out, "Starting to serve on %s\n", srv.Addr())
	if dialer == nil {
		return srv.Run(ctx)
	}

	klog.InfoS("Carrying API traffic over SSH", "via", dialer.Target())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var sshErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := dialer.Run(ctx); err != nil {
			sshErr = fmt.Errorf("--via %s: %w", dialer.Target(), err)
			cancel()
		}
	}()
	proxyErr := srv.Run(ctx)
	cancel()
	wg.Wait()
	if sshErr != nil {
		return sshErr
	}
	return proxyErr
}
