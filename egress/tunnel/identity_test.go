package tunnel

import (
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

func testNode(name string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
}

// n1 is the node of the agent under test; 198.19.0.12 is another node's address.
var n1Addrs = []corev1.NodeAddress{
	{Type: corev1.NodeInternalIP, Address: "198.19.0.11"},
	{Type: corev1.NodeInternalIP, Address: "fd00:198:19::11"},
	{Type: corev1.NodeExternalIP, Address: "198.18.7.11"},
	{Type: corev1.NodeHostName, Address: "n1"},
}

func TestNodeIdentifiers(t *testing.T) {
	addrs := nodeStatusAddresses(testNode("n1", n1Addrs...))
	for _, tc := range []struct {
		name, claimed, kept string
		dropped             []droppedIdentifier
	}{
		{name: "own InternalIP", claimed: "host=198.19.0.11", kept: "host=198.19.0.11"},
		{name: "own ExternalIP and host name", claimed: "host=198.18.7.11&host=N1", kept: "host=198.18.7.11&host=N1"},
		{name: "another node's IP", claimed: "host=198.19.0.12",
			dropped: []droppedIdentifier{{"host", "198.19.0.12", dropNotNodeAddress}}},
		{name: "own and another's", claimed: "host=198.19.0.12&host=198.19.0.11", kept: "host=198.19.0.11",
			dropped: []droppedIdentifier{{"host", "198.19.0.12", dropNotNodeAddress}}},
		{name: "ipv4", claimed: "ipv4=198.19.0.11&ipv4=10.0.0.1", kept: "ipv4=198.19.0.11",
			dropped: []droppedIdentifier{{"ipv4", "10.0.0.1", dropNotNodeAddress}}},
		{name: "ipv6 in another spelling", claimed: "ipv6=fd00:198:19:0:0:0:0:11", kept: "ipv6=fd00%3A198%3A19%3A0%3A0%3A0%3A0%3A11"},
		{name: "another ipv6", claimed: "ipv6=fd00::12",
			dropped: []droppedIdentifier{{"ipv6", "fd00::12", dropNotNodeAddress}}},
		{name: "cidr", claimed: "cidr=198.19.0.0/24&host=198.19.0.11", kept: "host=198.19.0.11",
			dropped: []droppedIdentifier{{"cidr", "198.19.0.0/24", dropCIDR}}},
		{name: "cidr of the node alone", claimed: "cidr=198.19.0.11/32",
			dropped: []droppedIdentifier{{"cidr", "198.19.0.11/32", dropCIDR}}},
		{name: "default-route", claimed: "default-route=true",
			dropped: []droppedIdentifier{{"default-route", "true", dropDefaultRoute}}},
		{name: "other type", claimed: "uid=abc&host=n1", kept: "host=n1",
			dropped: []droppedIdentifier{{"uid", "abc", dropOther}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept, dropped, ok := nodeIdentifiers(tc.claimed, addrs)
			if !ok || kept != tc.kept || !reflect.DeepEqual(dropped, tc.dropped) {
				t.Errorf("nodeIdentifiers(%q) = %q, %v, %v; want %q, %v", tc.claimed, kept, dropped, ok, tc.kept, tc.dropped)
			}
		})
	}
	if _, _, ok := nodeIdentifiers("host=%zz", addrs); ok {
		t.Error("identifiers that do not parse were rewritten; upstream must see them to refuse the agent")
	}
}

// identStream is the agent's stream as the authentication interceptor hands it on.
type identStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s identStream) Context() context.Context { return s.ctx }

