package servercmd

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/address"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/konnect-dev/konnect/pki/uds"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	upstream "sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/proxystrategies"
	"sigs.k8s.io/apiserver-network-proxy/pkg/util"
)

// Options are the flags of `konnect server`: every flag of upstream proxy-server v0.36.0, registered from
// upstream's own options so that names and defaults cannot drift, plus konnect's own.
type Options struct {
	// Upstream holds the proxy-server flags. Their meaning is upstream's, with three differences: a port of 0
	// picks a free port (logged), an empty --health-bind-address means loopback, as konnect binds every
	// endpoint that is not a tunnel listener to loopback unless told otherwise, and --backend-dial-timeout
	// defaults to DefaultBackendDialTimeout instead of 0 (off).
	Upstream *upstream.ProxyRunOptions

	// GracefulTimeout bounds how long Run waits for open tunnels to finish after its context ends, unless
	// --graceful-shutdown-timeout (upstream's, default 0) is given, even as 0.
	GracefulTimeout time.Duration
	// shutdownTimeoutGiven reports whether --graceful-shutdown-timeout was on the command line.
	shutdownTimeoutGiven func() bool
	// AllowRemoteAdmin permits a non-loopback --admin-bind-address (pprof and agent status live there).
	AllowRemoteAdmin bool
	// AllowSharedUDSDir permits a --uds-name directory that everyone may write to (an emptyDir volume).
	AllowSharedUDSDir bool
	// ConnectionBuffer, StallTimeout and MaxFrontendMessage: see tunnel.Config.
	ConnectionBuffer   int
	StallTimeout       time.Duration
	MaxFrontendMessage int
	// FlowControl: per-connection flow control with agents that offer it; see tunnel.Config.
	FlowControl daemon.FlowControl
	// MaxPendingDials bounds the dials waiting for an agent's answer; 0 means no bound (upstream's behaviour).
	MaxPendingDials int
	// ClusterAllowedNames and ServerAllowedNames: see tunnel.Config; empty accepts any certificate the CA
	// signed, as upstream does.
	ClusterAllowedNames []string
	ServerAllowedNames  []string

	// AllowUnauthenticatedAgents permits a server with neither --cluster-ca-cert nor token authentication,
	// which upstream starts silently and konnect refuses.
	AllowUnauthenticatedAgents bool
	// Bounds on agent connections that have not authenticated, and on agents' TokenReviews: see
	// tunnel.Config and tunnel.TokenAuth. A count of 0 means no bound, a cache TTL of 0 no cache.
	AgentAuthTimeout            time.Duration
	MaxUnauthenticated          int
	MaxUnauthenticatedPerSource int
	TokenReviewCacheTTL         time.Duration
	MaxConcurrentTokenReviews   int
}

// NewOptions returns the defaults: upstream's for upstream's flags (but --backend-dial-timeout), and
// konnect's own.
func NewOptions() *Options {
	u := upstream.NewProxyRunOptions()
	u.BackendDialTimeout = tunnel.DefaultBackendDialTimeout
	return &Options{
		Upstream:           u,
		GracefulTimeout:    tunnel.DefaultGracefulTimeout,
		AllowRemoteAdmin:   false,
		ConnectionBuffer:   flow.DefaultLimit,
		StallTimeout:       flow.DefaultStallTimeout,
		MaxFrontendMessage: tunnel.DefaultMaxFrontendMessage,
		MaxPendingDials:    tunnel.DefaultMaxPendingDials,
		FlowControl:        daemon.NewFlowControl(),

		AgentAuthTimeout:            tunnel.DefaultAgentAuthTimeout,
		MaxUnauthenticated:          tunnel.DefaultMaxUnauthenticated,
		MaxUnauthenticatedPerSource: tunnel.DefaultMaxUnauthenticatedPerSource,
		TokenReviewCacheTTL:         tunnel.DefaultTokenReviewCacheTTL,
		MaxConcurrentTokenReviews:   tunnel.DefaultMaxConcurrentReviews,
	}
}

