package tunnel

import (
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/proxystrategies"
)

// Config is everything New needs, without flags: `konnect server` builds one from proxy-server's flags
// (cmd/internal/servercmd), tests build their own.
type Config struct {
	// ServerID identifies this server to agents; ServerCount tells agents how many servers to hold.
	ServerID    string
	ServerCount int

	// Mode is the frontend protocol: "grpc" (kube-apiserver's GRPC mode) or "http-connect".
	Mode string

	// UDSName, when set, is the Unix socket the frontend listens on. DeleteExistingUDS allows a stale
	// socket file (nobody answering) to be replaced; a live one is always refused. UDSSharedDir accepts a
	// socket directory that everyone may write to (see uds.Options.SharedDir).
	UDSName           string
	DeleteExistingUDS bool
	UDSSharedDir      bool
	// ServerAddr is the mTLS TCP frontend address (host:port), used when UDSName is empty, with
	// ServerCert/ServerKey and ServerCA verifying kube-apiserver's client certificate, whose common name
	// must be one of ServerAllowedNames when any are given.
	ServerAddr         string
	ServerCert         string
	ServerKey          string
	ServerCA           string
	ServerAllowedNames []string

	// AgentAddr is where agents connect (host:port), over TLS with ClusterCert/ClusterKey. With ClusterCA
	// set, agents must present a client certificate signed by it, with a common name from
	// ClusterAllowedNames when any are given.
	AgentAddr           string
	ClusterCert         string
	ClusterKey          string
	ClusterCA           string
	ClusterAllowedNames []string
	// AllowUnauthenticatedAgents lets New start with neither ClusterCA nor TokenAuth, so that any peer that
	// reaches AgentAddr can register as an agent and receive kube-apiserver's traffic. New refuses that
	// otherwise.
	AllowUnauthenticatedAgents bool

	// Bounds on peers that have not authenticated (admission.go); zero values mean the defaults, and a
	// negative count means no bound. HandshakeTimeout bounds the TLS handshake on both TCP listeners;
	// AgentAuthTimeout is how long a connection to AgentAddr may take to have a Connect stream accepted;
	// MaxUnauthenticated and MaxUnauthenticatedPerSource bound the agent connections not accepted yet, in
	// all and from one source address.
	HandshakeTimeout            time.Duration
	AgentAuthTimeout            time.Duration
	MaxUnauthenticated          int
	MaxUnauthenticatedPerSource int

	// CipherSuites and MinTLSVersion apply to both TLS listeners; zero values mean Go's defaults (TLS 1.2).
	CipherSuites  []uint16
	MinTLSVersion uint16

	KeepaliveTime         time.Duration
	FrontendKeepaliveTime time.Duration

	ProxyStrategies []proxystrategies.ProxyStrategy
	XfrChannelSize  int

	// BackendDialTimeout fails a dial that no agent answered in time, and MaxPendingDials refuses dials
	// beyond that many waiting at once (dials.go); 0 turns either off. `konnect server` defaults
	// them to DefaultBackendDialTimeout and DefaultMaxPendingDials; a zero Config has neither.
	BackendDialTimeout time.Duration
	MaxPendingDials    int

	// TokenAuth, when set, makes agents authenticate with a ServiceAccount token checked by TokenReview.
	TokenAuth *TokenAuth
	// Leases, when set, runs upstream's lease controller so that agents can count servers by lease.
	Leases *Leases

	// Registerer receives konnect's own tunnel metrics (konnect_tunnel_server_*); nil means none are
	// exported. Upstream's are read with UpstreamMetrics.
	Registerer prometheus.Registerer

	// GracefulTimeout bounds how long Run lets open tunnels finish once its context ends; 0 closes them at
	// once.
	GracefulTimeout time.Duration
	// ConnectionBuffer is how many bytes may wait for one slow frontend reader before the agent stream that
	// feeds it has to wait too (see package flow); 0 means flow.DefaultLimit.
	ConnectionBuffer int
	// StallTimeout is how long a full frontend queue may block the agent stream with no progress before that
	// one frontend connection is closed, so that the others on the agent keep flowing (ANP issue 180). It
	// stays below konnectivity-client's own 10 s read timeout, so the server, not the client, decides first.
	StallTimeout time.Duration
	// The server takes up an agent's offer of per-connection flow control (docs/flow-control.md) unless
	// DisableFlowControl is set, with FlowWindow as every connection's starting window for data from the agent
	// and FlowMaxWindow as the largest it grows to; 0 means flow.DefaultWindow and flow.DefaultMaxWindow.
	// Connections of agents without the extension (upstream's) get ConnectionBuffer and StallTimeout.
	DisableFlowControl bool
	FlowWindow         int
	FlowMaxWindow      int
	// MaxFrontendMessage is the largest gRPC message accepted from kube-apiserver. Its client sends each
	// write as one message, so this bounds the largest single write through the tunnel.
	MaxFrontendMessage int
}

