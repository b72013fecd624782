//go:build integration

package servercmd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/agent"
	"github.com/konnect-dev/konnect/test/harness"
)

// TestDoctorStatusFlowControl runs `konnect server` with two real agents, konnect's (in process) and
// upstream's proxy-agent binary (the version go.mod pins), and `konnect doctor status` says which of them
// runs per-connection flow control: konnect's agent with v1, upstream's without, named in a warning that
// goes when that agent does.
func TestDoctorStatusFlowControl(t *testing.T) {
	dir, err := os.MkdirTemp("", "ksc") // short: the frontend socket's path must fit a sockaddr_un
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ca, sc, sk, ac, ak := writePKI(t, dir)
	agentAddr, _, admin := startServer(t,
		"--uds-name="+dir+"/s.sock", "--cluster-cert="+sc, "--cluster-key="+sk, "--cluster-ca-cert="+ca,
		"--mode=grpc", "--server-port=0", "--agent-port=0", "--agent-bind-address=127.0.0.1",
		"--admin-port=0", "--health-port=0", "--graceful-timeout=2s", "--server-id=flow-test",
		"--logtostderr=true", "--v=0")
	_, agentPort, err := net.SplitHostPort(agentAddr)
	if err != nil {
		t.Fatal(err)
	}

	a, err := agent.New(agent.Config{Servers: []string{agentAddr}, CAFile: ca, CertFile: ac, KeyFile: ak,
		AgentID: "konnect-agent", SyncInterval: 100 * time.Millisecond, GracefulTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	harness.RunDaemon(t, time.Second, a.Run)
	up := harness.Start(t, dir, "upstream-agent", nil, harness.UpstreamBinary(t, "proxy-agent"),
		"--proxy-server-host=127.0.0.1", "--proxy-server-port="+agentPort,
		"--ca-cert="+ca, "--agent-cert="+ac, "--agent-key="+ak, "--agent-id=upstream-agent",
		"--health-server-host=127.0.0.1", "--health-server-port="+strconv.Itoa(harness.FreePort(t)),
		"--admin-bind-address=127.0.0.1", "--admin-server-port="+strconv.Itoa(harness.FreePort(t)),
		"--sync-interval=100ms", "--probe-interval=100ms", "--sync-interval-cap=500ms", "--v=1")

	status := func(connected int) string {
		t.Helper()
		var out string
		harness.Eventually(t, 30*time.Second, fmt.Sprintf("doctor status with %d agent(s) connected", connected), func() error {
			o, err := runCmd(t, context.Background(), "status", "--admin-address", admin)
			if err != nil {
				return fmt.Errorf("%v\n%s", err, o)
			}
			if want := fmt.Sprintf("%d agent(s) connected", connected); !strings.Contains(o, want) {
				return fmt.Errorf("no %q:\n%s", want, o)
			}
			out = o
			return nil
		})
		return out
	}
	row := func(out, id, state, fc string) {
		t.Helper()
		if !regexp.MustCompile(`(?m)^  ` + id + `\s+` + state + `\s+\S+\s+` + regexp.QuoteMeta(fc) + `\s`).MatchString(out) {
			t.Errorf("doctor status: want %s %s with FLOW CONTROL %s:\n%s", id, state, fc, out)
		}
	}

	out := status(2)
	t.Logf("konnect doctor status:\n%s", out)
	row(out, "konnect-agent", "connected", "v1")
	row(out, "upstream-agent", "connected", "none")
	if want := "warning: no per-connection flow control on 1 agent(s): upstream-agent: one slow reader can stall the other connections of that agent"; !strings.Contains(out, want) {
		t.Errorf("doctor status: no %q:\n%s", want, out)
	}

	// -o json carries the server's own fields for scripts.
	js, err := runCmd(t, context.Background(), "status", "--admin-address", admin, "-o", "json")
	if err != nil {
		t.Fatalf("doctor status -o json: %v\n%s", err, js)
	}
	var results []struct {
		Status struct {
			FlowControl string `json:"flowControl"`
			Agents      []struct {
				ID          string         `json:"id"`
				FlowControl map[string]int `json:"flowControl"`
			} `json:"agents"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(js), &results); err != nil || len(results) != 1 {
		t.Fatalf("doctor status -o json: %v\n%s", err, js)
	}
	got := map[string]map[string]int{}
	for _, a := range results[0].Status.Agents {
		got[a.ID] = a.FlowControl
	}
	if results[0].Status.FlowControl != "v1" || got["konnect-agent"]["v1"] != 1 || got["upstream-agent"]["none"] != 1 {
		t.Errorf("doctor status -o json: server flowControl %q, agents %v\n%s", results[0].Status.FlowControl, got, js)
	}

	// Upstream's agent goes: so does the warning.
	up.Kill()
	out = status(1)
	row(out, "konnect-agent", "connected", "v1")
	row(out, "upstream-agent", "disconnected", "-")
	if strings.Contains(out, "warning") {
		t.Errorf("doctor status warns with every connected agent on flow control:\n%s", out)
	}
}