// AddFlags registers upstream's flags and konnect's on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.AddFlagSet(o.Upstream.Flags())
	if f := fs.Lookup("graceful-shutdown-timeout"); f != nil {
		o.shutdownTimeoutGiven = func() bool { return f.Changed }
		f.Usage = "Timeout duration for graceful shutdown of the server; 0 closes open tunnels at once. konnect: when not given, --graceful-timeout applies."
	}
	if f := fs.Lookup("admin-bind-address"); f != nil {
		f.Usage = "The IP address on which to bind the --admin-port (pprof and agent status). konnect: it must be loopback unless --allow-remote-admin is given."
	}
	if f := fs.Lookup("backend-dial-timeout"); f != nil {
		f.Usage = "How long a dial may wait for the agent's answer (DIAL_RSP) before it fails; 0 disables the timeout. " +
			"konnect: on by default (30s, kube-apiserver's own dial timeout) where upstream proxy-server's default is 0 (off), " +
			"and without a goroutine per pending dial. A DIAL_REQ send blocked behind an agent that stops reading is not cut, " +
			"but keeps its --max-pending-dials slot until it returns."
	}
	if f := fs.Lookup("health-bind-address"); f != nil {
		f.Usage = "The IP address on which to listen for the --health-port. konnect: empty means 127.0.0.1, where upstream binds every interface; give an address (or 0.0.0.0) to probe it from elsewhere."
	}
	fs.IntVar(&o.MaxPendingDials, "max-pending-dials", o.MaxPendingDials,
		"konnect: how many dials may wait for an agent's answer at once; further dials are refused with an error naming this flag. 0 means no bound (upstream's behaviour).")
	fs.StringSliceVar(&o.ClusterAllowedNames, "cluster-allowed-names", o.ClusterAllowedNames,
		"konnect: with --cluster-ca-cert, the common names an agent's client certificate may have; empty accepts any certificate that CA signed (upstream's behaviour).")
	fs.StringSliceVar(&o.ServerAllowedNames, "server-allowed-names", o.ServerAllowedNames,
		"konnect: with --server-ca-cert, the common names kube-apiserver's client certificate may have; empty accepts any certificate that CA signed (upstream's behaviour).")
	fs.DurationVar(&o.GracefulTimeout, "graceful-timeout", o.GracefulTimeout,
		"konnect: on SIGTERM, how long open tunnels may finish before they are closed (0: at once); --graceful-shutdown-timeout, when given, wins.")
	fs.BoolVar(&o.AllowRemoteAdmin, "allow-remote-admin", o.AllowRemoteAdmin,
		"konnect: allow a non-loopback --admin-bind-address (it serves pprof and agent status).")
	fs.BoolVar(&o.AllowSharedUDSDir, "allow-shared-uds-dir", o.AllowSharedUDSDir,
		"konnect: accept a --uds-name directory, or one above it, that another user could change (everyone may write to it without the sticky bit, or it belongs to another user), such as an emptyDir volume that kube-apiserver and the server share in one pod; whoever can write there could replace the socket.")
	// The per-connection queue and its stall bound carry the agent's flag names, as they are the same idea
	// on the other end of the tunnel; the server's first names stay as deprecated aliases.
	fs.IntVar(&o.ConnectionBuffer, "connection-buffer-bytes", o.ConnectionBuffer,
		"konnect: for agents without flow control, bytes buffered for each frontend connection before its agent stream waits.")
	fs.DurationVar(&o.StallTimeout, "connection-stall-timeout", o.StallTimeout,
		"konnect: for agents without flow control, how long one full frontend buffer may hold up its agent stream, with no progress, before that connection is closed.")
	o.FlowControl.AddFlags(fs, "agents")
	fs.IntVar(&o.ConnectionBuffer, "frontend-buffer-bytes", o.ConnectionBuffer, "")
	_ = fs.MarkDeprecated("frontend-buffer-bytes", "use --connection-buffer-bytes, the agent's name for the same queue")
	fs.DurationVar(&o.StallTimeout, "stalled-reader-timeout", o.StallTimeout, "")
	_ = fs.MarkDeprecated("stalled-reader-timeout", "use --connection-stall-timeout, the agent's name for the same bound")
	fs.IntVar(&o.MaxFrontendMessage, "max-frontend-message-bytes", o.MaxFrontendMessage,
		"konnect: largest gRPC message accepted from the frontend (kube-apiserver sends one write as one message).")
	o.addAgentAuthFlags(fs)
}

