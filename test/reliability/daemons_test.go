//go:build integration

package reliability

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// serverPorts are the TCP ports of one konnect server.
type serverPorts struct{ agent, admin, health int }

// serverArgs runs konnect server with a gRPC frontend on uds and the certificates of dir, every listener
// on loopback, pprof on. Agent authentication comes in extra (mtlsServer or tokenServerArgs).
func serverArgs(dir, uds string, p serverPorts, extra ...string) []string {
	pki := filepath.Join(dir, "pki")
	return append([]string{"server",
		"--uds-name", uds, "--mode", "grpc", "--server-port", "0",
		"--cluster-cert", filepath.Join(pki, "konnectivity-server.crt"),
		"--cluster-key", filepath.Join(pki, "konnectivity-server.key"),
		"--agent-bind-address", "127.0.0.1", "--agent-port", strconv.Itoa(p.agent),
		"--admin-port", strconv.Itoa(p.admin), "--health-bind-address", "127.0.0.1", "--health-port", strconv.Itoa(p.health),
		"--enable-profiling", "--graceful-timeout", "2s",
	}, extra...)
}

// agentArgs runs konnect agent against every server agent port given. Its credentials come in extra
// (mtlsAgent, or --service-account-token-path).
func agentArgs(dir string, serverAgentPorts []int, admin, health int, extra ...string) []string {
	pki := filepath.Join(dir, "pki")
	var hosts []string
	for _, p := range serverAgentPorts {
		hosts = append(hosts, "127.0.0.1:"+strconv.Itoa(p))
	}
	return append([]string{"agent",
		"--ca-cert", filepath.Join(pki, "ca.crt"),
		"--proxy-server-host", strings.Join(hosts, ","), "--proxy-server-port", strconv.Itoa(serverAgentPorts[0]),
		"--admin-server-port", strconv.Itoa(admin), "--health-server-host", "127.0.0.1", "--health-server-port", strconv.Itoa(health),
		"--enable-profiling", "--sync-interval-cap", "1s", "--graceful-timeout", "2s",
	}, extra...)
}

// tunnel is one running server and agent pair.
type tunnel struct {
	dir                  string
	uds                  string
	server, agent        *harness.Proc
	sp                   serverPorts
	agentAdmin, agentHlt int
}

// startTunnel starts one server and one agent on loopback and waits until both are ready.
func startTunnel(t *testing.T, dir string, serverExtra, agentExtra []string) *tunnel {
	t.Helper()
	ports := harness.FreePorts(t, 5)
	tn := &tunnel{dir: dir, uds: filepath.Join(shortDir(t), "s.sock"),
		sp: serverPorts{ports[0], ports[1], ports[2]}, agentAdmin: ports[3], agentHlt: ports[4]}
	tn.server = startKonnect(t, "server", serverArgs(dir, tn.uds, tn.sp, serverExtra...)...)
	waitReady(t, tn.server, tn.sp.health)
	tn.agent = startKonnect(t, "agent", agentArgs(dir, []int{tn.sp.agent}, tn.agentAdmin, tn.agentHlt, agentExtra...)...)
	waitReady(t, tn.agent, tn.agentHlt)
	return tn
}

// waitReady waits for /readyz on the health port, failing early if the process exits.
func waitReady(t testing.TB, p *harness.Proc, healthPort int) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, p.Name+" ready", func() error {
		if !p.Running() {
			t.Fatalf("%s exited before it was ready:\n%s", p.Name, harness.Tail(p.Log(), 3000))
		}
		return httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort))
	})
}

// mtlsServer makes konnect server authenticate agents by client certificate (the agents' CA of dir).
func mtlsServer(dir string) []string {
	return []string{"--cluster-ca-cert", filepath.Join(dir, "pki", "konnectivity-agent-ca.crt")}
}

// mtlsAgent gives konnect agent its client certificate from dir (konnect init --agent-auth mtls).
func mtlsAgent(dir string) []string {
	return []string{"--agent-cert", filepath.Join(dir, "pki", "konnectivity-agent.crt"), "--agent-key", filepath.Join(dir, "pki", "konnectivity-agent.key")}
}
