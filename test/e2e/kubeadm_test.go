//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"k8s.io/client-go/tools/clientcmd"
)

// TestKubeadm installs konnect on a kubeadm cluster as the README tells a kubeadm user, with the README's own
// commands: kubeadm init on cp1, konnect init --kubeadm, the agents, kubeadm join --control-plane on cp2 and
// cp3, two workers, then an APIService and a validating webhook on the workers served through the tunnel,
// across kubeadm upgrade, a control-plane node stopped and brought back, a rolling restart of the servers, and
// konnect's removal.
func TestKubeadm(t *testing.T) {
	dumpLogsOnFailure(t)
	start := time.Now()
	kc := sharedKubeadmCluster(t)
	defer func() { t.Logf("kubeadm scenarios took %v (cluster included)", time.Since(start).Round(time.Second)) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("konnect's pods (last 30 lines each):%s", kc.konnectPodLogs())
		}
	})
	for _, s := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"init", kc.initFirst},
		{"join-control-planes", kc.joinControlPlanes},
		{"join-workers", kc.joinWorkers},
		{"extensions-through-the-tunnel", kc.deployExtensions},
		{"kubelets-only-through-the-tunnel", kc.checkUnreachable},
		{"certificates-agree", kc.checkCertificates},
		{"agents-hold-every-server", func(t *testing.T) { kc.waitAgentsHoldServers(t, 3) }},
		{"upgrade", kc.upgrade},
		{"control-plane-node-down", kc.nodeDown},
		{"rolling-server-restart", kc.rollServers},
		{"remove", kc.remove},
	} {
		if !t.Run(s.name, s.fn) {
			t.FailNow()
		}
	}
}

// konnectPodLogs returns the tail of every konnect server's and agent's container log on every node.
func (kc *kadmCluster) konnectPodLogs() string {
	var b strings.Builder
	for _, n := range kc.nodes {
		logs, _ := filepath.Glob(filepath.Join(n.dir, "var-log-pods", "kube-system_konnectivity-*", "*", "*.log"))
		for _, l := range logs {
			data, _ := os.ReadFile(l)
			fmt.Fprintf(&b, "\n===== %s: %s =====\n%s\n", n.name, strings.TrimPrefix(l, n.dir), harness.Tail(lastLines(string(data), 30), 6000))
		}
	}
	return b.String()
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// kubeadmSuccess are the lines kubeadm prints when init or a join succeeded.
var kubeadmSuccess = []string{
	"Your Kubernetes control-plane has initialized successfully!",
	"This node has joined the cluster and a new control plane instance was created:",
	"This node has joined the cluster:",
}

// logSuccess logs kubeadm's own success line from out, and fails without one.
func logSuccess(t *testing.T, node, out string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		for _, s := range kubeadmSuccess {
			if strings.TrimSpace(l) == s {
				t.Logf("%s: kubeadm: %s", node, s)
				return
			}
		}
	}
	t.Fatalf("%s: kubeadm printed none of its success lines:\n%s", node, tailString(out, 3000))
}

func (kc *kadmCluster) runT(t *testing.T, n *kadmNode, block string, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	began := time.Now()
	out, err := kc.run(ctx, n, block)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: README block %s in %v", n.name, block, time.Since(began).Round(100*time.Millisecond))
	return out
}

func (kc *kadmCluster) initFirst(t *testing.T) {
	cp1 := kc.nodes[0]
	if err := kc.writeInitConfig(cp1); err != nil {
		t.Fatal(err)
	}
	out := kc.runT(t, cp1, "first-control-plane", 6*time.Minute)
	logSuccess(t, cp1.name, out)
	// The shared helpers: kubectl as kubeadm's admin, konnect's files where konnect init wrote them on cp1.
	etc := filepath.Join(cp1.dir, "etc-kubernetes")
	kc.kubeconfig = filepath.Join(etc, "admin.conf")
	kc.konnectDir = etc
	kc.pki = filepath.Join(etc, "pki")
	// As the README says: konnect once the control-plane pods are Ready. kubelet, which kubeadm restarted at
	// its end, has then taken the static pods over; a manifest changed while it starts waits for its volume
	// reconstruction (two minutes) before kubelet replaces the pod.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	harness.Eventually(t, 3*time.Minute, "cp1's control-plane pods Ready", func() error {
		out, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err != nil {
			return err
		}
		if strings.Count(out, "-cp1=True") != 4 {
			return fmt.Errorf("pods: %s", out)
		}
		return nil
	})
	kc.runT(t, cp1, "konnect-first", 2*time.Minute)
	kc.waitAPIServerEgress(t, cp1)
	kc.runT(t, cp1, "agents", time.Minute)
}

