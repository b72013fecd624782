package proxycmd

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/cmd/internal/sshflags"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/konnect-dev/konnect/socks/apiproxy"
	"github.com/konnect-dev/konnect/socks/sshdial"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// kubectl proxy's defaults that have no constant in the apiproxy package.
const (
	defaultPort         = 8001
	defaultAddress      = "127.0.0.1"
	defaultAPIPrefix    = "/"
	defaultStaticPrefix = "/static/"
)

// Options are the flags of konnect proxy: kubectl proxy's own flags with kubectl's names, shorthands and
// defaults, the kubeconfig selection flags kubectl has globally, and konnect's additions.
type Options struct {
	// kubectl proxy's flags.
	Port             int
	Address          string
	UnixSocket       string
	AcceptHosts      string
	AcceptPaths      string
	RejectPaths      string
	RejectMethods    string
	DisableFilter    bool
	APIPrefix        string
	StaticDir        string
	StaticPrefix     string
	Keepalive        time.Duration
	AppendServerPath bool

	// Kubeconfig selection, as kubectl's global flags spell it.
	Kubeconfig string
	Overrides  clientcmd.ConfigOverrides

	// konnect's additions.
	AllowRemote    bool
	MaxConnections int
	BackendHTTP2   bool
	HealthListen   string // /healthz /livez /readyz and /metrics; off when empty
	// Via is the SSH destination ([user@]host) that carries the API traffic; SSH holds the SSH flags.
	Via string
	SSH *sshflags.Flags
}

// NewOptions returns kubectl proxy's defaults.
func NewOptions() *Options {
	f := apiproxy.DefaultFilterSpec()
	return &Options{
		Port:           defaultPort,
		Address:        defaultAddress,
		AcceptHosts:    f.AcceptHosts,
		AcceptPaths:    f.AcceptPaths,
		RejectPaths:    f.RejectPaths,
		RejectMethods:  f.RejectMethods,
		APIPrefix:      defaultAPIPrefix,
		StaticPrefix:   defaultStaticPrefix,
		MaxConnections: apiproxy.DefaultMaxConnections,
		SSH:            sshflags.NewFlags(),
	}
}

