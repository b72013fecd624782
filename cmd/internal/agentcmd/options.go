package agentcmd

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/agent"
	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/pki/address"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	upstream "sigs.k8s.io/apiserver-network-proxy/cmd/agent/app/options"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// Options are the command-line settings of `konnect agent`: every flag of upstream proxy-agent v0.36.0,
// registered by upstream's own options type so that names and defaults cannot drift, plus konnect's own.
type Options struct {
	// Upstream holds proxy-agent's flags (connection, TLS, identity, sync, health and admin ports, leases).
	Upstream *upstream.GrpcProxyAgentOptions

	// konnect only.
	AllowDestinations []string      // --allow-destination CIDR:PORTS, repeatable; empty allows all
	GracefulTimeout   time.Duration // --graceful-timeout
	DialTimeout       time.Duration // --dial-timeout
	ConnectionBuffer  int           // --connection-buffer-bytes
	StallTimeout      time.Duration // --connection-stall-timeout
	ReadBuffer        int           // --read-buffer-bytes
	AllowRemoteAdmin  bool          // --allow-remote-admin
	FlowControl       daemon.FlowControl
}

// NewOptions returns upstream's defaults plus konnect's.
func NewOptions() *Options {
	return &Options{
		Upstream:         upstream.NewGrpcProxyAgentOptions(),
		GracefulTimeout:  agent.DefaultGracefulTimeout,
		DialTimeout:      agent.DefaultDialTimeout,
		ConnectionBuffer: flow.DefaultLimit,
		StallTimeout:     flow.DefaultStallTimeout,
		ReadBuffer:       agent.DefaultReadBuffer,
		FlowControl:      daemon.NewFlowControl(),
	}
}

// AddFlags registers every flag on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.AddFlagSet(o.Upstream.Flags())
	if f := fs.Lookup("proxy-server-host"); f != nil {
		f.Usage = "The proxy server to connect to: a host name or address, or a comma-separated list of them " +
			"(entries may carry their own :port). The agent connects to every server listed and to every " +
			"address a name resolves to."
	}
	if f := fs.Lookup("ca-cert"); f != nil {
		f.Usage = "CA bundle that verifies the proxy servers' certificates; reloaded when it changes on disk. Empty means the system roots."
	}
	if f := fs.Lookup("agent-cert"); f != nil {
		f.Usage = "Client certificate presented to the proxy servers (mTLS), with --agent-key; reloaded when it changes on disk."
	}
	if f := fs.Lookup("agent-key"); f != nil {
		f.Usage = "Key of --agent-cert; reloaded when it changes on disk."
	}
	if f := fs.Lookup("service-account-token-path"); f != nil {
		f.Usage = "File with the ServiceAccount token (audience system:konnectivity-server) sent to the proxy servers; read again on every connect, so the kubelet's rotations apply."
	}
	if f := fs.Lookup("health-server-host"); f != nil {
		f.Usage = "The address the health server (/healthz, /livez, /readyz, /metrics) listens on, without port. " +
			"Empty (upstream's default) means all interfaces, so that the kubelet can probe the pod IP."
	}
	if f := fs.Lookup("admin-bind-address"); f != nil {
		f.Usage = "Bind address for the admin server (the agent's status at /debug/servers; pprof with --enable-profiling). It must be a loopback address unless --allow-remote-admin is set."
	}
	if f := fs.Lookup("xfr-channel-size"); f != nil {
		f.Usage = "Accepted for compatibility with upstream; konnect bounds each connection's queue in bytes (--connection-buffer-bytes)."
	}
	fs.StringArrayVar(&o.AllowDestinations, "allow-destination", o.AllowDestinations,
		"Only dial backends in CIDR:PORTS, for example 10.0.0.0/8:443,8443 or 198.19.0.0/16:1-65535. Repeatable. "+
			"Off by default (every destination is allowed, as upstream). A refused dial is answered with an error and never dialled.")
	fs.BoolVar(&o.AllowRemoteAdmin, "allow-remote-admin", o.AllowRemoteAdmin,
		"Allow a non-loopback --admin-bind-address (the admin port serves pprof).")
	fs.DurationVar(&o.GracefulTimeout, "graceful-timeout", o.GracefulTimeout,
		"On SIGTERM, how long open connections may continue after DRAIN was sent to the servers; 0 closes them at once.")
	fs.DurationVar(&o.DialTimeout, "dial-timeout", o.DialTimeout, "Timeout for dialling a backend.")
	fs.IntVar(&o.ConnectionBuffer, "connection-buffer-bytes", o.ConnectionBuffer,
		"With a server without flow control: bytes queued for one backend before the agent waits for it to read. Connections have their own queues, so a slow backend does not hold up the others while its queue has room.")
	fs.DurationVar(&o.StallTimeout, "connection-stall-timeout", o.StallTimeout,
		"With a server without flow control: a backend whose queue is full and that reads nothing for this long (its socket acknowledges nothing) is closed, so that it cannot hold up for good the stream it shares with every other connection (ANP issue 180). One that keeps reading, however slowly, is waited for.")
	o.FlowControl.AddFlags(fs, "servers")
	fs.IntVar(&o.ReadBuffer, "read-buffer-bytes", o.ReadBuffer,
		"Largest read from a backend, and so the largest DATA message sent to a server (4096 to 1048576; gRPC servers accept 4 MiB by default). Connections start with 4 KiB reads and grow only while reads fill the buffer.")
}

