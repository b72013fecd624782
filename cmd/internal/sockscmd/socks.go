// Package sockscmd implements `konnect socks`: one SSH connection, local SOCKS5 and HTTP proxies, like
// `ssh -D` with reconnects and health endpoints.
package sockscmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/cmd/internal/sshflags"
	"github.com/konnect-dev/konnect/pki/address"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/konnect-dev/konnect/socks"
	"github.com/konnect-dev/konnect/socks/sshdial"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
)

// Options are the flags and the argument of `konnect socks`.
type Options struct {
	// Destination is the SSH server, [user@]host, the command's argument.
	Destination string

	// Local listeners.
	DynamicForward string // -D [bind_address:]port, SOCKS5 and HTTP on one port
	HTTPListen     string // an extra HTTP-only proxy port
	HealthListen   string // /healthz /livez /readyz; off when empty
	AllowRemote    bool

	// Client authentication, required when a proxy listens beyond loopback.
	ProxyUser         string
	ProxyPasswordFile string

	MaxConnections int

	SSH *sshflags.Flags
}

// NewOptions returns the defaults: `ssh -D 1080` on loopback.
func NewOptions() *Options {
	return &Options{
		DynamicForward: "localhost:1080",
		MaxConnections: socks.DefaultMaxConns,
		SSH:            sshflags.NewFlags(),
	}
}

// AddFlags registers the flags with their current values as defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.DynamicForward, "dynamic-forward", "D", o.DynamicForward, "[bind_address:]port for SOCKS5 and HTTP proxying on one port (like ssh -D). A bare port, or localhost, binds 127.0.0.1 and ::1 both, as ssh -D does; \"*:port\" binds all interfaces and needs --allow-remote.")
	fs.StringVar(&o.HTTPListen, "http-listen", o.HTTPListen, "Also serve HTTP proxying (CONNECT and http:// URLs) alone on this host:port.")
	fs.StringVar(&o.HealthListen, "health-listen", o.HealthListen, "Serve /healthz, /livez and /readyz (SSH connection state) and /metrics on this host:port. Off when empty.")
	fs.BoolVar(&o.AllowRemote, "allow-remote", o.AllowRemote, "Allow listening on non-loopback addresses. Proxies then require --proxy-user and --proxy-password-file.")
	fs.StringVar(&o.ProxyUser, "proxy-user", o.ProxyUser, "Username that SOCKS5 (RFC 1929) and HTTP (Proxy-Authorization: Basic) clients must present.")
	fs.StringVar(&o.ProxyPasswordFile, "proxy-password-file", o.ProxyPasswordFile, "File holding the password for --proxy-user (first line).")
	fs.IntVar(&o.MaxConnections, "max-connections", o.MaxConnections, "Maximum concurrent proxy client connections; more are refused (SOCKS5 general failure, HTTP 503). With --proxy-user, at most half of them may be still unauthenticated, and a quarter (64 at most) from one address, so that clients without the password cannot hold them all: past an address's share a new connection is reset, and while the half is full one from an address that holds fewer than another takes the place of that one's oldest. It must then be at least 4.")
	o.SSH.AddFlags(fs)
	o.SSH.AddConnectionsFlag(fs)
}

// Config is the validated configuration of `konnect socks`.
type Config struct {
	SOCKSAddr   string // SOCKS5 and HTTP, sniffed
	HTTPAddr    string // HTTP only; empty: none
	HealthAddr  string // empty: none
	AllowRemote bool
	Credentials *socks.Credentials
	MaxConns    int
	SSH         sshdial.Config
}