// AddFlags registers the flags. kubectl proxy's flags keep kubectl's help text so that its users find what
// they know.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.StaticDir, "www", "w", o.StaticDir, "Also serve static files from the given directory under the specified prefix.")
	fs.StringVarP(&o.StaticPrefix, "www-prefix", "P", o.StaticPrefix, "Prefix to serve static files under, if static file directory is specified.")
	fs.StringVar(&o.APIPrefix, "api-prefix", o.APIPrefix, "Prefix to serve the proxied API under.")
	fs.StringVar(&o.AcceptPaths, "accept-paths", o.AcceptPaths, "Regular expression for paths that the proxy should accept.")
	fs.StringVar(&o.RejectPaths, "reject-paths", o.RejectPaths, "Regular expression for paths that the proxy should reject. Paths specified here will be rejected even accepted by --accept-paths.")
	fs.StringVar(&o.AcceptHosts, "accept-hosts", o.AcceptHosts, "Regular expression for hosts that the proxy should accept.")
	fs.StringVar(&o.RejectMethods, "reject-methods", o.RejectMethods, "Regular expression for HTTP methods that the proxy should reject (example --reject-methods='POST,PUT,PATCH'). ")
	fs.IntVarP(&o.Port, "port", "p", o.Port, "The port on which to run the proxy. Set to 0 to pick a random port.")
	fs.StringVar(&o.Address, "address", o.Address, "The IP address on which to serve on. An address that is not loopback also needs --allow-remote.")
	fs.BoolVar(&o.DisableFilter, "disable-filter", o.DisableFilter, "If true, disable request filtering in the proxy. This is dangerous, and can leave you vulnerable to XSRF attacks, when used with an accessible port.")
	fs.StringVarP(&o.UnixSocket, "unix-socket", "u", o.UnixSocket, "Unix socket on which to run the proxy.")
	fs.DurationVar(&o.Keepalive, "keepalive", o.Keepalive, "TCP keep-alive period of connections to the API server. 0 means the default (30s); a negative value turns keep-alives off.")
	fs.BoolVar(&o.AppendServerPath, "append-server-path", o.AppendServerPath, "If true, enables automatic path appending of the kube context server path to each request.")

	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to the kubeconfig file to use (default: $KUBECONFIG, then ~/.kube/config).")
	names := clientcmd.RecommendedConfigOverrideFlags("")
	names.Timeout = clientcmd.FlagInfo{} // a proxy does not time out the requests it forwards
	names.ClusterOverrideFlags.APIServer.ShortName = "s"
	clientcmd.BindOverrideFlags(&o.Overrides, fs, names)
	// kubectl's global flags that mean nothing to a proxy are taken and ignored, so that a kubectl proxy
	// command line runs unchanged: kubectl proxy ignores --request-timeout too (its transport has no
	// client timeout), and the others concern kubectl's own discovery cache, version check and profiling.
	for _, name := range []string{"request-timeout", "cache-dir", "profile", "profile-output", "log-flush-frequency"} {
		fs.String(name, "", "")
		_ = fs.MarkHidden(name)
	}
	for _, name := range []string{"match-server-version", "warnings-as-errors"} {
		fs.Bool(name, false, "")
		_ = fs.MarkHidden(name)
	}

	fs.BoolVar(&o.AllowRemote, "allow-remote", o.AllowRemote, "Allow --address to be an address that is not loopback. Anyone who can reach it acts with your kubeconfig's credentials; --accept-hosts must then also name the host clients use.")
	fs.IntVar(&o.MaxConnections, "max-connections", o.MaxConnections, "Most client connections open at once; more are answered with 503 and closed.")
	fs.StringVar(&o.HealthListen, "health-listen", o.HealthListen, "Serve /healthz, /livez and /readyz (the API server answers its /readyz; with --via, the SSH connection is up) and /metrics on this host:port. Off when empty, as kubectl proxy has none.")
	fs.BoolVar(&o.BackendHTTP2, "backend-http2", o.BackendHTTP2, "Speak HTTP/2 to the API server for plain requests (one connection for everything) instead of a pool of HTTP/1.1 connections.")
	fs.StringVar(&o.Via, "via", o.Via, "Carry the API traffic over SSH through [user@]host (the API server's name is resolved there); the kubeconfig's proxy-url is then ignored. The SSH flags below apply.")
	// After the proxy's own flags, so that -p stays --port and SSH's port is --ssh-port.
	o.SSH.AddFlags(fs)
}