// Validate checks the options; each error names the flag to fix.
func (o *Options) Validate() error {
	u := o.Upstream
	var errs []error
	add := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	// wrap keeps err, so that errors.Is and errors.As still see it (a missing file is fs.ErrNotExist).
	wrap := func(flag string, err error) {
		errs = append(errs, fmt.Errorf("--%s: %w", flag, err))
	}
	fileFlag := func(flag, path string) {
		if path == "" {
			return
		}
		if err := smallfile.Check(path); err != nil {
			wrap(flag, err)
		}
	}
	fileFlag("ca-cert", u.CaCert)
	fileFlag("agent-cert", u.AgentCert)
	fileFlag("agent-key", u.AgentKey)
	fileFlag("service-account-token-path", u.ServiceAccountTokenPath)
	fileFlag("kubeconfig", u.KubeconfigPath)
	if (u.AgentCert == "") != (u.AgentKey == "") {
		add("agent-cert", "--agent-cert and --agent-key must be given together")
	}
	if u.ProxyServerPort <= 0 || u.ProxyServerPort > 65535 {
		add("proxy-server-port", "port %d out of range 1-65535", u.ProxyServerPort)
	} else if _, err := agent.SplitServers(u.ProxyServerHost, u.ProxyServerPort); err != nil {
		wrap("proxy-server-host", err)
	}
	if u.HealthServerPort <= 0 || u.HealthServerPort > 65535 {
		add("health-server-port", "port %d out of range 1-65535", u.HealthServerPort)
	}
	if u.AdminServerPort <= 0 || u.AdminServerPort > 65535 {
		add("admin-server-port", "port %d out of range 1-65535", u.AdminServerPort)
	}
	if u.HealthServerHost != "" {
		if err := address.Validate(strings.ToLower(u.HealthServerHost)); err != nil {
			add("health-server-host", "%v", err)
		}
	}
	if u.XfrChannelSize <= 0 {
		add("xfr-channel-size", "must be greater than 0, got %d", u.XfrChannelSize)
	}
	if u.EnableContentionProfiling && !u.EnableProfiling {
		add("enable-contention-profiling", "needs --enable-profiling")
	}
	if u.SyncInterval <= 0 {
		add("sync-interval", "must be positive, got %v", u.SyncInterval)
	}
	if u.SyncInterval > u.SyncIntervalCap {
		add("sync-interval", "%v is larger than --sync-interval-cap %v", u.SyncInterval, u.SyncIntervalCap)
	}
	if u.ProbeInterval <= 0 {
		add("probe-interval", "must be positive, got %v", u.ProbeInterval)
	}
	// 0 is gRPC's "no keepalive", which upstream's agent starts with: the agent then pings hourly.
	if u.KeepaliveTime < 0 {
		add("keepalive-time", "must not be negative, got %v", u.KeepaliveTime)
	}
	if u.AgentID == "" {
		add("agent-id", "must not be empty")
	}
	unroutable, err := validateIdentifiers(u.AgentIdentifiers)
	if err != nil {
		wrap("agent-identifiers", err)
	}
	for _, w := range unroutable {
		// Upstream's agent starts with these, and a manifest written for it (one passing ${HOST_IP}, which
		// the kubelet does not expand) must not leave a drop-in crash-looping: they route nothing, so say so.
		klog.Warningf("--agent-identifiers: %s: the server will route no dial to this agent by it", w)
	}
	if u.CountServerLeases {
		if _, err := labels.Parse(u.LeaseLabel); err != nil {
			wrap("lease-label", err)
		}
		if u.LeaseNamespace == "" {
			add("lease-namespace", "must not be empty with --count-server-leases")
		}
	}
	switch u.ServerCountSource {
	case "", "default", "max":
	default:
		add("server-count-source", "must be 'default' or 'max', got %q", u.ServerCountSource)
	}
	for _, d := range o.AllowDestinations {
		if _, err := agent.ParseDestination(d); err != nil {
			wrap("allow-destination", err)
		}
	}
	if o.GracefulTimeout < 0 {
		add("graceful-timeout", "must not be negative, got %v", o.GracefulTimeout)
	}
	if o.DialTimeout <= 0 {
		add("dial-timeout", "must be positive, got %v", o.DialTimeout)
	}
	if o.ConnectionBuffer <= 0 {
		add("connection-buffer-bytes", "must be positive, got %d", o.ConnectionBuffer)
	}
	if o.StallTimeout <= 0 {
		add("connection-stall-timeout", "must be positive, got %v", o.StallTimeout)
	}
	if o.ReadBuffer < agent.MinReadBuffer || o.ReadBuffer > agent.MaxReadBuffer {
		add("read-buffer-bytes", "must be between %d and %d, got %d", agent.MinReadBuffer, agent.MaxReadBuffer, o.ReadBuffer)
	}
	if err := o.FlowControl.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateIdentifiers refuses what upstream's agent refuses (a string that is not URL-encoded, an unknown
// type) and returns, as unroutable, the values that it accepts but that match no dial: the server compares
// a dial's address with them as text.
func validateIdentifiers(s string) (unroutable []string, err error) {
	q, err := url.ParseQuery(s)
	if err != nil {
		return nil, fmt.Errorf("not URL-encoded (for example host=node1&cidr=10.0.0.0/8): %w", err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		for _, v := range q[k] {
			if why := unroutableIdentifier(header.IdentifierType(k), v); why != "" {
				unroutable = append(unroutable, fmt.Sprintf("%s=%q %s", k, v, why))
			}
		}
		switch header.IdentifierType(k) {
		case header.IPv4, header.IPv6, header.CIDR, header.Host, header.DefaultRoute:
		default:
			return nil, fmt.Errorf("unknown identifier type %q (want ipv4, ipv6, host, cidr or default-route)", k)
		}
	}
	return unroutable, nil
}

// unroutableIdentifier says why the value v of an identifier of type k matches no dial, or "".
func unroutableIdentifier(k header.IdentifierType, v string) string {
	switch k {
	case header.IPv4, header.IPv6:
		if a, err := netip.ParseAddr(v); err != nil || a.Is4() != (k == header.IPv4) || a.Zone() != "" {
			return "is not an " + strings.ToUpper(string(k[:2])) + string(k[2:]) + " address"
		}
	case header.CIDR:
		if _, err := netip.ParsePrefix(v); err != nil {
			return "is not a CIDR block such as 10.0.0.0/8"
		}
	case header.DefaultRoute:
		if _, err := strconv.ParseBool(v); err != nil {
			return "is not true or false"
		}
	}
	return ""
}

// Config is the validated configuration of `konnect agent`: the agent's own and its endpoints'.
type Config struct {
	Agent agent.Config

	HealthAddr          string // host:port; all interfaces by default, as upstream, for the kubelet's probes
	AdminAddr           string // host:port; loopback unless AllowRemoteAdmin
	AllowRemoteAdmin    bool
	Profiling           bool // pprof on the admin port
	ContentionProfiling bool

	// Leases, when set, counts the servers by their Lease objects (--count-server-leases).
	Leases *LeaseCount
}

// LeaseCount says where the servers' leases are.
type LeaseCount struct {
	Kubeconfig  string // empty: in-cluster
	Namespace   string
	Selector    string
	ContentType string
}

// Config validates the options and builds the Config; each error names the flag to fix. It reads the files
// named to check them, and binds, starts and dials nothing.
func (o *Options) Config() (*Config, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	u := o.Upstream
	servers, err := agent.SplitServers(u.ProxyServerHost, u.ProxyServerPort)
	if err != nil {
		return nil, fmt.Errorf("--proxy-server-host: %w", err)
	}
	cfg := &Config{
		Agent: agent.Config{
			Servers:          servers,
			CAFile:           u.CaCert,
			CertFile:         u.AgentCert,
			KeyFile:          u.AgentKey,
			ALPNProtos:       u.AlpnProtos,
			TokenFile:        u.ServiceAccountTokenPath,
			AgentID:          u.AgentID,
			Identifiers:      u.AgentIdentifiers,
			SyncInterval:     u.SyncInterval,
			SyncIntervalCap:  u.SyncIntervalCap,
			SyncForever:      u.SyncForever,
			ProbeInterval:    u.ProbeInterval,
			KeepaliveTime:    u.KeepaliveTime,
			ServerCountMax:   u.ServerCountSource == "max",
			DialTimeout:      o.DialTimeout,
			GracefulTimeout:  o.GracefulTimeout,
			ConnectionBuffer: o.ConnectionBuffer,
			StallTimeout:     o.StallTimeout,
			ReadBuffer:       o.ReadBuffer,

			DisableFlowControl: !o.FlowControl.Enabled,
			FlowWindow:         o.FlowControl.Window,
			FlowMaxWindow:      o.FlowControl.MaxWindow,
		},
		HealthAddr:          net.JoinHostPort(u.HealthServerHost, strconv.Itoa(u.HealthServerPort)),
		AdminAddr:           net.JoinHostPort(u.AdminBindAddress, strconv.Itoa(u.AdminServerPort)),
		AllowRemoteAdmin:    o.AllowRemoteAdmin,
		Profiling:           u.EnableProfiling,
		ContentionProfiling: u.EnableContentionProfiling,
	}
	for _, d := range o.AllowDestinations {
		dest, err := agent.ParseDestination(d)
		if err != nil {
			return nil, fmt.Errorf("--allow-destination: %w", err)
		}
		cfg.Agent.Allow = append(cfg.Agent.Allow, dest)
	}
	if u.CountServerLeases {
		cfg.Leases = &LeaseCount{Kubeconfig: u.KubeconfigPath, Namespace: u.LeaseNamespace, Selector: u.LeaseLabel, ContentType: u.APIContentType}
	}
	return cfg, nil
}