// parseDynamic turns ssh -D's "[bind_address:]port" into host:port.
func parseDynamic(s string) (string, error) {
	if s == "" {
		return "", errors.New("-D: an address is required")
	}
	// localhost, as ssh -D binds a bare port: both loopback addresses (daemon.Listen).
	host, port := "localhost", s
	if i := strings.LastIndex(s, ":"); i >= 0 {
		host, port = s[:i], s[i+1:]
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if host == "*" {
			host = ""
		}
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("-D: port %q is not a number from 0 to 65535", port)
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

// Validate checks the options, naming the flag in every error.
func (o *Options) Validate() error {
	_, err := o.Config()
	return err
}

// Config validates the options and builds the Config, naming the flag in every error.
func (o *Options) Config() (*Config, error) {
	cfg := &Config{AllowRemote: o.AllowRemote, MaxConns: o.MaxConnections, HTTPAddr: o.HTTPListen, HealthAddr: o.HealthListen}
	var err error
	if cfg.SOCKSAddr, err = parseDynamic(o.DynamicForward); err != nil {
		return nil, err
	}
	if o.MaxConnections < 1 {
		return nil, fmt.Errorf("--max-connections: must be at least 1, got %d", o.MaxConnections)
	}
	remote := false
	for _, a := range []struct{ flag, addr string }{{"-D", cfg.SOCKSAddr}, {"--http-listen", cfg.HTTPAddr}, {"--health-listen", cfg.HealthAddr}} {
		if a.addr == "" {
			continue
		}
		if err := daemon.CheckLoopback(a.addr, o.AllowRemote, a.flag); err != nil {
			return nil, err
		}
		host, _, _ := net.SplitHostPort(a.addr)
		if a.flag != "--health-listen" && !address.IsLoopbackHost(host) {
			remote = true
		}
	}
	switch {
	case (o.ProxyUser == "") != (o.ProxyPasswordFile == ""):
		return nil, errors.New("--proxy-user and --proxy-password-file go together")
	case o.ProxyUser != "":
		if strings.Contains(o.ProxyUser, ":") {
			return nil, errors.New("--proxy-user: must not contain ':'")
		}
		pw, err := readPassword(o.ProxyPasswordFile)
		if err != nil {
			return nil, err
		}
		cfg.Credentials = &socks.Credentials{User: o.ProxyUser, Password: pw}
		if o.MaxConnections < socks.MinMaxConnsWithCredentials {
			return nil, fmt.Errorf("--max-connections: must be at least %d with --proxy-user, got %d: at most half may be unauthenticated, a quarter from one address",
				socks.MinMaxConnsWithCredentials, o.MaxConnections)
		}
	case remote:
		return nil, errors.New("--allow-remote: a proxy listening beyond loopback requires --proxy-user and --proxy-password-file")
	}
	if cfg.SSH, err = o.SSH.Config(o.Destination); err != nil {
		return nil, err
	}
	return cfg, nil
}

// readPassword reads the first line of file. A file of the user's that group or others may read is refused,
// as OpenSSH refuses such a key: whoever reads the password can use the proxy.
func readPassword(file string) (string, error) {
	b, fi, err := smallfile.ReadInfo(file)
	if err != nil {
		return "", fmt.Errorf("--proxy-password-file: %w", err)
	}
	if safepath.OpenToOthers(fi, os.Getuid()) {
		return "", fmt.Errorf("--proxy-password-file: permissions %04o for %s are too open: the password must not be readable by others; run chmod 600 %s",
			fi.Mode().Perm(), file, file)
	}
	pw, _, _ := strings.Cut(string(b), "\n")
	pw = strings.TrimSuffix(pw, "\r")
	if pw == "" {
		return "", fmt.Errorf("--proxy-password-file: %s holds an empty password", file)
	}
	if len(pw) > 255 {
		return "", fmt.Errorf("--proxy-password-file: the password is longer than SOCKS5's 255 bytes")
	}
	return pw, nil
}

// Proxy is a `konnect socks` ready to run: one SSH dialer and its local listeners, all bound.
type Proxy struct {
	cfg       *Config
	dialer    *sshdial.Dialer
	server    *socks.Server
	socksLn   net.Listener
	httpLn    net.Listener
	endpoints daemon.Endpoints // health only
	bound     daemon.Bound
}

// New prepares the SSH dialer and binds every listener, so that a bad address or a port in use fails here.
// Nothing stays bound when New fails. The SSH config file's Match exec commands, which run here, are
// stopped when ctx ends.
func New(ctx context.Context, cfg *Config) (_ *Proxy, err error) {
	ssh := cfg.SSH
	ssh.Log = klog.NewKlogr()
	d, err := sshdial.NewContext(ctx, ssh)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, dialer: d}
	p.server = &socks.Server{Dial: d.DialContext, Credentials: cfg.Credentials, MaxConns: cfg.MaxConns, Name: "konnect socks",
		Log: klog.NewKlogr()}
	defer p.bound.CloseIfFailed(&err)
	if p.socksLn, err = p.bound.Listen("tcp", cfg.SOCKSAddr, cfg.AllowRemote, "-D"); err != nil {
		return nil, err
	}
	if cfg.HTTPAddr != "" {
		if p.httpLn, err = p.bound.Listen("tcp", cfg.HTTPAddr, cfg.AllowRemote, "--http-listen"); err != nil {
			return nil, err
		}
	}
	if cfg.HealthAddr != "" {
		if p.endpoints.Health, err = p.bound.Listen("tcp", cfg.HealthAddr, cfg.AllowRemote, "--health-listen"); err != nil {
			return nil, err
		}
		reg := p.metrics()
		if err := p.endpoints.RegisterMetrics(reg); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		p.endpoints.HealthMux = daemon.NewHealthMux(nil, sshflags.Names.Checks(p.ReadyChecks()), reg)
	}
	return p, nil
}

// SOCKSAddr is the bound address of the SOCKS5/HTTP port (useful with port 0).
func (p *Proxy) SOCKSAddr() net.Addr { return p.socksLn.Addr() }

// HTTPAddr is the bound address of --http-listen, or nil.
func (p *Proxy) HTTPAddr() net.Addr {
	if p.httpLn == nil {
		return nil
	}
	return p.httpLn.Addr()
}

// HealthAddr is the bound address of --health-listen, or nil.
func (p *Proxy) HealthAddr() net.Addr {
	if p.endpoints.Health == nil {
		return nil
	}
	return p.endpoints.Health.Addr()
}

// Ready reports nil while the SSH connection is up.
func (p *Proxy) Ready() error { return p.dialer.Ready() }

// ReadyChecks are the readiness checks for daemon.NewHealthMux.
func (p *Proxy) ReadyChecks() []healthz.HealthChecker {
	return []healthz.HealthChecker{healthz.NamedCheck("ssh", func(*http.Request) error { return p.dialer.Ready() })}
}

// Startup names the bound addresses and the SSH server; socks prints no line of its own, and logs
// "Serving" once the first SSH connection is up.
func (p *Proxy) Startup() daemon.Startup {
	kv := []any{"socks", p.socksLn.Addr().String(), "via", p.dialer.Target()}
	if p.httpLn != nil {
		kv = append(kv, "http", p.httpLn.Addr().String())
	}
	if p.endpoints.Health != nil {
		kv = append(kv, "health", p.endpoints.Health.Addr().String())
	}
	return daemon.Startup{KV: kv, Ready: p.dialer.Ready, Waiting: "Listening; connecting to the SSH server"}
}

// Close releases what New bound, for a proxy that never runs.
func (p *Proxy) Close() error { return p.bound.Close() }

// Run serves until ctx ends and returns nil then, once every listener and connection is closed. It returns
// an error, after stopping everything, when the SSH connection is refused for good (untrusted host key,
// failed authentication) or a listener fails.
func (p *Proxy) Run(ctx context.Context) error {
	// The graceful timeout is 0: proxied connections close at once on stop, so ShutdownGrace bounds every part.
	g := daemon.Group{StopTimeout: daemon.ShutdownGrace}
	p.endpoints.AddTo(&g)
	// Unnamed: the dialer's errors name the SSH server themselves.
	g.Add("", p.dialer.Run)
	g.Add("proxy", func(ctx context.Context) error { return p.server.Serve(ctx, p.socksLn, socks.Auto) })
	if p.httpLn != nil {
		g.Add("http proxy", func(ctx context.Context) error { return p.server.Serve(ctx, p.httpLn, socks.HTTPOnly) })
	}
	return g.Run(ctx)
}

// metrics returns a fresh registry with the proxy's gauges.
func (p *Proxy) metrics() *prometheus.Registry {
	reg := daemon.NewRegistry()
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "konnect_socks_ssh_up",
			Help: "1 while the SSH connection is established, 0 otherwise.",
		}, func() float64 {
			if p.dialer.Ready() == nil {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "konnect_socks_client_connections",
			Help: "Proxy client connections being served.",
		}, func() float64 { return float64(p.server.ActiveConns()) }),
	)
	return reg
}