// Validate checks the flags on their own; every error names its flag.
func (o *Options) Validate() error {
	var errs []error
	if o.UnixSocket != "" && o.Port != defaultPort {
		errs = append(errs, errors.New("cannot set --unix-socket and --port at the same time"))
	}
	if o.UnixSocket == "" {
		if o.Port < 0 || o.Port > 65535 {
			errs = append(errs, fmt.Errorf("--port: %d is not a port number (0 to 65535)", o.Port))
		}
		if net.ParseIP(o.Address) == nil && o.Address != "localhost" {
			errs = append(errs, fmt.Errorf("--address: %q is not an IP address", o.Address))
		} else if err := daemon.CheckLoopback(net.JoinHostPort(o.Address, strconv.Itoa(o.Port)), o.AllowRemote, "--address"); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Via != "" {
		if _, err := o.SSH.Config(o.Via); err != nil {
			errs = append(errs, fmt.Errorf("--via: %w", err))
		}
	} else if given := o.SSH.Given(); len(given) > 0 {
		// Without --via there is no SSH: a --jump or --identity meant for it would be silently ignored.
		errs = append(errs, fmt.Errorf("%s: applies only with --via [user@]host", strings.Join(given, ", ")))
	}
	if o.MaxConnections < 1 {
		errs = append(errs, fmt.Errorf("--max-connections: %d must be at least 1", o.MaxConnections))
	}
	if o.HealthListen != "" {
		if err := daemon.CheckLoopback(o.HealthListen, o.AllowRemote, "--health-listen"); err != nil {
			errs = append(errs, err)
		}
	}
	if !o.DisableFilter {
		if _, err := o.filterSpec().Compile(); err != nil {
			errs = append(errs, err)
		}
	}
	return names.Error(errors.Join(errs...))
}

func (o *Options) filterSpec() apiproxy.FilterSpec {
	return apiproxy.FilterSpec{
		AcceptPaths:   o.AcceptPaths,
		RejectPaths:   o.RejectPaths,
		AcceptHosts:   o.AcceptHosts,
		RejectMethods: o.RejectMethods,
	}
}

// restConfig loads the kubeconfig with client-go's standard rules ($KUBECONFIG, ~/.kube/config, in-cluster)
// and the override flags.
func (o *Options) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	// client-go reads these without a bound and blocks on a FIFO: each is checked first, as konnect reads
	// its own files (a missing one is client-go's to report, or to skip).
	if o.Kubeconfig != "" {
		if err := checkFile(o.Kubeconfig); err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
	} else {
		for _, f := range rules.Precedence {
			if err := checkFile(f); err != nil {
				return nil, fmt.Errorf("kubeconfig: %w", err)
			}
		}
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &o.Overrides)
	if err := o.checkCredentialFiles(cc); err != nil {
		return nil, err
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		where := "--kubeconfig"
		if o.Kubeconfig == "" {
			where = "kubeconfig"
		}
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if rc.UserAgent == "" {
		rc.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if err := o.checkClientCert(rc); err != nil {
		return nil, err
	}
	return rc, nil
}

// checkCredentialFiles checks, as checkFile, the certificate, key and CA files that ClientConfig would open:
// the flags', and those of the context in use.
func (o *Options) checkCredentialFiles(cc clientcmd.ClientConfig) error {
	flags := []struct{ flag, path string }{
		{"--client-certificate", o.Overrides.AuthInfo.ClientCertificate},
		{"--client-key", o.Overrides.AuthInfo.ClientKey},
		{"--certificate-authority", o.Overrides.ClusterInfo.CertificateAuthority},
	}
	for _, f := range flags {
		if err := checkFile(f.path); err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	raw, err := cc.RawConfig()
	if err != nil {
		return nil // ClientConfig reports it, naming the flag
	}
	name := o.Overrides.CurrentContext
	if name == "" {
		name = raw.CurrentContext
	}
	ctx := raw.Contexts[name]
	if ctx == nil {
		return nil
	}
	user, cluster := o.Overrides.Context.AuthInfo, o.Overrides.Context.Cluster
	if user == "" {
		user = ctx.AuthInfo
	}
	if cluster == "" {
		cluster = ctx.Cluster
	}
	var files []string
	if a := raw.AuthInfos[user]; a != nil {
		files = append(files, a.ClientCertificate, a.ClientKey, a.TokenFile)
	}
	if c := raw.Clusters[cluster]; c != nil {
		files = append(files, c.CertificateAuthority)
	}
	for _, f := range files {
		if err := checkFile(f); err != nil {
			return fmt.Errorf("kubeconfig context %q: %w", name, err)
		}
	}
	return nil
}

// checkFile refuses what smallfile refuses (a FIFO, a device, a file over its bound) at path, if anything
// is there; a missing file is left to client-go, which skips or reports it.
func checkFile(path string) error {
	if path == "" {
		return nil
	}
	if err := smallfile.Check(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// checkClientCert loads the client certificate and key once, so that a file that is no key (or the key of
// another certificate) fails the start instead of every request. rc keeps its file names: client-go reads
// rotated files again from those.
func (o *Options) checkClientCert(rc *rest.Config) error {
	c := rest.CopyConfig(rc)
	where := "the kubeconfig's client-certificate and client-key"
	if o.Overrides.AuthInfo.ClientCertificate != "" || o.Overrides.AuthInfo.ClientKey != "" {
		where = "--client-certificate and --client-key"
	}
	for _, f := range []string{c.CertFile, c.KeyFile, c.CAFile} {
		if err := checkFile(f); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	if err := rest.LoadTLSFiles(c); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if len(c.CertData) == 0 && len(c.KeyData) == 0 {
		return nil
	}
	if _, err := tls.X509KeyPair(c.CertData, c.KeyData); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// Config is the validated configuration of `konnect proxy`: the proxy, where it listens, and the SSH
// connection under it when --via is set.
type Config struct {
	Proxy apiproxy.Config
	// Network is "tcp" or "unix"; Address is host:port or the socket path.
	Network     string
	Address     string
	AllowRemote bool
	// HealthAddr is where the health and metrics endpoints listen; empty: none.
	HealthAddr string
	// SSH is set with --via.
	SSH *sshdial.Config
}

// Config validates the flags and builds the Config, loading the kubeconfig; each error names its flag. It
// logs kubectl's warnings, and binds, starts and dials nothing.
func (o *Options) Config() (*Config, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	pc, err := o.proxyConfig()
	if err != nil {
		return nil, err
	}
	cfg := &Config{Proxy: pc, Network: "tcp", Address: net.JoinHostPort(o.Address, strconv.Itoa(o.Port)), AllowRemote: o.AllowRemote, HealthAddr: o.HealthListen}
	if o.UnixSocket != "" {
		cfg.Network, cfg.Address = "unix", o.UnixSocket
	}
	if o.Via != "" {
		sc, err := o.SSH.Config(o.Via)
		if err != nil {
			return nil, fmt.Errorf("--via: %w", err)
		}
		cfg.SSH = &sc
		if pc.REST.Proxy != nil {
			klog.InfoS("Ignoring the kubeconfig's proxy-url: --via carries the traffic", "via", o.Via)
		}
	}
	return cfg, nil
}

func (o *Options) proxyConfig() (apiproxy.Config, error) {
	rc, err := o.restConfig()
	if err != nil {
		return apiproxy.Config{}, err
	}
	cfg := apiproxy.Config{
		HandlerConfig: apiproxy.HandlerConfig{
			REST:             rc,
			APIPrefix:        withSlash(o.APIPrefix),
			StaticDir:        o.StaticDir,
			StaticPrefix:     withSlash(o.StaticPrefix),
			AppendServerPath: o.AppendServerPath,
			Keepalive:        o.Keepalive,
			HTTP2:            o.BackendHTTP2,
		},
		MaxConnections: o.MaxConnections,
		// kubectl proxy has no flag for it; requests in flight get this long on SIGTERM.
		ShutdownGrace: apiproxy.DefaultShutdownGrace,
	}

	if !o.AppendServerPath {
		if u, err := url.Parse(rc.Host); err == nil && u.Path != "" && u.Path != "/" {
			klog.Warning("Your kube context contains a server path " + u.Path + ", use --append-server-path to automatically append the path to each request")
		}
	}
	if o.DisableFilter {
		if o.UnixSocket == "" {
			klog.Warning("Request filter disabled, your proxy is vulnerable to XSRF attacks, please be cautious")
		}
	} else {
		f, err := o.filterSpec().Compile()
		if err != nil {
			return apiproxy.Config{}, err
		}
		cfg.Filter = f
	}
	if o.StaticDir != "" {
		fi, err := os.Stat(o.StaticDir)
		if err != nil {
			klog.Warning("Failed to stat static file directory "+o.StaticDir+": ", err)
		} else if !fi.IsDir() {
			klog.Warning("Static file directory " + o.StaticDir + " is not a directory")
		}
	}
	if o.UnixSocket == "" && o.AllowRemote {
		klog.Warningf("Serving on %s with --allow-remote: anyone who can reach this address acts with the credentials of your kubeconfig", o.Address)
		if !o.DisableFilter && o.AcceptHosts == apiproxy.DefaultAcceptHosts {
			klog.Warning("--accept-hosts still accepts only localhost: requests that name this host another way are refused with 403")
		}
	}
	return cfg, nil
}

func withSlash(p string) string {
	if strings.HasSuffix(p, "/") {
		return p
	}
	return p + "/"
}
