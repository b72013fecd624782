package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/pki/address"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is everything the agent needs, already validated by Options. It carries no flag types.
type Config struct {
	// Servers are the servers to connect to, as host:port. A host that resolves to several addresses counts
	// as several servers.
	Servers []string

	CAFile     string   // PEM CA bundle that verifies the servers; empty means the system roots
	CertFile   string   // client certificate for mTLS; empty means none
	KeyFile    string   // its key
	ALPNProtos []string // extra ALPN protocols offered to the server
	TokenFile  string   // ServiceAccount token sent as "Authorization: Bearer"; re-read on each connect

	AgentID     string
	Identifiers string // URL-encoded agent identifiers (host=..&cidr=..&default-route=true)

	SyncInterval    time.Duration // first retry delay, and the pause between connection checks
	SyncIntervalCap time.Duration // retry delays back off up to this
	SyncForever     bool          // keep dialing load-balanced addresses to discover new servers
	ProbeInterval   time.Duration // how often a server connection's transport state is checked
	KeepaliveTime   time.Duration // gRPC keepalive ping interval on an idle transport

	// ServerCount, when set, says how many servers exist (for example from server leases). It is combined
	// with the serverCount header as --server-count-source says: see ServerCountMax.
	ServerCount    func() int
	ServerCountMax bool // true: the larger of ServerCount and the header count; false: ServerCount alone
	// StartAfter, when set, is what Run waits for before it connects: LeaseCounter, whose count means
	// nothing before its watch has synced. Until then initial-sync says what it waits for.
	StartAfter StartGate

	Allow           AllowList     // empty: every destination may be dialled
	DialTimeout     time.Duration // per backend dial
	GracefulTimeout time.Duration // how long Run lets open connections finish after a stop; 0 (or less): close them at once
	// ConnectionBuffer is how many bytes may be queued for one backend before the stream waits for it (see
	// package flow); 0 means flow.DefaultLimit.
	ConnectionBuffer int
	// StallTimeout is how long the stream waits for a backend with a full queue to make progress before
	// that connection is closed as stalled; 0 means flow.DefaultStallTimeout.
	StallTimeout time.Duration
	// The agent offers servers per-connection flow control (docs/flow-control.md) unless DisableFlowControl
	// is set, with FlowWindow as every connection's starting window and FlowMaxWindow as the largest it grows
	// to; 0 means flow.DefaultWindow and flow.DefaultMaxWindow. With a server that does not take the offer up
	// (upstream's), connections get ConnectionBuffer and StallTimeout instead.
	DisableFlowControl bool
	FlowWindow         int
	FlowMaxWindow      int
	// ReadBuffer is the largest read from a backend, and so the largest DATA message the agent sends.
	ReadBuffer int
	// MaxRecvMessage is the largest message accepted from a server. Upstream servers forward a client's
	// write as one DATA message, whatever its size.
	MaxRecvMessage int

	// InitialSyncGrace bounds how long readiness waits, after the start, for every known server to be
	// reached once (the "initial-sync" check); 0 means DefaultInitialSyncGrace.
	InitialSyncGrace time.Duration

	// Registerer receives the agent's metrics; nil means none are exported.
	Registerer prometheus.Registerer
	// Resolver looks up server host names; nil means net.DefaultResolver.
	Resolver *net.Resolver
	// ResolveInterval is how often a server host name is looked up again; 0 means DefaultResolveInterval.
	// A name is also looked up again at once when a stream to one of its addresses ends or fails to open.
	ResolveInterval time.Duration
}

// Defaults for the settings that upstream's proxy-agent does not have.
const (
	DefaultDialTimeout     = 5 * time.Second  // upstream's fixed backend dial timeout
	DefaultGracefulTimeout = 20 * time.Second // --graceful-timeout's default
	// DefaultInitialSyncGrace: a new agent is ready once it has reached every server, or after this long
	// with at least one. Long enough for an agent behind a load balancer to find each server.
	DefaultInitialSyncGrace = 30 * time.Second
	DefaultReadBuffer       = 1<<20 - dataOverhead // see readTiers
	DefaultMaxRecvMessage   = 256 << 20
	MinReadBuffer           = 4 << 10 // smallest and largest ReadBuffer
	MaxReadBuffer           = 1 << 20 // a quarter of gRPC's default 4 MiB receive limit, which upstream's server keeps
)

