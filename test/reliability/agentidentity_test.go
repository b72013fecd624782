//go:build integration

package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	clientpb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// TestAgentIdentifiersVerified runs konnect server in token mode with --proxy-strategies=destHost,default,
// as konnect init renders it, against a real kube-apiserver that holds two Nodes (objects only, no
// kubelet): n1 (198.19.0.11) and n2 (198.19.0.12). Agent B, whose token is bound to a pod on n2, connects
// first and claims n1's address; agent A, bound to a pod on n1, claims it too. The server keeps A's claim,
// drops B's (status, metric), and a dial to n1's kubelet reaches A. Before, the server believed any agent's
// identifiers, so the holder of any node's agent token could take kube-apiserver's exec, attach, logs and
// port-forward to another node's kubelet by registering first. The 198.19 addresses are only data here:
// the agents are fake and refuse every dial, naming themselves, and nothing is dialled.
func TestAgentIdentifiersVerified(t *testing.T) {
	dir := copyBase(t)
	ports := harness.FreePorts(t, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	api, kubeconfig := startTokenAPIServer(t, ctx, dir, ports)
	cs, err := api.Client()
	if err != nil {
		t.Fatal(err)
	}
	tokenA := podBoundToken(t, ctx, cs, "n1", "198.19.0.11")
	tokenB := podBoundToken(t, ctx, cs, "n2", "198.19.0.12")

	sp := serverPorts{ports[3], ports[4], ports[5]}
	uds := filepath.Join(shortDir(t), "s.sock")
	server := startKonnect(t, "server", serverArgs(dir, uds, sp,
		"--kubeconfig", kubeconfig, "--agent-namespace", agentNamespace, "--agent-service-account", agentSA,
		"--authentication-audience", agentAudience, "--proxy-strategies", "destHost,default")...)
	waitReady(t, server, sp.health)

	b := connectFakeAgent(t, ctx, dir, sp.agent, "agent-b", tokenB, "host=198.19.0.11")
	waitConnected(t, sp.admin, "agent-b")
	a := connectFakeAgent(t, ctx, dir, sp.agent, "agent-a", tokenA, "host=198.19.0.11")
	waitConnected(t, sp.admin, "agent-a")

	idents := agentIdentifiers(t, sp.admin)
	if idents["agent-a"] != "host=198.19.0.11" || idents["agent-b"] != "" {
		t.Errorf("identifiers in the server's status: agent-a %q, agent-b %q; want host=198.19.0.11 and none", idents["agent-a"], idents["agent-b"])
	}
	if n := serverMetric(t, sp.health, "konnect_tunnel_server_agent_identifiers_dropped_total", `reason="not-node-address"`); n != 1 {
		t.Errorf("dropped not-node-address identifiers counted %v, want 1 (agent-b's)", n)
	}
	if n := serverMetric(t, sp.health, "konnect_tunnel_server_agent_identifiers_dropped_total", `reason="unverified"`); n != 0 {
		t.Errorf("unverified identifiers counted %v, want 0", n)
	}

	// kube-apiserver's dials to n1's kubelet go to A, however often.
	const dials = 5
	for range dials {
		err := dialOnce(ctx, uds, "198.19.0.11:10250")
		if err == nil {
			t.Fatal("a dial through fake agents that refuse every dial succeeded")
		}
		t.Logf("dial to 198.19.0.11:10250: %v", err)
	}
	if a.dials.Load() != dials || b.dials.Load() != 0 {
		t.Fatalf("dials to 198.19.0.11: %d to agent-a (node n1), %d to agent-b (node n2); want all %d to agent-a", a.dials.Load(), b.dials.Load(), dials)
	}
}

// podBoundToken creates Node name with address ip and a Pod of the agents' ServiceAccount bound to it,
// and returns a token for the server's audience bound to that Pod, as kubelet gets for a projected volume.
func podBoundToken(t *testing.T, ctx context.Context, cs kubernetes.Interface, name, ip string) string {
	t.Helper()
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods(agentNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-" + name},
		Spec: corev1.PodSpec{NodeName: name, ServiceAccountName: agentSA,
			Containers: []corev1.Container{{Name: "agent", Image: "konnect-agent:not-pulled"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secs := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(agentNamespace).CreateToken(ctx, agentSA, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{agentAudience}, ExpirationSeconds: &secs,
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// fakeAgent is a Connect stream that refuses every dial, counting them.
type fakeAgent struct {
	dials atomic.Int64
}

func connectFakeAgent(t *testing.T, ctx context.Context, dir string, port int, id, token, identifiers string) *fakeAgent {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///127.0.0.1:"+strconv.Itoa(port), grpc.WithTransportCredentials(credentials.NewTLS(agentPortTLS(t, dir))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	sctx := metadata.AppendToOutgoingContext(ctx, header.AgentID, id, header.AgentIdentifiers, identifiers,
		header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+token)
	st, err := agentpb.NewAgentServiceClient(cc).Connect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := st.Header(); err != nil || len(h.Get(header.ServerID)) != 1 {
		t.Fatalf("%s not accepted: %v %v", id, h, err)
	}
	fa := &fakeAgent{}
	go func() {
		for {
			p, err := st.Recv()
			if err != nil {
				return
			}
			if p.Type != clientpb.PacketType_DIAL_REQ {
				continue
			}
			fa.dials.Add(1)
			_ = st.Send(&clientpb.Packet{Type: clientpb.PacketType_DIAL_RSP, Payload: &clientpb.Packet_DialResponse{DialResponse: &clientpb.DialResponse{
				Random: p.GetDialRequest().Random, Error: id + " refuses every dial"}}})
		}
	}()
	return fa
}

func waitConnected(t *testing.T, adminPort int, id string) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, id+" connected", func() error {
		listed, err := listedAgents(adminPort)
		if err != nil {
			return err
		}
		if !listed[id] {
			return errors.New("not yet")
		}
		return nil
	})
}

// agentIdentifiers is the identifiers of each agent in the server's status, by ID.
func agentIdentifiers(t *testing.T, adminPort int) map[string]string {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/agents", adminPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Agents []struct {
			ID          string `json:"id"`
			Identifiers string `json:"identifiers"`
		} `json:"agents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range st.Agents {
		out[a.ID] = a.Identifiers
	}
	return out
}

// dialOnce opens one single-use tunnel through the server's UDS, as kube-apiserver's egress selector does,
// and dials addr through it.
func dialOnce(ctx context.Context, uds, addr string) error {
	tunnelCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	tun, err := kclient.CreateSingleUseGrpcTunnelWithContext(dctx, tunnelCtx, "unix:"+uds,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", uds)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
	if err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	c, err := tun.DialContext(dctx, "tcp", addr)
	if err != nil {
		return err
	}
	c.Close()
	return nil
}