// waitAPIServerEgress waits until n's kube-apiserver runs with the egress selector: its mirror pod's command
// has the flag and it is Ready.
func (kc *kadmCluster) waitAPIServerEgress(t *testing.T, n *kadmNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	harness.Eventually(t, 4*time.Minute, "kube-apiserver-"+n.name+" Ready with --egress-selector-config-file", func() error {
		out, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", "kube-apiserver-"+n.name, "-o",
			`jsonpath={.spec.containers[0].command} {.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "--egress-selector-config-file=") || !strings.HasSuffix(strings.TrimSpace(out), "True") {
			return fmt.Errorf("mirror pod: %s", tailString(out, 300))
		}
		return nil
	})
}

func (kc *kadmCluster) joinControlPlanes(t *testing.T) {
	for _, n := range kc.cps()[1:] {
		if err := kc.writeJoinConfig(n); err != nil {
			t.Fatal(err)
		}
		out := kc.runT(t, n, "more-control-planes", 6*time.Minute)
		logSuccess(t, n.name, out)
		kc.waitAPIServerEgress(t, n)
	}
}

func (kc *kadmCluster) joinWorkers(t *testing.T) {
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	workers := []*kadmNode{kc.node("w1"), kc.node("w2")}
	for i, n := range workers {
		if err := kc.writeJoinConfig(n); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			outs[i], errs[i] = kc.run(ctx, n, "workers")
		}()
	}
	wg.Wait()
	for i, n := range workers {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		logSuccess(t, n.name, outs[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	harness.Eventually(t, 3*time.Minute, "5 nodes Ready", func() error {
		out, err := kc.kubectl(ctx, nsCP, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err != nil {
			return err
		}
		if strings.Count(out, "=True") != 5 {
			return fmt.Errorf("nodes: %s", out)
		}
		return nil
	})
	if out, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "rollout", "status", "ds/konnectivity-agent", "--timeout=3m"); err != nil {
		t.Fatalf("agent DaemonSet rollout: %v\n%s\nthe agents' readiness:\n%s", err, out, kc.agentsReadiness(ctx))
	}
}

// agentsReadiness is each agent's /readyz?verbose, from its node's network namespace.
func (kc *kadmCluster) agentsReadiness(ctx context.Context) string {
	var b strings.Builder
	nc := &nodeCluster{cluster: kc.cluster}
	for _, n := range kc.nodes {
		pod, err := nc.agentPod(ctx, n.name)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", n.name, err)
			continue
		}
		ip, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", pod, "-o", "jsonpath={.status.podIP}")
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", n.name, err)
			continue
		}
		var body string
		err = httpGetOK(ctx, nsHTTPClient(n.ns, nil, 5*time.Second), "http://"+net.JoinHostPort(strings.TrimSpace(ip), "8093")+"/readyz?verbose", &body)
		fmt.Fprintf(&b, "%s (%s): %v\n%s\n", n.name, pod, err, body)
	}
	return b.String()
}

// deployExtensions runs sample-apiserver on w1 and pizza-webhook on w2 (host network: the server's destHost
// strategy sends a dial for a node's address to that node's agent), with konnect certs' Secrets, APIService
// and webhook configurations, and checks both through the tunnel.
func (kc *kadmCluster) deployExtensions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	etcdPKI := filepath.Join(kc.pki, "etcd")
	files := map[string]string{}
	for k, f := range map[string]string{"ca.crt": filepath.Join(etcdPKI, "ca.crt"), "tls.crt": filepath.Join(kc.pki, "apiserver-etcd-client.crt"), "tls.key": filepath.Join(kc.pki, "apiserver-etcd-client.key")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files[k] = string(b)
	}
	var etcdServers []string
	for _, n := range kc.cps() {
		etcdServers = append(etcdServers, "https://"+n.addr+":2379")
	}
	manifest := wardleAccess + fmt.Sprintf(`---
# sample-apiserver stores its objects in the cluster's etcd, as kube-apiserver's client.
apiVersion: v1
kind: Secret
metadata:
  name: etcd-client
  namespace: wardle
stringData:
  ca.crt: %[1]q
  tls.crt: %[2]q
  tls.key: %[3]q
`, files["ca.crt"], files["tls.crt"], files["tls.key"])
	if err := kc.applyYAML(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if _, _, err := kc.konnectCertsAPIService(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kc.applyYAML(ctx, sampleAPIServerManifest(strings.Join(etcdServers, ","), true, kadmLB, 6443)+"---\n"+pizzaWebhookManifest("w2")); err != nil {
		t.Fatal(err)
	}
	kc.installPizzaWebhook(t, ctx)
	for _, d := range []string{"wardle/api", "pizza/pizza-webhook"} {
		ns, name, _ := strings.Cut(d, "/")
		if out, err := kc.kubectl(ctx, nsCP, "-n", ns, "rollout", "status", "deployment/"+name, "--timeout=3m"); err != nil {
			t.Fatalf("%s: %v\n%s", d, err, out)
		}
	}
	if err := kc.waitAPIService(ctx, "True", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	kc.checkExtensions(t, ctx)
}

// checkExtensions: flunders from the APIService on w1, and the webhook on w2's own refusal, both only through
// the tunnel.
func (kc *kadmCluster) checkExtensions(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := harness.Poll("flunders", time.Minute, time.Second, func() error { return kc.flundersWork(ctx) }); err != nil {
		t.Fatal(err)
	}
	kc.checkValidation(t, ctx)
	t.Logf("APIService %s on w1 and the validating webhook on w2 answer through the tunnel", apiServiceName)
}

func (kc *kadmCluster) checkUnreachable(t *testing.T) {
	for _, cp := range kc.cps() {
		for _, w := range []string{"w1", "w2"} {
			n := kc.node(w)
			for _, addr := range []string{net.JoinHostPort(n.nodeIP, "10250"), net.JoinHostPort(strings.TrimSuffix(n.podCIDR, "0/24")+"2", "8080")} {
				if err := expectUnreachable(cp.ns, addr); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	t.Logf("direct dials from cp1, cp2 and cp3 to the workers' kubelets and pod subnets: network is unreachable")
}

// checkCertificates: one cluster CA and one front-proxy CA on every control-plane node (kubeadm's, never
// replaced), and every node's server certificate signed by that CA, naming the load balancer.
func (kc *kadmCluster) checkCertificates(t *testing.T) {
	read := func(n *kadmNode, f string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(n.dir, "etc-kubernetes", "pki", f))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cps := kc.cps()
	for _, f := range []string{"ca.crt", "ca.key", "front-proxy-ca.crt", "front-proxy-ca.key"} {
		for _, n := range cps[1:] {
			if !bytes.Equal(read(n, f), read(cps[0], f)) {
				t.Fatalf("pki/%s differs between %s and %s", f, cps[0].name, n.name)
			}
		}
	}
	for _, n := range cps {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := harness.Run(ctx, "", "openssl", "verify", "-CAfile", filepath.Join(n.dir, "etc-kubernetes", "pki", "ca.crt"),
			filepath.Join(n.dir, "etc-kubernetes", "pki", "konnectivity-server.crt"))
		cancel()
		if err != nil {
			t.Fatalf("%s: konnectivity-server.crt against kubeadm's ca.crt: %v %s", n.name, err, out)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		out, err = harness.Run(ctx, "", "openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", filepath.Join(n.dir, "etc-kubernetes", "pki", "konnectivity-server.crt"))
		cancel()
		if err != nil || !strings.Contains(out, "IP Address:"+kadmLB) {
			t.Fatalf("%s: konnectivity-server.crt does not name the load balancer %s: %v %s", n.name, kadmLB, err, out)
		}
	}
	t.Logf("ca and front-proxy-ca are byte for byte kubeadm's on %d nodes; each server certificate verifies against ca and names %s", len(cps), kadmLB)
}

// waitAgentsHoldServers waits until every agent counts n servers (from the Leases) and every running server has
// every agent.
func (kc *kadmCluster) waitAgentsHoldServers(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	harness.Eventually(t, 3*time.Minute, fmt.Sprintf("every agent to count %d servers and hold a connection to each", n), func() error {
		for _, node := range kc.nodes {
			got, err := kc.agentKnownServersOn(ctx, node)
			if err != nil {
				return err
			}
			if got != n {
				return fmt.Errorf("the agent on %s counts %d servers", node.name, got)
			}
		}
		for _, cp := range kc.cps() {
			if !kc.serverUp(cp) {
				continue
			}
			got, err := kc.serverAgents(ctx, cp)
			if err != nil {
				return err
			}
			if got != len(kc.nodes) {
				return fmt.Errorf("the server on %s holds %d agents, want %d", cp.name, got, len(kc.nodes))
			}
		}
		return nil
	})
	t.Logf("%d agents each count %d servers (Leases), and each server holds all of them", len(kc.nodes), n)
}

// agentKnownServersOn reads known_server_count from the agent pod on node n (TestNodes' helper, for this
// cluster's namespaces).
func (kc *kadmCluster) agentKnownServersOn(ctx context.Context, n *kadmNode) (int, error) {
	nc := &nodeCluster{cluster: kc.cluster}
	return nc.agentKnownServers(ctx, &node{nodeSpec: nodeSpec{name: n.name}, ns: n.ns})
}

// serverUp reports whether cp's link is up (the node is not the one a fault stopped).
func (kc *kadmCluster) serverUp(cp *kadmNode) bool {
	out, err := harness.Run(context.Background(), "", "ip", "-n", cp.ns, "-o", "link", "show", kadmNodeDev)
	return err == nil && strings.Contains(out, "state UP")
}

// serverAgents counts the agents connected to cp's Konnectivity server, from its admin port's metrics.
func (kc *kadmCluster) serverAgents(ctx context.Context, cp *kadmNode) (int, error) {
	var body string
	client := nsHTTPClient(cp.ns, nil, 5*time.Second)
	if err := httpGetOK(ctx, client, "http://127.0.0.1:8133/metrics", &body); err != nil {
		return 0, err
	}
	return readyBackends(body)
}

// readyBackends reads the number of connected agents from a server's /metrics.
func readyBackends(metrics string) (int, error) {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, "konnectivity_network_proxy_server_ready_backend_connections "); ok {
			var f float64
			_, err := fmt.Sscan(strings.TrimSpace(v), &f)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("no konnectivity_network_proxy_server_ready_backend_connections in /metrics")
}

// apiserverManifest reads n's kube-apiserver.yaml.
func (kc *kadmCluster) apiserverManifest(t *testing.T, n *kadmNode) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.dir, "etc-kubernetes", "manifests", "kube-apiserver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// upgrade runs kubeadm upgrade apply on cp1 and kubeadm upgrade node on cp2 and cp3, which write
// kube-apiserver.yaml anew from the ClusterConfiguration; the egress selector must still be there, and the
// extensions must still work, with no konnect command run again.
func (kc *kadmCluster) upgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for i, n := range kc.cps() {
		// cp1's manifest is konnect's patch of kubeadm's, with konnect's annotation; cp2's and cp3's kubeadm join
		// wrote from the ClusterConfiguration konnect had recorded, and konnect init left them alone.
		before := kc.apiserverManifest(t, n)
		if annotated := strings.Contains(before, "konnect.dev/egress-selector-configuration-sha256"); annotated != (i == 0) {
			t.Fatalf("%s: kube-apiserver.yaml before the upgrade: konnect's annotation there: %v, want %v:\n%s", n.name, annotated, i == 0, before)
		}
		if err := kc.writeUpgradeConfig(n); err != nil {
			t.Fatal(err)
		}
		block := "upgrade-others"
		if i == 0 {
			block = "upgrade-first"
		}
		out := kc.runT(t, n, block, 10*time.Minute)
		after := kc.apiserverManifest(t, n)
		// kubeadm wrote the manifest anew: konnect's annotation, which no ClusterConfiguration carries, is gone,
		// and the flags and volumes konnect recorded are there.
		if strings.Contains(after, "konnect.dev/egress-selector-configuration-sha256") {
			t.Fatalf("%s: kubeadm did not write kube-apiserver.yaml anew (konnect's annotation is still there):\n%s", n.name, tailString(out, 3000))
		}
		// kubeadm rendered kube-apiserver.yaml from the ClusterConfiguration and either replaced the manifest
		// (cp1: konnect's patch differed from it) or found it equal (cp2, cp3: kubeadm join wrote it so).
		replaced := strings.Contains(out, "[upgrade/staticpods] Moving new manifest to \"/etc/kubernetes/manifests/kube-apiserver.yaml\"")
		equal := strings.Contains(out, "Current and new manifests of kube-apiserver are equal")
		if replaced != (i == 0) || equal == (i == 0) {
			t.Fatalf("%s: kubeadm %s: replaced kube-apiserver.yaml %v, found it equal to its own %v:\n%s", n.name, block, replaced, equal, tailString(out, 3000))
		}
		for _, want := range []string{"--egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml", "--requestheader-uid-headers=X-Remote-Uid", "--enable-aggregator-routing=true", "/etc/kubernetes/konnectivity-server"} {
			if !strings.Contains(after, want) {
				t.Fatalf("%s: after kubeadm %s, kube-apiserver.yaml lacks %s:\n%s", n.name, block, want, after)
			}
		}
		if replaced {
			t.Logf("%s: kubeadm %s wrote kube-apiserver.yaml anew; the egress selector, its volumes and konnect's flags are in it", n.name, block)
		} else {
			t.Logf("%s: kubeadm %s rendered kube-apiserver.yaml from the ClusterConfiguration equal to the running one, konnect's flags and volumes included", n.name, block)
		}
		kc.waitAPIServerEgress(t, n)
	}
	if err := kc.waitAPIService(ctx, "True", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	kc.checkExtensions(t, ctx)
}

// kadmLoop is a bounded request loop against the APIService (GET of flunders) and the validating webhook (a
// server-side dry-run create of a Pizza, which the webhook admits), through the load balancer from cp1.
type kadmLoop struct {
	stop, done      chan struct{}
	total, failed   int
	firstErr        error
	lastErrAt       time.Time
	apiErr, hookErr int
	// apiShared counts the APIService requests answered 503 "service unavailable": kube-aggregator's answer,
	// on any kube-apiserver, while the APIService's shared Available condition is False. Another node's
	// kube-apiserver writes that condition when its own dials fail (its server down), and every node then
	// refuses until a check passes again; no dial was tried.
	apiShared int
}

func (kc *kadmCluster) startLoop(t *testing.T) *kadmLoop {
	t.Helper()
	client, err := kc.apiHTTPClientLB()
	if err != nil {
		t.Fatal(err)
	}
	pizza := []byte(`{"apiVersion":"restaurant.example.com/v1alpha1","kind":"Pizza","metadata":{"name":"loop","namespace":"pizza"},"spec":{"toppings":["cheese"]}}`)
	l := &kadmLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		deadline := time.Now().Add(8 * time.Minute)
		for i := 0; l.total < 4000 && time.Now().Before(deadline); i++ {
			select {
			case <-l.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var err error
			if i%2 == 0 {
				err = httpGetOK(ctx, client, fmt.Sprintf("https://%s:6443%s", kadmLB, flundersPath), nil)
			} else {
				err = httpPostOK(ctx, client, fmt.Sprintf("https://%s:6443%s?dryRun=All", kadmLB, pizzasV1alpha1), pizza)
			}
			cancel()
			l.total++
			if err != nil {
				l.failed++
				if i%2 == 0 {
					l.apiErr++
					if strings.Contains(err.Error(), ": 503 Service Unavailable: service unavailable") {
						l.apiShared++
					}
				} else {
					l.hookErr++
				}
				l.lastErrAt = time.Now()
				if l.firstErr == nil {
					l.firstErr = err
				}
			}
		}
	}()
	return l
}

func (l *kadmLoop) finish() *kadmLoop {
	close(l.stop)
	<-l.done
	return l
}

func (l *kadmLoop) String() string {
	s := fmt.Sprintf("%d of %d requests failed (APIService %d, of which %d refused by the shared Available condition; webhook %d)",
		l.failed, l.total, l.apiErr, l.apiShared, l.hookErr)
	if l.firstErr != nil {
		s += fmt.Sprintf(" (first: %s)", tailString(l.firstErr.Error(), 300))
	}
	return s
}

// apiHTTPClientLB is an HTTP client with kubeadm's admin credentials, dialling from cp1.
func (kc *kadmCluster) apiHTTPClientLB() (*http.Client, error) {
	cfg, err := clientcmd.LoadFromFile(kc.kubeconfig)
	if err != nil {
		return nil, err
	}
	ctxName := cfg.CurrentContext
	auth := cfg.AuthInfos[cfg.Contexts[ctxName].AuthInfo]
	cl := cfg.Clusters[cfg.Contexts[ctxName].Cluster]
	cert, err := tls.X509KeyPair(auth.ClientCertificateData, auth.ClientKeyData)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cl.CertificateAuthorityData)
	return nsHTTPClient(kc.tp.ns(nsCP), &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, 10*time.Second), nil
}

func httpPostOK(ctx context.Context, client *http.Client, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", u, resp.Status, tailString(string(b), 2000))
	}
	return nil
}

// nodeDown stops cp3 entirely (kubelet, its pods and containerd, and its link), brings it back, and checks that
// the agents hold it again; a request loop runs throughout and its failures are reported.
func (kc *kadmCluster) nodeDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cp3 := kc.node("cp3")
	l := kc.startLoop(t)
	time.Sleep(3 * time.Second)
	down := time.Now()
	kc.stopNode(cp3)
	if err := harness.IP("-n", cp3.ns, "link", "set", kadmNodeDev, "down"); err != nil {
		l.finish()
		t.Fatal(err)
	}
	t.Logf("cp3 stopped (kubelet, containers, containerd) and cut off in %v", time.Since(down).Round(100*time.Millisecond))
	// The other two serve alone for a while: the agents must keep working with two servers.
	time.Sleep(30 * time.Second)
	if err := harness.IP("-n", cp3.ns, "link", "set", kadmNodeDev, "up"); err != nil {
		l.finish()
		t.Fatal(err)
	}
	if err := kc.startNode(ctx, cp3); err != nil {
		l.finish()
		t.Fatal(err)
	}
	back := time.Now()
	kc.waitAPIServerEgress(t, cp3)
	kc.waitAgentsHoldServers(t, 3)
	t.Logf("cp3 back: kube-apiserver Ready and every agent holds its server again %v after it started", time.Since(back).Round(100*time.Millisecond))
	time.Sleep(5 * time.Second)
	l.finish()
	t.Logf("cp3 down for %v and brought back: %s", back.Sub(down).Round(time.Second), l)
	if l.total == 0 {
		t.Fatal("the request loop sent nothing")
	}
	kc.checkExtensions(t, ctx)
}

// rollServers restarts the Konnectivity server's static pod on one control-plane node at a time, waiting for
// every agent to hold the new server before the next; a request loop runs throughout and must lose nothing.
// Each node's kube-apiserver is out of the load balancer's rotation while its server restarts, as for any
// maintenance of a control-plane node: kube-apiserver dials its own node's server, and its /readyz, which the
// load balancer checks, does not look at the egress.
func (kc *kadmCluster) rollServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l := kc.startLoop(t)
	for _, n := range kc.cps() {
		path := filepath.Join(n.dir, "etc-kubernetes", "manifests", "konnectivity-server.yaml")
		parked := filepath.Join(n.dir, "konnectivity-server.yaml.parked")
		began := time.Now()
		// The mirror pod exists first, so that its going away below says the pod stopped: kube-apiserver's
		// admission (priority class and value, Pod Security) accepted the static pod that konnect init wrote.
		if err := harness.Poll("the server's mirror pod on "+n.name, 2*time.Minute, time.Second, func() error {
			out, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", "konnectivity-server-"+n.name,
				"-o", "jsonpath={.spec.priorityClassName}={.spec.priority}")
			if err != nil {
				return err
			}
			if want := "system-node-critical=2000001000"; strings.TrimSpace(out) != want {
				return fmt.Errorf("priority %q, want %q", out, want)
			}
			return nil
		}); err != nil {
			l.finish()
			t.Fatal(err)
		}
		if err := kc.lbSet(n.name, "drain"); err != nil {
			l.finish()
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // requests already at that kube-apiserver finish
		if err := os.Rename(path, parked); err != nil {
			l.finish()
			t.Fatal(err)
		}
		if err := harness.Poll("the server pod on "+n.name+" to stop", 2*time.Minute, time.Second, func() error {
			if _, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", "konnectivity-server-"+n.name); err == nil {
				return errNotYet
			}
			return nil
		}); err != nil {
			l.finish()
			t.Fatal(err)
		}
		// Why the drain: kube-apiserver reports Ready with its node's server gone, and fails what goes through it.
		if err := kc.checkReadyWithoutServer(t, ctx, n); err != nil {
			l.finish()
			t.Fatal(err)
		}
		if err := os.Rename(parked, path); err != nil {
			l.finish()
			t.Fatal(err)
		}
		kc.waitAgentsHoldServers(t, 3)
		if err := kc.lbSet(n.name, "ready"); err != nil {
			l.finish()
			t.Fatal(err)
		}
		t.Logf("%s: out of rotation, server static pod stopped, started and held by every agent again, back in rotation in %v", n.name, time.Since(began).Round(100*time.Millisecond))
	}
	l.finish()
	t.Logf("rolling restart of the servers on cp1, cp2, cp3: %s", l)
	// A request refused by the APIService's shared Available condition never reached a tunnel: the drained
	// node's own availability check, failing while its server is down, set it for the whole cluster. Every
	// other failure is one the tunnel lost.
	if lost := l.failed - l.apiShared; lost != 0 {
		t.Errorf("rolling restart of the servers: %s: %d lost, want none", l, lost)
	}
}

// checkReadyWithoutServer asks n's kube-apiserver directly, while n's server is stopped: /readyz must answer 200,
// and a request for the APIService must fail.
func (kc *kadmCluster) checkReadyWithoutServer(t *testing.T, ctx context.Context, n *kadmNode) error {
	client, err := kc.apiHTTPClientLB()
	if err != nil {
		return err
	}
	base := "https://" + net.JoinHostPort(n.addr, "6443")
	if err := httpGetOK(ctx, client, base+"/readyz", nil); err != nil {
		return fmt.Errorf("%s's kube-apiserver with its server stopped: %w", n.name, err)
	}
	err = httpGetOK(ctx, client, base+flundersPath, nil)
	if err == nil {
		return fmt.Errorf("%s's kube-apiserver served flunders with its node's server stopped", n.name)
	}
	t.Logf("%s's kube-apiserver with its server stopped: /readyz 200, flunders: %s", n.name, tailString(err.Error(), 200))
	return nil
}

// remove runs the README's removal: the agents deleted, then konnect reset --kubeadm on one control-plane node
// after the other. Each kube-apiserver comes back without the egress selector, the ClusterConfiguration is what
// it was before konnect, and a kubeadm upgrade node writes no konnect flag back.
func (kc *kadmCluster) remove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	kc.runT(t, kc.nodes[0], "remove-agents", 2*time.Minute)
	for _, n := range kc.cps() {
		kc.runT(t, n, "remove", 2*time.Minute)
		m := kc.apiserverManifest(t, n)
		for _, gone := range []string{"egress-selector", "konnectivity-server", "--requestheader-uid-headers", "--enable-aggregator-routing", "konnect.dev/"} {
			if strings.Contains(m, gone) {
				t.Fatalf("%s: after konnect reset --kubeadm, kube-apiserver.yaml still has %s:\n%s", n.name, gone, m)
			}
		}
		if _, err := os.Stat(filepath.Join(n.dir, "etc-kubernetes", "manifests", "konnectivity-server.yaml")); err == nil {
			t.Fatalf("%s: the server's static pod is still there", n.name)
		}
		harness.Eventually(t, 4*time.Minute, "kube-apiserver-"+n.name+" Ready without the egress selector", func() error {
			out, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", "kube-apiserver-"+n.name, "-o",
				`jsonpath={.spec.containers[0].command} {.status.conditions[?(@.type=="Ready")].status}`)
			if err != nil {
				return err
			}
			if strings.Contains(out, "egress-selector") || !strings.HasSuffix(strings.TrimSpace(out), "True") {
				return fmt.Errorf("mirror pod: %s", tailString(out, 300))
			}
			return nil
		})
	}
	cc, err := kc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "cm", "kubeadm-config", "-o", "jsonpath={.data.ClusterConfiguration}")
	if err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"egress-selector", "konnectivity", "requestheader-uid-headers", "enable-aggregator-routing"} {
		if strings.Contains(cc, gone) {
			t.Fatalf("after konnect reset --kubeadm, the ClusterConfiguration still has %s:\n%s", gone, cc)
		}
	}
	// kubeadm writes no konnect flag back.
	kc.runT(t, kc.node("cp2"), "upgrade-others", 10*time.Minute)
	if m := kc.apiserverManifest(t, kc.node("cp2")); strings.Contains(m, "egress-selector") {
		t.Fatalf("cp2: kubeadm upgrade node after the removal wrote the egress selector back:\n%s", m)
	}
	t.Logf("konnect removed: kube-apiserver.yaml and the ClusterConfiguration without its flags and volumes on 3 nodes, kube-apiservers Ready, kubeadm upgrade node writes none back")
}