// DefaultResolveInterval is how often server host names are looked up again: servers that come and go behind
// a name are found without a restart (ANP issue 273), while a fleet of agents does not ask DNS every second.
// A stream that ends or fails to open makes its name be looked up again at once anyway.
const DefaultResolveInterval = 30 * time.Second

func (c *Config) withDefaults() Config {
	cfg := *c
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = time.Second
	}
	if cfg.SyncIntervalCap < cfg.SyncInterval {
		cfg.SyncIntervalCap = cfg.SyncInterval
	}
	if cfg.InitialSyncGrace <= 0 {
		cfg.InitialSyncGrace = DefaultInitialSyncGrace
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.KeepaliveTime <= 0 {
		cfg.KeepaliveTime = time.Hour
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.ConnectionBuffer <= 0 {
		cfg.ConnectionBuffer = flow.DefaultLimit
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = flow.DefaultStallTimeout
	}
	if cfg.FlowWindow <= 0 {
		cfg.FlowWindow = flow.DefaultWindow
	}
	if cfg.FlowMaxWindow <= 0 {
		cfg.FlowMaxWindow = max(flow.DefaultMaxWindow, cfg.FlowWindow)
	}
	if cfg.ReadBuffer < MinReadBuffer {
		cfg.ReadBuffer = DefaultReadBuffer
	}
	cfg.ReadBuffer = min(cfg.ReadBuffer, MaxReadBuffer)
	if cfg.MaxRecvMessage <= 0 {
		cfg.MaxRecvMessage = DefaultMaxRecvMessage
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.ResolveInterval <= 0 {
		cfg.ResolveInterval = DefaultResolveInterval
	}
	return cfg
}

func (c *Config) validate() error {
	if len(c.Servers) == 0 {
		return errors.New("agent: no server address")
	}
	for _, s := range c.Servers {
		host, port, err := net.SplitHostPort(s)
		if err != nil || host == "" {
			return fmt.Errorf("agent: server address %q is not host:port", s)
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return fmt.Errorf("agent: server address %q: bad port", s)
		}
		if err := address.CheckDialable(host); err != nil {
			return fmt.Errorf("agent: server address %q: %w", s, err)
		}
	}
	if c.AgentID == "" {
		return errors.New("agent: empty agent ID")
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("agent: a client certificate needs both a certificate and a key file")
	}
	if !c.DisableFlowControl {
		if err := c.flowOffer().Validate(); err != nil {
			return fmt.Errorf("agent: flow control: %w", err)
		}
	}
	return nil
}

// SplitServers turns a --proxy-server-host value (one host, or a comma-separated list) and the
// --proxy-server-port value into host:port addresses. An entry that already carries a port ("host:port",
// "[v6]:port") keeps it.
func SplitServers(hosts string, port int) ([]string, error) {
	var out []string
	for _, h := range strings.Split(hosts, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if host, p, err := net.SplitHostPort(h); err == nil {
			n, err := strconv.Atoi(p)
			if err != nil || n <= 0 || n > 65535 || host == "" {
				return nil, fmt.Errorf("%q: bad host:port", h)
			}
			if err := validateServerHost(host); err != nil {
				return nil, err
			}
			out = append(out, h)
			continue
		}
		host := strings.Trim(h, "[]")
		if err := validateServerHost(host); err != nil {
			return nil, err
		}
		out = append(out, net.JoinHostPort(host, strconv.Itoa(port)))
	}
	if len(out) == 0 {
		return nil, errors.New("no host given")
	}
	return out, nil
}

// validateServerHost checks one server host: a name or an address an agent can dial (not 0.0.0.0, ::, a
// multicast or the broadcast address, where a dial reaches no server or the agent's own host). A fully
// qualified name may end in a dot, as in konnectivity-server.kube-system.svc.cluster.local., which skips the
// resolver's search domains.
func validateServerHost(host string) error {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if err := address.Validate(host); err != nil {
		return err
	}
	return address.CheckDialable(host)
}

// flowOffer is the window the agent grants each connection for data from a server.
func (c *Config) flowOffer() flow.Offer {
	return flow.Offer{Window: c.FlowWindow, Max: c.FlowMaxWindow}
}