// Defaults for the settings upstream's proxy-server does not have.
const (
	DefaultGracefulTimeout    = 15 * time.Second
	DefaultMaxFrontendMessage = 256 << 20
)

// TokenAuth configures agent authentication by ServiceAccount token, checked as upstream checks it.
type TokenAuth struct {
	Namespace      string
	ServiceAccount string
	Audience       string
	// Client sends the agents' TokenReviews. ProbeClient, when set, sends the readiness check's, so that
	// the two do not share a rate limiter and neither can starve the other.
	Client      kubernetes.Interface
	ProbeClient kubernetes.Interface
	// CacheTTL is how long a successful review is remembered (by the token's SHA-256); 0 means
	// DefaultTokenReviewCacheTTL and a negative value turns the cache off. MaxConcurrentReviews bounds
	// the agents' TokenReviews in flight; 0 means DefaultMaxConcurrentReviews.
	CacheTTL             time.Duration
	MaxConcurrentReviews int
}

// Leases configures upstream's lease controller.
type Leases struct {
	Namespace string
	Labels    map[string]string
	Client    kubernetes.Interface
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Mode == "" {
		out.Mode = "grpc"
	}
	if out.ServerCount < 1 {
		out.ServerCount = 1
	}
	if out.XfrChannelSize <= 0 {
		out.XfrChannelSize = 10
	}
	if len(out.ProxyStrategies) == 0 {
		out.ProxyStrategies = []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDefault}
	}
	if out.KeepaliveTime <= 0 {
		out.KeepaliveTime = time.Hour
	}
	if out.FrontendKeepaliveTime <= 0 {
		out.FrontendKeepaliveTime = time.Hour
	}
	if out.ConnectionBuffer <= 0 {
		out.ConnectionBuffer = flow.DefaultLimit
	}
	if out.StallTimeout <= 0 {
		out.StallTimeout = flow.DefaultStallTimeout
	}
	if out.FlowWindow <= 0 {
		out.FlowWindow = flow.DefaultWindow
	}
	if out.FlowMaxWindow <= 0 {
		out.FlowMaxWindow = max(flow.DefaultMaxWindow, out.FlowWindow)
	}
	if out.MaxFrontendMessage <= 0 {
		out.MaxFrontendMessage = DefaultMaxFrontendMessage
	}
	if out.HandshakeTimeout <= 0 {
		out.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if out.AgentAuthTimeout <= 0 {
		out.AgentAuthTimeout = DefaultAgentAuthTimeout
	}
	out.MaxUnauthenticated = boundOrDefault(out.MaxUnauthenticated, DefaultMaxUnauthenticated)
	out.MaxUnauthenticatedPerSource = boundOrDefault(out.MaxUnauthenticatedPerSource, DefaultMaxUnauthenticatedPerSource)
	return out
}

// flowOffer is the window the server grants each connection for data from its agent.
func (c *Config) flowOffer() flow.Offer {
	return flow.Offer{Window: c.FlowWindow, Max: c.FlowMaxWindow}
}

// flowControl is what the server's status says of its own flow control: the version it takes up, or none.
func (c *Config) flowControl() string {
	if c.DisableFlowControl {
		return flow.None
	}
	return flow.Version
}

// boundOrDefault maps a Config count to an admission bound: 0 is the default, negative is none (0).
func boundOrDefault(n, def int) int {
	switch {
	case n == 0:
		return def
	case n < 0:
		return 0
	}
	return n
}
