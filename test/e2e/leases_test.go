//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// leaseRBAC is the namespace and the Roles on Leases that konnect init --server-leases renders for the
// server and the agents, so that this test runs with exactly the privileges the manifests grant.
func leaseRBAC() (string, error) {
	files, err := manifests.Agent{Image: manifests.Image("e2e"), ProxyServerHost: cpAddr, ServerLeases: true,
		APIServerURL: fmt.Sprintf("https://%s:%d", cpAddr, apiPort)}.Render()
	if err != nil {
		return "", err
	}
	var docs []string
	for _, f := range files {
		if strings.HasSuffix(f.Name, "-leases-namespace.yaml") || strings.HasSuffix(f.Name, "-leases-role.yaml") || strings.HasSuffix(f.Name, "-leases-rolebinding.yaml") {
			docs = append(docs, string(f.Data))
		}
	}
	if len(docs) != 5 {
		return "", fmt.Errorf("konnect's manifests rendered %d lease namespaces, Roles and RoleBindings, want 5", len(docs))
	}
	return strings.Join(docs, "---\n"), nil
}

const leaseSelector = "k8s-app=konnectivity-server"

// TestServerLeases runs two konnect servers with upstream's lease controller against the real
// kube-apiserver, behind one load-balanced address, and a konnect agent that counts their leases
// (--count-server-leases) instead of trusting their --server-count of 1. The agent connects to both; a
// server stopped with SIGTERM deletes its lease and the agent's count follows at once; a server that comes
// back is counted and connected again; a killed server's lease is counted until it expires, then the
// other server's garbage collection deletes it.
func TestServerLeases(t *testing.T) {
	dumpLogsOnFailure(t)
	c := sharedCluster(t, modeGRPCUDS)
	c.expectAPIServiceDown(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rbac, err := leaseRBAC()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.applyYAML(ctx, rbac); err != nil {
		t.Fatalf("lease RBAC: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, args := range [][]string{
			// Not the namespace: without kube-controller-manager here, nothing would finish deleting it.
			{"-n", manifests.LeaseNamespace, "delete", "--ignore-not-found", "role,rolebinding", "konnectivity-server-leases", "konnectivity-agent-leases"},
			{"-n", manifests.LeaseNamespace, "delete", "--ignore-not-found", "leases", "-l", leaseSelector},
		} {
			if out, err := c.kubectl(ctx, nsCP, args...); err != nil {
				t.Logf("cleanup: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	})

	leaseFlags := []string{"--enable-lease-controller", "--lease-namespace=" + manifests.LeaseNamespace, "--lease-label=" + leaseSelector}
	a := c.startServer(t, serverOpts{impl: implKonnect, id: "lease-a", serverCount: 1, extra: leaseFlags})
	b := c.startServer(t, serverOpts{impl: implKonnect, id: "lease-b", serverCount: 1, portOffset: 10,
		uds: filepath.Join(c.dir, "ks-lease-b", "konnectivity-server.socket"), extra: leaseFlags})
	c.waitLeases(t, "lease-a", "lease-b")

	// One address for both servers, as a load balancer in front of several control planes gives.
	const lbPort = agentPort + 20
	startTCPBalancer(t, c.tp.ns(nsCP), net.JoinHostPort(cpAddr, strconv.Itoa(lbPort)),
		net.JoinHostPort(cpAddr, strconv.Itoa(a.agentPort)), net.JoinHostPort(cpAddr, strconv.Itoa(b.agentPort)))

	ag := c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1, id: "lease-agent", noWait: true, extra: []string{
		fmt.Sprintf("--proxy-server-port=%d", lbPort),
		"--count-server-leases", "--lease-namespace=" + manifests.LeaseNamespace, "--lease-label=" + leaseSelector,
		"--kubeconfig=" + c.agentAPIKubeconfig(t),
	}})
	both := map[string][]string{"lease-a": {"lease-agent"}, "lease-b": {"lease-agent"}}
	c.waitAgentServers(t, ag, 2, time.Minute)
	c.waitDoctor(t, both, a.adminPort, b.adminPort)
	t.Logf("agent counts 2 server leases (both servers say --server-count=1) and is connected to both")
	// Upstream's lease informer counts its lists of the real kube-apiserver's Leases, and /metrics shows them
	// under upstream's name.
	if metrics, err := c.agentMetrics(ag); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(metrics, `konnectivity_network_proxy_agent_lease_lists_total{http_response_code="200"`) {
		t.Errorf("the agent's /metrics has no successful lease list (konnectivity_network_proxy_agent_lease_lists_total)")
	}

	// SIGTERM: the server deletes its lease on the way out, and the agent stops counting it.
	start := time.Now()
	if err := b.p.Stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Logf("server B stop: %v", err)
	}
	c.waitLeases(t, "lease-a")
	c.waitAgentServers(t, ag, 1, 30*time.Second)
	t.Logf("server B stopped: its lease deleted and the agent ready with 1 of 1 servers after %v", time.Since(start).Round(100*time.Millisecond))

	b.restartStopped(t, c)
	c.waitLeases(t, "lease-a", "lease-b")
	c.waitAgentServers(t, ag, 2, time.Minute)
	c.waitDoctor(t, both, a.adminPort, b.adminPort)
	t.Logf("server B back: its lease counted again and the agent connected to it through the balancer")

	// SIGKILL: the lease stays until it expires (30 s). Meanwhile the agent knows a server is missing.
	start = time.Now()
	b.p.Kill()
	if err := harness.Poll("agent to miss server B", 30*time.Second, 250*time.Millisecond, func() error {
		if err := c.agentReady(ag); err == nil {
			return errors.New("all-servers-connected still passes")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.waitAgentServers(t, ag, 1, 90*time.Second)
	expired := time.Since(start)
	if expired < 20*time.Second {
		t.Errorf("the agent stopped counting the killed server's lease after %v, before it could expire", expired)
	}
	t.Logf("server B killed: the agent counted its lease until it expired, %v later", expired.Round(100*time.Millisecond))
	c.waitLeases(t, "lease-a")
	t.Logf("server A's garbage collection deleted the expired lease after %v", time.Since(start).Round(100*time.Millisecond))
}

// waitLeases waits until the server leases in their namespace are exactly those of the server IDs given.
func (c *cluster) waitLeases(t *testing.T, ids ...string) {
	t.Helper()
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = "konnectivity-proxy-server-" + id
	}
	sort.Strings(want)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got string
	err := harness.Poll("server leases "+strings.Join(want, ","), 90*time.Second, 500*time.Millisecond, func() error {
		out, err := c.kubectl(ctx, nsCP, "-n", manifests.LeaseNamespace, "get", "leases", "-l", leaseSelector,
			"-o", `jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}`)
		if err != nil {
			return err
		}
		names := strings.Fields(out)
		sort.Strings(names)
		got = strings.Join(names, ",")
		if got != strings.Join(want, ",") {
			return fmt.Errorf("leases %q", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// agentReady checks the agent's all-servers-connected readiness check.
func (c *cluster) agentReady(a *tunnelAgent) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client := nsHTTPClient(c.tp.ns(a.opts.role), nil, 3*time.Second)
	return httpGetOK(ctx, client, "http://127.0.0.1:8093/readyz/all-servers-connected", nil)
}

// agentMetrics reads the agent's /metrics.
func (c *cluster) agentMetrics(a *tunnelAgent) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client := nsHTTPClient(c.tp.ns(a.opts.role), nil, 3*time.Second)
	var body string
	err := httpGetOK(ctx, client, "http://127.0.0.1:8093/metrics", &body)
	return body, err
}

// agentKnownServers reads the agent's known_server_count gauge.
func (c *cluster) agentKnownServers(a *tunnelAgent) (int, error) {
	body, err := c.agentMetrics(a)
	if err != nil {
		return 0, err
	}
	return knownServerCount(body)
}

// knownServerCount reads the known_server_count gauge from an agent's /metrics.
func knownServerCount(metrics string) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(metrics))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "konnectivity_network_proxy_agent_known_server_count "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err
		}
	}
	return 0, errors.New("no konnectivity_network_proxy_agent_known_server_count in /metrics")
}

// waitAgentServers waits until the agent counts n servers and is connected to all of them.
func (c *cluster) waitAgentServers(t *testing.T, a *tunnelAgent, n int, timeout time.Duration) {
	t.Helper()
	err := harness.Poll(fmt.Sprintf("agent to count %d servers and be connected to all", n), timeout, 250*time.Millisecond, func() error {
		if err := a.p.Exited(); err != nil {
			return err
		}
		got, err := c.agentKnownServers(a)
		if err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("known_server_count %d", got)
		}
		return c.agentReady(a)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// agentAPIKubeconfig is a kubeconfig for kube-apiserver with a token of the agents' ServiceAccount (the
// API audience), which is what an agent pod's in-cluster config would use.
func (c *cluster) agentAPIKubeconfig(t *testing.T) string { return c.agentKubeconfig(t) }

// agentKubeconfig is a kubeconfig for kube-apiserver with a token of the agents' ServiceAccount, for the
// audiences given (none: kube-apiserver's own).
func (c *cluster) agentKubeconfig(t *testing.T, audiences ...string) string {
	t.Helper()
	args := []string{"-n", "kube-system", "create", "token", "konnectivity-agent", "--duration=1h"}
	for _, a := range audiences {
		args = append(args, "--audience", a)
	}
	tok := strings.TrimSpace(c.kubectlT(t, args...))
	caPEM, err := os.ReadFile(filepath.Join(c.pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.dir, "agent-api-"+randHex(2)+".kubeconfig")
	err = pkitest.WriteKubeconfig(path, clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:%d", cpAddr, apiPort), CertificateAuthorityData: caPEM},
		clientcmdapi.AuthInfo{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// listenIn listens on addr inside namespace ns.
func listenIn(ns, addr string) (net.Listener, error) {
	return harness.InNetns(ns, func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// startTCPBalancer forwards each connection to addr in ns to the next backend in turn, until t ends. A
// backend that refuses closes the connection, as a load balancer without health checks does.
func startTCPBalancer(t *testing.T, ns, addr string, backends ...string) {
	t.Helper()
	ln, err := listenIn(ns, addr)
	if err != nil {
		t.Fatalf("balancer on %s: %v", addr, err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
		next  atomic.Uint64
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			if !track(in) {
				in.Close()
				return
			}
			backend := backends[next.Add(1)%uint64(len(backends))]
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer in.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				out, err := harness.DialIn(ctx, ns, backend)
				cancel()
				if err != nil || !track(out) {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	})
}
