package tunnel

import (
	"context"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// An agent names the destinations it serves in its identifiers (header.AgentIdentifiers), and upstream's
// destHost strategy gives a host's dials to the first agent that named it. Believed as claimed, any agent's
// token would let its holder name another node's address first and receive kube-apiserver's exec, attach,
// logs and port-forward to that node's kubelet. In token mode the TokenReview names the node of the token's
// pod, so the server keeps only the identifiers that are that node's addresses (verifyIdentifiers).

const (
	// nodeCacheTTL is how long a node's addresses are remembered, so that a storm of reconnecting agents
	// costs kube-apiserver one Node read per node and TTL, not one per stream.
	nodeCacheTTL   = 30 * time.Second
	maxNodesCached = 1 << 14
	// nodeLookupTimeout bounds one Node read; an agent whose node cannot be read in time is taken as it
	// claims (unverified), never refused.
	nodeLookupTimeout = 5 * time.Second
)

// Reasons for konnect_tunnel_server_agent_identifiers_dropped_total.
const (
	dropNotNodeAddress = "not-node-address" // host, ipv4 or ipv6 that is none of the node's addresses
	dropCIDR           = "cidr"
	dropDefaultRoute   = "default-route"
	dropOther          = "other-type" // an identifier type upstream does not route by
	identsUnverified   = "unverified" // counted once per stream whose identifiers were taken as claimed
)

// nodeAddresses reads nodes' status addresses through the client that sends the TokenReviews, and
// remembers them for a short time.
type nodeAddresses struct {
	client kubernetes.Interface
	ttl    time.Duration
	now    func() time.Time

	mu    sync.Mutex
	nodes map[string]cachedNode
}

type cachedNode struct {
	addrs []string
	until time.Time
}

func newNodeAddresses(client kubernetes.Interface) *nodeAddresses {
	return &nodeAddresses{client: client, ttl: nodeCacheTTL, now: time.Now, nodes: map[string]cachedNode{}}
}

// get returns the addresses (of any type) in the node's status.
func (n *nodeAddresses) get(ctx context.Context, name string) ([]string, error) {
	now := n.now()
	n.mu.Lock()
	if c, ok := n.nodes[name]; ok && now.Before(c.until) {
		n.mu.Unlock()
		return c.addrs, nil
	}
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, nodeLookupTimeout)
	defer cancel()
	// ResourceVersion 0: kube-apiserver answers from its watch cache, not etcd.
	node, err := n.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, err
	}
	addrs := nodeStatusAddresses(node)
	now = n.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.nodes) >= maxNodesCached {
		for k, c := range n.nodes {
			if !now.Before(c.until) {
				delete(n.nodes, k)
			}
		}
	}
	if len(n.nodes) < maxNodesCached {
		n.nodes[name] = cachedNode{addrs: addrs, until: now.Add(n.ttl)}
	}
	return addrs, nil
}

func nodeStatusAddresses(node *corev1.Node) []string {
	out := make([]string, 0, len(node.Status.Addresses))
	for _, a := range node.Status.Addresses {
		if a.Address != "" {
			out = append(out, a.Address)
		}
	}
	return out
}

// droppedIdentifier is one identifier value the server did not keep, and why.
type droppedIdentifier struct {
	typ, value, reason string
}

func (d droppedIdentifier) String() string { return d.typ + "=" + d.value }