func TestVerifyIdentifiers(t *testing.T) {
	cs := fake.NewClientset(testNode("n1", n1Addrs...))
	var gets atomic.Int64
	cs.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		if a.(k8stesting.GetAction).GetName() == "forbidden" {
			return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "forbidden", errors.New("no RBAC"))
		}
		return false, nil, nil
	})
	m, err := newAuthMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{authMetrics: m, nodes: newNodeAddresses(cs)}
	stream := func(idents ...string) (context.Context, grpc.ServerStream) {
		md := metadata.Pairs(header.AgentID, "a")
		for _, v := range idents {
			md.Append(header.AgentIdentifiers, v)
		}
		ctx := metadata.NewIncomingContext(context.Background(), md)
		return ctx, identStream{ctx: ctx}
	}
	identsOf := func(ss grpc.ServerStream) []string {
		md, _ := metadata.FromIncomingContext(ss.Context())
		return md.Get(header.AgentIdentifiers)
	}
	for _, tc := range []struct {
		name, node string
		claimed    []string
		want       []string
		reason     string // the metric counted
	}{
		{name: "own address", node: "n1", claimed: []string{"host=198.19.0.11"}, want: []string{"host=198.19.0.11"}},
		{name: "another node's address", node: "n1", claimed: []string{"host=198.19.0.12"}, want: nil, reason: dropNotNodeAddress},
		{name: "own and cidr", node: "n1", claimed: []string{"host=198.19.0.11&cidr=0.0.0.0/0"}, want: []string{"host=198.19.0.11"}, reason: dropCIDR},
		{name: "default-route", node: "n1", claimed: []string{"default-route=true"}, want: nil, reason: dropDefaultRoute},
		{name: "no node name", node: "", claimed: []string{"host=198.19.0.12"}, want: []string{"host=198.19.0.12"}, reason: identsUnverified},
		{name: "node not found", node: "n9", claimed: []string{"host=198.19.0.12"}, want: []string{"host=198.19.0.12"}, reason: identsUnverified},
		{name: "node forbidden", node: "forbidden", claimed: []string{"host=198.19.0.12"}, want: []string{"host=198.19.0.12"}, reason: identsUnverified},
		{name: "none claimed", node: "n1", want: nil},
		{name: "two headers, which upstream refuses", node: "n1", claimed: []string{"host=198.19.0.12", "host=198.19.0.11"},
			want: []string{"host=198.19.0.12", "host=198.19.0.11"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := map[string]float64{}
			for _, r := range []string{dropNotNodeAddress, dropCIDR, dropDefaultRoute, dropOther, identsUnverified} {
				before[r] = counterValue(m.identsDropped.WithLabelValues(r))
			}
			ctx, ss := stream(tc.claimed...)
			got := identsOf(s.verifyIdentifiers(ctx, ss, tc.node))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("identifiers %q, want %q", got, tc.want)
			}
			for r, v := range before {
				want := v
				if r == tc.reason {
					want++
				}
				if got := counterValue(m.identsDropped.WithLabelValues(r)); got != want {
					t.Errorf("%s counted %v, want %v", r, got, want)
				}
			}
			// The agent's own view is untouched: the server rewrites its copy.
			if md, _ := metadata.FromIncomingContext(ctx); !reflect.DeepEqual(md.Get(header.AgentIdentifiers), tc.claimed) {
				t.Errorf("the original metadata changed: %q", md.Get(header.AgentIdentifiers))
			}
		})
	}
	// n1 was read once for its four streams: the addresses are remembered.
	if n := gets.Load(); n != 3 {
		t.Errorf("%d Node reads, want 3 (n1 once, n9, forbidden)", n)
	}
}

// TestTokenNodeName: the node named in a TokenReview comes back from authenticate, from the review and from
// the cache alike.
func TestTokenNodeName(t *testing.T) {
	r := newReviewer()
	r.add("bound", testAgentSA)
	r.nodes["bound"] = "n1"
	r.add("unbound", testAgentSA)
	a := newTestAuthenticator(t, r, nil)
	for range 2 {
		for token, want := range map[string]string{"bound": "n1", "unbound": ""} {
			node, err := a.authenticate(context.Background(), bearer(token), srcA)
			if err != nil || node != want {
				t.Errorf("%s: node %q, err %v; want %q", token, node, err, want)
			}
		}
	}
	if n := r.reviews.Load(); n != 2 {
		t.Errorf("%d TokenReviews, want 2", n)
	}
}
