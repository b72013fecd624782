package agentcmd

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server/proxystrategies"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
)

// testServer runs upstream's server library with a TLS agent listener and returns its address and the CA
// file that verifies it.
func testServer(t *testing.T) (addr, caFile, certFile, keyFile string) {
	dir := t.TempDir()
	ca := pkitest.NewCA(t, "ca")
	caFile = ca.WriteCert(t, filepath.Join(dir, "ca.crt"))
	kp := ca.Server(t, "server", "127.0.0.1").TLS()
	// The agent's client certificate (the server does not ask for one; this is for the expiry metric).
	certFile, keyFile = ca.Client(t, "agent").Write(t, dir, "agent")
	ps := server.NewProxyServer("s1", []proxystrategies.ProxyStrategy{proxystrategies.ProxyStrategyDefault}, 1, &server.AgentTokenAuthenticationOptions{}, 10)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}})))
	agentpb.RegisterAgentServiceServer(gs, ps)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return ln.Addr().String(), caFile, certFile, keyFile
}

// freePort is a free loopback port, as the flag value.
func freePort(t *testing.T) string { return strconv.Itoa(harness.FreePort(t)) }

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitOK waits up to 10 s for base+path to answer 200, and fails with the agent's readiness otherwise.
func waitOK(t *testing.T, base, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get(base + path); code == 200 {
			return
		}
		if time.Now().After(deadline) {
			_, body := get(base + "/readyz?verbose")
			t.Fatalf("%s never answered 200: %s", path, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAgentCommand(t *testing.T) {
	addr, caFile, certFile, keyFile := testServer(t)
	host, port, _ := net.SplitHostPort(addr)
	health, admin := freePort(t), freePort(t)
	cmd := NewAgentCommand()
	cmd.SetArgs([]string{
		"--ca-cert=" + caFile, "--agent-cert=" + certFile, "--agent-key=" + keyFile, "--proxy-server-host=" + host, "--proxy-server-port=" + port,
		"--health-server-host=127.0.0.1", "--health-server-port=" + health, "--admin-server-port=" + admin,
		"--enable-profiling", "--sync-interval=100ms", "--graceful-timeout=1s",
		"--v=1", "--logtostderr", // klog flags, as upstream's binary takes them
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	base := "http://127.0.0.1:" + health
	waitOK(t, base, "/readyz")
	for _, tc := range []struct{ path, want string }{
		{"/readyz?verbose", "[+]initial-sync ok"},
		{"/readyz/server-connected", "ok"},
		{"/readyz/all-servers-connected", "ok"},
		{"/livez", "ok"},
		{"/healthz", "ok"},
		{"/ready", "ok"},
		{"/metrics", "konnectivity_network_proxy_agent_open_server_connections 1"},
		{"/metrics", `konnect_certificate_expiry_seconds{file="` + caFile + `",name="agent-ca"}`},
		{"/metrics", `konnect_certificate_expiry_seconds{file="` + certFile + `",name="agent-client"}`},
		{"/metrics", `konnect_certificate_reload_pending{file="` + caFile + `",name="agent-ca"} 0`},
		{"/metrics", `konnect_certificate_reload_pending{file="` + certFile + `",name="agent-client"} 0`},
		{"/metrics", `konnect_endpoint_connections_rejected_total{port="health",reason="refused"} 0`},
	} {
		code, body := get(base + tc.path)
		if code != 200 || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %q, want %q", tc.path, code, body, tc.want)
		}
	}
	if code, _ := get("http://127.0.0.1:" + admin + "/debug/pprof/"); code != 200 {
		t.Errorf("pprof on the admin port: %d", code)
	}
	// The agent's status: the server it reached, and that upstream's server runs no flow control.
	if code, body := get("http://127.0.0.1:" + admin + "/debug/servers"); code != 200 ||
		!strings.Contains(body, `"serverID": "s1"`) || !strings.Contains(body, `"connected": true`) ||
		!strings.Contains(body, `"flowControl": "none"`) || !strings.Contains(body, `"flowControl": "v1"`) {
		t.Errorf("/debug/servers on the admin port: %d %s", code, body)
	}
	// As upstream's, the admin port sends /metrics on to the health port (get follows the redirect).
	if code, body := get("http://127.0.0.1:" + admin + "/metrics"); code != 200 || !strings.Contains(body, "konnectivity_network_proxy_agent_open_server_connections 1") {
		t.Errorf("/metrics on the admin port: %d %.200q", code, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent command did not return after cancel")
	}
}

func TestAgentCommandRefusals(t *testing.T) {
	garbage := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"remote admin", []string{"--admin-bind-address=0.0.0.0", "--health-server-host=127.0.0.1", "--admin-server-port=" + freePort(t), "--health-server-port=" + freePort(t)}, "--admin-bind-address"},
		{"bad allow", []string{"--allow-destination=10.0.0.0/8"}, "--allow-destination"},
		{"missing CA", []string{"--ca-cert=/nonexistent/ca.crt"}, "--ca-cert"},
		{"CA not PEM", []string{"--ca-cert=" + garbage}, "agent: CA bundle (--ca-cert) ([" + garbage + "]): "},
		{"client certificate not PEM", []string{"--agent-cert=" + garbage, "--agent-key=" + garbage}, "agent: client certificate (--agent-cert/--agent-key) ([" + garbage + " " + garbage + "]): "},
		{"empty token", []string{"--service-account-token-path=" + os.DevNull}, "agent: token (--service-account-token-path) ([" + os.DevNull + "]): "},
		{"health port taken", nil, "--health-server-port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.name == "health port taken" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				args = []string{"--health-server-host=127.0.0.1", "--health-server-port=" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), "--admin-server-port=" + freePort(t)}
			}
			cmd := NewAgentCommand()
			cmd.SetArgs(args)
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// sigtermStops runs `konnect agent args...` with its health port on health, waits until path answers 200
// there, sends the process SIGTERM and checks that the agent stops cleanly within stopWithin.
// whileUp, when set, runs once path answers 200, before the SIGTERM.
func sigtermStops(t *testing.T, health, path string, stopWithin time.Duration, whileUp func(base string), args ...string) {
	t.Helper()
	cmd := NewAgentCommand()
	cmd.SetArgs(append(args, "--health-server-host=127.0.0.1", "--health-server-port="+health, "--admin-server-port="+freePort(t)))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for code, _ := get("http://127.0.0.1:" + health + path); code != 200; code, _ = get("http://127.0.0.1:" + health + path) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent's %s never answered 200", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if whileUp != nil {
		whileUp("http://127.0.0.1:" + health)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(stopWithin):
		t.Fatalf("the agent did not stop within %v of SIGTERM", stopWithin)
	}
}

// TestAgentCommandServerMissing: with one of its two servers out of reach (nothing listens on 127.0.0.2), a
// new agent serves the other, is not ready for its initial sync (so that a rollout keeps the agent it
// replaces), and /readyz/all-servers-connected names the missing server.
func TestAgentCommandServerMissing(t *testing.T) {
	addr, caFile, certFile, keyFile := testServer(t)
	host, port, _ := net.SplitHostPort(addr)
	health := freePort(t)
	cmd := NewAgentCommand()
	cmd.SetArgs([]string{
		"--ca-cert=" + caFile, "--agent-cert=" + certFile, "--agent-key=" + keyFile, "--proxy-server-host=" + host + ",127.0.0.2",
		"--proxy-server-port=" + port, "--health-server-host=127.0.0.1", "--health-server-port=" + health,
		"--admin-server-port=" + freePort(t), "--sync-interval=100ms", "--graceful-timeout=1s",
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	base := "http://127.0.0.1:" + health
	waitOK(t, base, "/readyz/server-connected")
	if code, body := get(base + "/readyz?verbose"); code != 500 || !strings.Contains(body, "[-]initial-sync failed: connected to 1 of 2 servers") {
		t.Errorf("/readyz?verbose: %d %q, want initial-sync failing", code, body)
	}
	if code, body := get(base + "/readyz/all-servers-connected"); code != 500 || !strings.Contains(body, "connected to 1 of 2 servers; not connected: 127.0.0.2:"+port) {
		t.Errorf("/readyz/all-servers-connected: %d %q", code, body)
	}
}

// TestAgentCommandSIGTERM: the first SIGTERM stops the agent cleanly (drain, then exit 0).
func TestAgentCommandSIGTERM(t *testing.T) {
	addr, caFile, _, _ := testServer(t)
	host, port, _ := net.SplitHostPort(addr)
	sigtermStops(t, freePort(t), "/readyz", 10*time.Second, nil,
		"--ca-cert="+caFile, "--proxy-server-host="+host, "--proxy-server-port="+port, "--graceful-timeout=2s")
}

// TestAgentCommandSIGTERMWhileWaitingForLeases: a SIGTERM while the agent waits for its lease watch to sync
// (here, against an API server that accepts connections and never answers) stops it at once and cleanly.
func TestAgentCommandSIGTERMWhileWaitingForLeases(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://"+silent.Addr().String()+
		"\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\ncurrent-context: c\n"), 0o600)
	addr, caFile, _, _ := testServer(t)
	host, port, _ := net.SplitHostPort(addr)
	// /livez answers once Run serves it; the agent is then waiting for the leases, and /readyz says so,
	// without a server count or a time since a start that has not happened.
	whileUp := func(base string) {
		want := `[-]initial-sync failed: waiting for the server leases in namespace "kube-system" to sync before connecting`
		if code, body := get(base + "/readyz?verbose"); code != 500 || !strings.Contains(body, want) || strings.Contains(body, "after the start") {
			t.Errorf("/readyz?verbose while waiting for the leases: %d %q, want %q", code, body, want)
		}
	}
	sigtermStops(t, freePort(t), "/livez", 5*time.Second, whileUp,
		"--ca-cert="+caFile, "--proxy-server-host="+host, "--proxy-server-port="+port,
		"--count-server-leases", "--kubeconfig="+kubeconfig)
}