// addAgentAuthFlags registers konnect's flags for agent authentication and the bounds on unauthenticated
// agent connections, and amends the help of upstream's flags they change.
func (o *Options) addAgentAuthFlags(fs *pflag.FlagSet) {
	if f := fs.Lookup("kubeconfig-qps"); f != nil {
		f.Usage += " konnect: applies to the client for /readyz and the lease controller, and, when given, to agents' TokenReviews too, which otherwise have no client-side rate limit but --max-concurrent-token-reviews."
	}
	if f := fs.Lookup("kubeconfig-burst"); f != nil {
		f.Usage += " konnect: see --kubeconfig-qps."
	}
	fs.BoolVar(&o.AllowUnauthenticatedAgents, "allow-unauthenticated-agents", o.AllowUnauthenticatedAgents,
		"konnect: start without agent authentication (neither --cluster-ca-cert nor --agent-namespace/--agent-service-account/--authentication-audience), "+
			"so that anyone who reaches --agent-port can register as an agent and receive kube-apiserver's traffic. Upstream starts so silently; konnect refuses unless this is given, and then warns at every start.")
	fs.DurationVar(&o.AgentAuthTimeout, "agent-auth-timeout", o.AgentAuthTimeout,
		"konnect: a connection to --agent-port that has no accepted Connect stream this long after it was accepted (TLS handshake, bounded to 5s, and authentication included) is closed. gRPC's defaults are 120s for the handshake and no bound after it.")
	fs.IntVar(&o.MaxUnauthenticated, "max-unauthenticated-agent-connections", o.MaxUnauthenticated,
		"konnect: how many connections to --agent-port may be unauthenticated at once; beyond, new ones wait in the accept queue until a slot frees. Authenticated agents do not count. 0 means no bound.")
	fs.IntVar(&o.MaxUnauthenticatedPerSource, "max-unauthenticated-agent-connections-per-source", o.MaxUnauthenticatedPerSource,
		"konnect: how many connections to --agent-port from one source address (an IPv4 address or an IPv6 /64) may be unauthenticated at once; beyond, new ones are reset. Raise it when agents reach the server through a NAT or a load balancer that hides their addresses. 0 means no bound.")
	fs.DurationVar(&o.TokenReviewCacheTTL, "token-review-cache-ttl", o.TokenReviewCacheTTL,
		"konnect: how long an agent token that kube-apiserver accepted is remembered (by its SHA-256, never the token, and never past the token's expiry), so that an agent that reconnects needs no new TokenReview. 0 turns the cache off.")
	fs.IntVar(&o.MaxConcurrentTokenReviews, "max-concurrent-token-reviews", o.MaxConcurrentTokenReviews,
		"konnect: how many agents' TokenReviews may be in flight at once; the others wait their turn. Upstream sends one per Connect stream through a client limited to 5 per second (--kubeconfig-qps), which /readyz shares.")
}