// nodeIdentifiers keeps of claimed (an agent's identifiers, URL-encoded as upstream's agent sends them) the
// host, ipv4 and ipv6 values that are among the node's addresses, and returns them encoded the same way.
// Everything else is dropped: another node's address, any cidr and default-route (which would draw dials
// to addresses that are not the node's), and types upstream does not route by. ok is false when claimed
// does not parse; upstream refuses such an agent, so the caller leaves it alone.
func nodeIdentifiers(claimed string, nodeAddrs []string) (kept string, dropped []droppedIdentifier, ok bool) {
	values, err := url.ParseQuery(claimed)
	if err != nil {
		return claimed, nil, false
	}
	out := url.Values{}
	for typ, vals := range values {
		for _, v := range vals {
			switch header.IdentifierType(typ) {
			case header.Host, header.IPv4, header.IPv6:
				if isNodeAddress(v, nodeAddrs) {
					out.Add(typ, v)
				} else {
					dropped = append(dropped, droppedIdentifier{typ, v, dropNotNodeAddress})
				}
			case header.CIDR:
				dropped = append(dropped, droppedIdentifier{typ, v, dropCIDR})
			case header.DefaultRoute:
				dropped = append(dropped, droppedIdentifier{typ, v, dropDefaultRoute})
			default:
				dropped = append(dropped, droppedIdentifier{typ, v, dropOther})
			}
		}
	}
	sort.Slice(dropped, func(i, j int) bool { return dropped[i].String() < dropped[j].String() })
	return out.Encode(), dropped, true
}

// isNodeAddress tells whether v is one of addrs: as an IP address when both parse as one (so that
// ::ffff:a.b.c.d and a.b.c.d or two spellings of an IPv6 address match), else as a host name.
func isNodeAddress(v string, addrs []string) bool {
	ip, ipErr := netip.ParseAddr(v)
	for _, a := range addrs {
		if ipErr == nil {
			if aip, err := netip.ParseAddr(a); err == nil && aip.Unmap() == ip.Unmap() {
				return true
			}
			continue
		}
		if strings.EqualFold(v, a) {
			return true
		}
	}
	return false
}

// verifyIdentifiers returns ss with the agent's identifiers cut to those of node, the node of the pod its
// token is bound to (see nodeIdentifiers), for upstream's handler to read from the stream's context. The
// agent is accepted in any case: one that loses its identifiers gets the dials of the other strategies, so
// a misconfiguration never leaves a node without an agent. When node is unknown or cannot be read, the
// identifiers are taken as claimed, and the log and metrics say so.
func (s *Server) verifyIdentifiers(ctx context.Context, ss grpc.ServerStream, node string) grpc.ServerStream {
	md, _ := metadata.FromIncomingContext(ctx)
	claimed := md.Get(header.AgentIdentifiers)
	if len(claimed) != 1 || claimed[0] == "" {
		return ss // none to check, or several, which upstream refuses
	}
	id := first(md.Get(header.AgentID))
	if node == "" {
		s.authMetrics.identsDropped.WithLabelValues(identsUnverified).Inc()
		klog.InfoS("Warning: the agent's identifiers are taken as claimed: its token's TokenReview names no node (a token not bound to a pod, or kube-apiserver older than 1.30)",
			"agentID", id, "identifiers", claimed[0])
		return ss
	}
	addrs, err := s.nodes.get(ctx, node)
	if err != nil {
		s.authMetrics.identsDropped.WithLabelValues(identsUnverified).Inc()
		klog.InfoS("Warning: the agent's identifiers are taken as claimed: its node could not be read (the server needs get on nodes)",
			"agentID", id, "node", node, "identifiers", claimed[0], "err", err)
		return ss
	}
	kept, dropped, ok := nodeIdentifiers(claimed[0], addrs)
	if !ok || len(dropped) == 0 {
		return ss
	}
	names := make([]string, len(dropped))
	for i, d := range dropped {
		names[i] = d.String()
		s.authMetrics.identsDropped.WithLabelValues(d.reason).Inc()
	}
	klog.InfoS("Warning: dropped agent identifiers that are not its node's addresses; dials follow the other strategies for them",
		"agentID", id, "node", node, "nodeAddresses", addrs, "dropped", names, "kept", kept)
	md = md.Copy()
	if kept == "" {
		md.Delete(header.AgentIdentifiers)
	} else {
		md.Set(header.AgentIdentifiers, kept)
	}
	return &contextStream{ServerStream: ss, ctx: metadata.NewIncomingContext(ctx, md)}
}

// contextStream is a stream whose Context is ctx.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *contextStream) Context() context.Context { return c.ctx }