// NewSocksCommand returns `konnect socks`.
func NewSocksCommand() *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "socks [flags] [user@]host",
		Short: "SSH-backed SOCKS5 and HTTP proxy (like ssh -D, with host key checks, reconnects and health endpoints)",
		Long: `konnect socks keeps one SSH connection to host and serves, on one local port, SOCKS5 (names are resolved
on the remote side, like ssh -D) and HTTP proxying (CONNECT and http:// URLs). Point kubectl at it with
'konnect kubeconfig set-proxy --context NAME --proxy-url socks5://127.0.0.1:1080'.

Host keys are checked against known_hosts: an unknown host is refused with the line to add (or use
--accept-new once), and a changed key is always refused. If the SSH connection drops, the port stays open
but the connections it carried end (a watch, a download: clients must open them again, as with ssh -D),
new connections wait up to --connect-timeout, and konnect reconnects: in the background with backoff, and
at once when a connection waits. Keepalives drop a server that stops answering within 20s (a waiting
connection checks after a second). A refused first connection, a first peer that is not an SSH server (or a
ProxyCommand that exits), failed authentication, no identity at all or an identity file that others may read
end the command instead (--retry-first keeps retrying the first). --ssh-config lists the ssh_config keywords
konnect reads; ProxyCommand and StrictHostKeyChecking accept-new work as in OpenSSH.
Errors tell the SSH server's failure (SOCKS5 reply 1, HTTP 503) from the destination's (reply 5, 502, ...).

With --ssh-connections N, konnect keeps N SSH connections to host and gives each new proxied connection to
the one carrying the fewest: OpenSSH encrypts one SSH connection on one core at each end, so parallel
downloads then use more cores. Each SSH connection checks the host key and reconnects on its own; a lost
one breaks only the proxied connections it carried. konnect socks runs one Go scheduler thread per SSH
connection (GOMAXPROCS), which measured cheaper per byte; set GOMAXPROCS to override.

ssh's -N (a no-op: konnect never runs a remote command), -q (errors only) and -C (ignored, with a notice:
no compression) are taken, so that an ssh -D line pastes; -f, -4, -6 and -o are refused with an error that
says what to use instead. The log says "Serving" once the SSH connection is up.`,
		Example: `  konnect socks -D 1080 alice@bastion.example.com
  konnect socks -D 1080 -N -q alice@bastion.example.com   # as ssh -D 1080 -N -q would
  konnect socks -J jump.example.com -i ~/.ssh/id_ed25519 --health-listen 127.0.0.1:8081 bastion
  konnect socks -D 1080 --ssh-connections 4 alice@bastion.example.com`,
		Args: cobra.ExactArgs(1),
		RunE: sshflags.Names.RunE(func(cmd *cobra.Command, args []string) error {
			o.Destination = args[0]
			return run(cmd.Context(), o, cmd.OutOrStdout())
		}),
	}
	o.AddFlags(cmd.Flags())
	daemon.AddKlogFlags(cmd.Flags(), "v", "vmodule")
	return cmd
}

func run(ctx context.Context, o *Options, out io.Writer) error {
	o.SSH.Quieten()
	// The process is tuned here, not in Run, which tests call in their own process.
	config := func() (*Config, error) {
		cfg, err := o.Config()
		if err == nil {
			o.SSH.Notice()
			tuneProcess(cfg.SSH.Connections)
		}
		return cfg, err
	}
	return daemon.RunCommand(ctx, out, config, New)
}

// tuneProcess sets the collector and the scheduler for sshConns SSH connections.
func tuneProcess(sshConns int) {
	// The SSH library allocates a fresh buffer for every 32 KiB packet; measured against sshd on
	// loopback, GOGC=400 cut konnect's CPU per GiB by about 30%.
	daemon.TuneGC(400, 0)
	// x/crypto/ssh moves each SSH connection's packets through three goroutines in turn; with more Ps
	// than SSH connections the hand-offs wake other threads, which costs more than the overlap gains.
	// Measured against sshd: one P per connection used a quarter to a third less CPU per GiB and was
	// faster in 8 of 9 paired single-stream rounds (docs/performance.md).
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(max(1, min(runtime.GOMAXPROCS(0), sshConns)))
	}
}