// Validate checks the options and names the flag in every error. It reads no file beyond checking that the
// files named exist and are regular files.
func (o *Options) Validate() error {
	for _, check := range []func() error{
		o.checkFiles, o.checkListeners, o.checkAgentAuth, o.checkTunnel, o.checkKubernetes, o.checkLimits,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// checkFiles: every file flag names a regular file of at most smallfile.MaxSize, as the server reads it: a
// FIFO or a device there would block or fill memory at the read.
func (o *Options) checkFiles() error {
	u := o.Upstream
	for _, f := range []struct{ flag, path string }{
		{"--server-cert", u.ServerCert}, {"--server-key", u.ServerKey}, {"--server-ca-cert", u.ServerCaCert},
		{"--cluster-cert", u.ClusterCert}, {"--cluster-key", u.ClusterKey}, {"--cluster-ca-cert", u.ClusterCaCert},
		{"--kubeconfig", u.KubeconfigPath},
	} {
		if f.path == "" {
			continue
		}
		if err := smallfile.Check(f.path); err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	return nil
}

// warnOpenKeys logs, as konnect init says, a key file that others than its owner may read. A warning, not a
// refusal: the server must start from the files it is given, and a key mounted from a Secret volume has
// the volume's mode (0644 unless defaultMode says otherwise), which is not the server's to choose.
func (o *Options) warnOpenKeys() {
	for _, f := range []struct{ flag, path string }{
		{"--cluster-key", o.Upstream.ClusterKey}, {"--server-key", o.Upstream.ServerKey},
	} {
		if f.path == "" {
			continue
		}
		if note := pki.OpenKeyNote(f.path); note != "" {
			klog.Warningf("%s: %s", f.flag, note)
		}
	}
}

// checkListeners: certificates in pairs, the mode, the frontend (socket or mTLS TCP), the ports and pprof.
func (o *Options) checkListeners() error {
	u := o.Upstream
	if (u.ServerCert == "") != (u.ServerKey == "") {
		return fmt.Errorf("--server-cert and --server-key must be set together")
	}
	if (u.ClusterCert == "") != (u.ClusterKey == "") {
		return fmt.Errorf("--cluster-cert and --cluster-key must be set together")
	}
	if u.ClusterCert == "" {
		return fmt.Errorf("--cluster-cert and --cluster-key are required: agents connect over TLS")
	}
	if u.Mode != "grpc" && u.Mode != "http-connect" {
		return fmt.Errorf("--mode must be grpc or http-connect, not %q", u.Mode)
	}
	if u.UdsName != "" {
		// kube-apiserver dials the socket by the absolute path of its egress selector configuration.
		if err := uds.CheckPath(u.UdsName); err != nil {
			return fmt.Errorf("--uds-name: %w", err)
		}
		if u.ServerPort != 0 {
			return fmt.Errorf("--server-port must be 0 with --uds-name, not %d", u.ServerPort)
		}
		if u.ServerCert != "" || u.ServerKey != "" || u.ServerCaCert != "" {
			return fmt.Errorf("--server-cert, --server-key and --server-ca-cert do not apply with --uds-name")
		}
	} else {
		if u.ServerCaCert == "" || u.ServerCert == "" {
			return fmt.Errorf("--server-cert, --server-key and --server-ca-cert are required for the mTLS TCP frontend (--uds-name is empty)")
		}
	}
	ports := []struct {
		flag     string
		port     int
		frontend bool
	}{
		{"--server-port", u.ServerPort, true}, {"--agent-port", u.AgentPort, false},
		{"--admin-port", u.AdminPort, false}, {"--health-port", u.HealthPort, false},
	}
	for _, p := range ports {
		switch {
		case p.port < 0 || p.port > 65535:
			return fmt.Errorf("%s: %d is not a port", p.flag, p.port)
		case p.port > 49151:
			return fmt.Errorf("%s: %d is in the ephemeral range; pick one below 49152 (or 0 for any free port)", p.flag, p.port)
		case p.port > 0 && p.port < 1024:
			return fmt.Errorf("%s: %d is a reserved port", p.flag, p.port)
		}
	}
	// A mistyped IP address would be looked up in DNS when the listener binds.
	for _, b := range []struct{ flag, addr string }{
		{"--server-bind-address", u.ServerBindAddress}, {"--agent-bind-address", u.AgentBindAddress},
		{"--admin-bind-address", u.AdminBindAddress}, {"--health-bind-address", u.HealthBindAddress},
	} {
		if err := address.MistypedIP(b.addr); err != nil {
			return fmt.Errorf("%s: %w", b.flag, err)
		}
	}
	if u.EnableContentionProfiling && !u.EnableProfiling {
		return fmt.Errorf("--enable-contention-profiling needs --enable-profiling")
	}
	return nil
}

// checkAgentAuth: agents authenticate, by client certificate or by token, unless
// --allow-unauthenticated-agents; token authentication is all or nothing, and excludes client certificates.
func (o *Options) checkAgentAuth() error {
	u := o.Upstream
	if !o.agentsAuthenticate() && !o.AllowUnauthenticatedAgents {
		return errors.New("agents must authenticate: give --cluster-ca-cert (agents present client certificates signed by it), " +
			"or --agent-namespace, --agent-service-account, --authentication-audience and --kubeconfig (agents present ServiceAccount tokens, reviewed by kube-apiserver); " +
			"--allow-unauthenticated-agents lets anyone who reaches --agent-port register as an agent")
	}
	if o.AgentAuthTimeout <= 0 {
		return fmt.Errorf("--agent-auth-timeout must be positive, not %v", o.AgentAuthTimeout)
	}
	for _, f := range []struct {
		flag string
		n    int
	}{
		{"--max-unauthenticated-agent-connections", o.MaxUnauthenticated},
		{"--max-unauthenticated-agent-connections-per-source", o.MaxUnauthenticatedPerSource},
		{"--max-concurrent-token-reviews", o.MaxConcurrentTokenReviews},
	} {
		if f.n < 0 {
			return fmt.Errorf("%s must be >= 0, not %d", f.flag, f.n)
		}
	}
	if o.MaxConcurrentTokenReviews == 0 {
		return errors.New("--max-concurrent-token-reviews must be at least 1")
	}
	if o.TokenReviewCacheTTL < 0 {
		return fmt.Errorf("--token-review-cache-ttl must be >= 0 (0: no cache), not %v", o.TokenReviewCacheTTL)
	}
	if u.AgentNamespace != "" || u.AgentServiceAccount != "" || u.AuthenticationAudience != "" {
		if u.ClusterCaCert != "" {
			return fmt.Errorf("--cluster-ca-cert cannot be combined with token authentication (--agent-namespace, --agent-service-account, --authentication-audience)")
		}
		for _, f := range []struct{ flag, v string }{
			{"--agent-namespace", u.AgentNamespace}, {"--agent-service-account", u.AgentServiceAccount},
			{"--authentication-audience", u.AuthenticationAudience},
		} {
			if f.v == "" {
				return fmt.Errorf("%s is required when agents authenticate by token", f.flag)
			}
		}
	}
	return nil
}

// agentsAuthenticate reports whether the flags give agents a way to authenticate.
func (o *Options) agentsAuthenticate() bool {
	u := o.Upstream
	return u.ClusterCaCert != "" || u.AgentNamespace != "" || u.AgentServiceAccount != "" || u.AuthenticationAudience != ""
}

// checkTunnel: proxy strategies, channel size, server count and TLS parameters.
func (o *Options) checkTunnel() error {
	u := o.Upstream
	if u.ProxyStrategies == "" {
		return fmt.Errorf("--proxy-strategies cannot be empty")
	}
	if _, err := proxystrategies.ParseProxyStrategies(u.ProxyStrategies); err != nil {
		return fmt.Errorf("--proxy-strategies: %w", err)
	}
	if u.XfrChannelSize <= 0 {
		return fmt.Errorf("--xfr-channel-size must be greater than 0, not %d", u.XfrChannelSize)
	}
	switch {
	case u.ServerCount < 0:
		return fmt.Errorf("--server-count must not be negative, not %d", u.ServerCount)
	case u.ServerCount == 0:
		// Upstream's server starts with 0, and its agents count it as 1: a manifest written for it must not
		// leave the drop-in crash-looping.
		klog.Warning("--server-count=0 is taken as 1, as agents take it")
	}
	// Agents tell servers apart by this ID: servers that share one, the empty one included, look like one
	// server to every agent, which then stays connected to one of them only.
	if strings.TrimSpace(u.ServerID) == "" {
		return errors.New("--server-id cannot be empty: agents tell the servers apart by it (leave the flag out for a random one)")
	}
	if u.TLSMinVersion != "" {
		v, err := util.GetTLSVersion(u.TLSMinVersion)
		if err != nil {
			return fmt.Errorf("--tls-min-version: %w", err)
		}
		if v < tls.VersionTLS12 {
			klog.Warningf("--tls-min-version=%s is below TLS 1.2 and is considered insecure (RFC 8996)", u.TLSMinVersion)
		}
	}
	// An empty name would admit exactly the certificates without a common name.
	for flag, names := range map[string][]string{"--cluster-allowed-names": o.ClusterAllowedNames, "--server-allowed-names": o.ServerAllowedNames} {
		if slices.ContainsFunc(names, func(n string) bool { return strings.TrimSpace(n) == "" }) {
			return fmt.Errorf("%s %q: a name cannot be empty", flag, strings.Join(names, ","))
		}
	}
	accepted := util.GetAcceptedCiphers()
	for _, c := range u.CipherSuites {
		if _, ok := accepted[c]; !ok {
			return fmt.Errorf("--cipher-suites: %s is unknown or insecure", c)
		}
	}
	return nil
}

// checkKubernetes: what needs kube-apiserver has a kubeconfig, or, as upstream allows, runs in a pod with
// in-cluster config.
func (o *Options) checkKubernetes() error {
	u := o.Upstream
	if u.EnableLeaseController {
		if _, err := util.ParseLabels(u.LeaseLabel); err != nil {
			return fmt.Errorf("--lease-label: %w", err)
		}
		if errs := validation.IsDNS1123Label(u.LeaseNamespace); len(errs) > 0 {
			return fmt.Errorf("--lease-namespace %q (with --enable-lease-controller): %s", u.LeaseNamespace, strings.Join(errs, "; "))
		}
	}
	var needs []string
	if u.AgentNamespace != "" {
		needs = append(needs, "agents authenticate by token (--agent-namespace)")
	}
	if u.EnableLeaseController {
		needs = append(needs, "--enable-lease-controller")
	}
	if len(needs) > 0 && u.KubeconfigPath == "" {
		if _, err := clientcmd.BuildConfigFromFlags("", ""); err != nil {
			return fmt.Errorf("--kubeconfig is required when %s, outside a pod (no in-cluster config: %w)", strings.Join(needs, " and "), err)
		}
	}
	return nil
}

// checkLimits: timeouts and sizes.
func (o *Options) checkLimits() error {
	u := o.Upstream
	if u.GracefulShutdownTimeout < 0 {
		return fmt.Errorf("--graceful-shutdown-timeout must be >= 0, not %v", u.GracefulShutdownTimeout)
	}
	if u.BackendDialTimeout < 0 {
		return fmt.Errorf("--backend-dial-timeout must be >= 0, not %v", u.BackendDialTimeout)
	}
	if u.KeepaliveTime < 0 {
		return fmt.Errorf("--keepalive-time must be >= 0, not %v", u.KeepaliveTime)
	}
	if u.FrontendKeepaliveTime < 0 {
		return fmt.Errorf("--frontend-keepalive-time must be >= 0, not %v", u.FrontendKeepaliveTime)
	}
	if o.MaxPendingDials < 0 {
		return fmt.Errorf("--max-pending-dials must be >= 0 (0: no bound), not %d", o.MaxPendingDials)
	}
	if o.GracefulTimeout < 0 {
		return fmt.Errorf("--graceful-timeout must be >= 0, not %v", o.GracefulTimeout)
	}
	if o.ConnectionBuffer < 64<<10 {
		return fmt.Errorf("--connection-buffer-bytes (--frontend-buffer-bytes) must be at least 65536, not %d", o.ConnectionBuffer)
	}
	if o.StallTimeout <= 0 {
		return fmt.Errorf("--connection-stall-timeout (--stalled-reader-timeout) must be positive, not %v", o.StallTimeout)
	}
	if o.MaxFrontendMessage < 4<<20 {
		return fmt.Errorf("--max-frontend-message-bytes must be at least 4194304 (gRPC's default), not %d", o.MaxFrontendMessage)
	}
	return o.FlowControl.Validate()
}

// Config is the validated configuration of `konnect server`: the tunnel's and its endpoints'.
type Config struct {
	Tunnel tunnel.Config

	HealthAddr          string // host:port; loopback unless --health-bind-address is set
	AdminAddr           string // host:port; loopback unless AllowRemoteAdmin
	AllowRemoteAdmin    bool
	Profiling           bool // pprof on the admin port
	ContentionProfiling bool
}

// Config validates the options and builds the Config; each error names the flag to fix. It reads the files
// named, warns of a key that others may read, and builds (without contacting) the Kubernetes client that token authentication or the lease
// controller needs, and binds, starts and dials nothing.
func (o *Options) Config() (*Config, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.warnOpenKeys()
	u := o.Upstream
	strategies, err := proxystrategies.ParseProxyStrategies(u.ProxyStrategies)
	if err != nil {
		return nil, fmt.Errorf("--proxy-strategies: %w", err)
	}
	var minVersion uint16
	if u.TLSMinVersion != "" {
		if minVersion, err = util.GetTLSVersion(u.TLSMinVersion); err != nil {
			return nil, fmt.Errorf("--tls-min-version: %w", err)
		}
	}
	var ciphers []uint16
	accepted := util.GetAcceptedCiphers()
	for _, c := range u.CipherSuites {
		ciphers = append(ciphers, accepted[c])
	}
	graceful := o.GracefulTimeout
	if u.GracefulShutdownTimeout > 0 || (o.shutdownTimeoutGiven != nil && o.shutdownTimeoutGiven()) {
		graceful = u.GracefulShutdownTimeout // upstream's flag, also as an explicit 0 (no graceful shutdown)
	}
	healthHost := u.HealthBindAddress
	if healthHost == "" {
		healthHost = "127.0.0.1" // konnect's one difference: the empty default stays on loopback
	}
	cfg := &Config{
		HealthAddr:          net.JoinHostPort(healthHost, strconv.Itoa(u.HealthPort)),
		AdminAddr:           net.JoinHostPort(u.AdminBindAddress, strconv.Itoa(u.AdminPort)),
		AllowRemoteAdmin:    o.AllowRemoteAdmin,
		Profiling:           u.EnableProfiling,
		ContentionProfiling: u.EnableContentionProfiling,
	}
	t := &cfg.Tunnel
	*t = tunnel.Config{
		ServerID:              u.ServerID,
		ServerCount:           max(u.ServerCount, 1),
		Mode:                  u.Mode,
		UDSName:               u.UdsName,
		DeleteExistingUDS:     u.DeleteUDSFile,
		UDSSharedDir:          o.AllowSharedUDSDir,
		ServerCert:            u.ServerCert,
		ServerKey:             u.ServerKey,
		ServerCA:              u.ServerCaCert,
		ClusterCert:           u.ClusterCert,
		ClusterKey:            u.ClusterKey,
		ClusterCA:             u.ClusterCaCert,
		ClusterAllowedNames:   o.ClusterAllowedNames,
		ServerAllowedNames:    o.ServerAllowedNames,
		CipherSuites:          ciphers,
		MinTLSVersion:         minVersion,
		KeepaliveTime:         u.KeepaliveTime,
		FrontendKeepaliveTime: u.FrontendKeepaliveTime,
		ProxyStrategies:       strategies,
		XfrChannelSize:        u.XfrChannelSize,
		BackendDialTimeout:    u.BackendDialTimeout,
		MaxPendingDials:       o.MaxPendingDials,
		GracefulTimeout:       graceful,
		ConnectionBuffer:      o.ConnectionBuffer,
		StallTimeout:          o.StallTimeout,
		DisableFlowControl:    !o.FlowControl.Enabled,
		FlowWindow:            o.FlowControl.Window,
		FlowMaxWindow:         o.FlowControl.MaxWindow,
		MaxFrontendMessage:    o.MaxFrontendMessage,
	}
	t.AllowUnauthenticatedAgents = o.AllowUnauthenticatedAgents && !o.agentsAuthenticate()
	t.AgentAuthTimeout = o.AgentAuthTimeout
	t.MaxUnauthenticated = noBound(o.MaxUnauthenticated)
	t.MaxUnauthenticatedPerSource = noBound(o.MaxUnauthenticatedPerSource)
	if u.UdsName == "" {
		t.ServerAddr = net.JoinHostPort(u.ServerBindAddress, strconv.Itoa(u.ServerPort))
	}
	t.AgentAddr = net.JoinHostPort(u.AgentBindAddress, strconv.Itoa(u.AgentPort))

	needClient := u.AgentNamespace != "" || u.EnableLeaseController
	if needClient {
		rc, err := clientcmd.BuildConfigFromFlags("", u.KubeconfigPath)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", u.KubeconfigPath, err)
		}
		if u.KubeconfigQPS != 0 {
			rc.QPS = u.KubeconfigQPS
		}
		if u.KubeconfigBurst != 0 {
			rc.Burst = u.KubeconfigBurst
		}
		rc.ContentType = u.APIContentType
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: build client: %w", u.KubeconfigPath, err)
		}
		if u.AgentNamespace != "" {
			// Agents' reviews get a client of their own, so that they and /readyz never wait for each other's
			// rate limiter. Without --kubeconfig-qps it has none: --max-concurrent-token-reviews bounds them, so
			// that a storm of reconnecting agents goes as fast as kube-apiserver answers.
			reviews := rest.CopyConfig(rc)
			if u.KubeconfigQPS == 0 {
				reviews.QPS = -1
			}
			reviewClient, err := kubernetes.NewForConfig(reviews)
			if err != nil {
				return nil, fmt.Errorf("--kubeconfig %s: build client: %w", u.KubeconfigPath, err)
			}
			ttl := o.TokenReviewCacheTTL
			if ttl == 0 {
				ttl = -1 // tunnel.TokenAuth's "no cache"
			}
			t.TokenAuth = &tunnel.TokenAuth{
				Namespace:            u.AgentNamespace,
				ServiceAccount:       u.AgentServiceAccount,
				Audience:             u.AuthenticationAudience,
				Client:               reviewClient,
				ProbeClient:          client,
				CacheTTL:             ttl,
				MaxConcurrentReviews: o.MaxConcurrentTokenReviews,
			}
		}
		if u.EnableLeaseController {
			labels, err := util.ParseLabels(u.LeaseLabel)
			if err != nil {
				return nil, fmt.Errorf("--lease-label: %w", err)
			}
			t.Leases = &tunnel.Leases{Namespace: u.LeaseNamespace, Labels: labels, Client: client}
		}
	}
	return cfg, nil
}

// noBound maps a flag's "0: no bound" to tunnel.Config's (negative).
func noBound(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
