package doctorcmd

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/tunnel"
)

// TestStatusFlowControl: doctor status shows each connected agent's flow control, warns about the agents
// without it, naming them and what it costs, and says "unknown" (never "none") for a server whose status
// does not report it.
func TestStatusFlowControl(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	agent := func(id string, fc map[string]int) tunnel.AgentStatus {
		return tunnel.AgentStatus{ID: id, Connected: fc != nil, Connections: len(fc), Since: now.Add(-time.Minute),
			Remote: "198.19.0.1:5000", LastSeen: now, FlowControl: fc}
	}
	const warned = "one slow reader can stall the other connections of that agent"
	for _, tc := range []struct {
		name     string
		status   tunnel.Status
		cells    map[string]string // FLOW CONTROL by agent ID
		want     []string
		wantNone []string
	}{{
		name: "all with flow control",
		status: tunnel.Status{FlowControl: "v1", Agents: []tunnel.AgentStatus{
			agent("node-1", map[string]int{"v1": 1}), agent("node-2", map[string]int{"v1": 1})}},
		cells:    map[string]string{"node-1": "v1", "node-2": "v1"},
		wantNone: []string{"warning", "note", "unknown"},
	}, {
		name: "an upstream agent",
		status: tunnel.Status{FlowControl: "v1", Agents: []tunnel.AgentStatus{
			agent("konnect-1", map[string]int{"v1": 1}), agent("upstream-1", map[string]int{"none": 1}),
			agent("upstream-2", map[string]int{"none": 1}), {ID: "gone", LastSeen: now}}},
		cells: map[string]string{"konnect-1": "v1", "upstream-1": "none", "upstream-2": "none", "gone": "-"},
		want: []string{"warning: no per-connection flow control on 2 agent(s): upstream-1, upstream-2: " + warned,
			"upgrade them to a konnect agent"},
		wantNone: []string{"note"},
	}, {
		name: "one agent ID with streams of both kinds",
		status: tunnel.Status{FlowControl: "v1", Agents: []tunnel.AgentStatus{
			agent("node-1", map[string]int{"v1": 2, "none": 1})}},
		cells: map[string]string{"node-1": "none×1,v1×2"},
		want:  []string{"warning: no per-connection flow control on 1 agent(s): node-1: " + warned},
	}, {
		name: "a later flow-control version",
		status: tunnel.Status{FlowControl: "v2", Agents: []tunnel.AgentStatus{
			agent("node-1", map[string]int{"v2": 1})}},
		cells:    map[string]string{"node-1": "v2"},
		wantNone: []string{"warning", "note"},
	}, {
		name: "server with --flow-control=false",
		status: tunnel.Status{FlowControl: "none", Agents: []tunnel.AgentStatus{
			agent("node-1", map[string]int{"none": 1})}},
		cells:    map[string]string{"node-1": "none"},
		want:     []string{"warning: this server runs with --flow-control=false: its agents have no per-connection flow control, and " + warned},
		wantNone: []string{"upgrade"},
	}, {
		name: "server older than the field",
		status: tunnel.Status{Agents: []tunnel.AgentStatus{
			{ID: "node-1", Connected: true, Connections: 1, Since: now, LastSeen: now}, {ID: "gone", LastSeen: now}}},
		cells:    map[string]string{"node-1": "unknown", "gone": "-"},
		want:     []string{"note: flow control unknown for node-1: this server's status does not report it"},
		wantNone: []string{"warning", "none"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printStatus(&b, []serverResult{{Admin: "127.0.0.1:8133", Status: &tc.status}}, now)
			out := b.String()
			for id, cell := range tc.cells {
				if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(id) + `\s+(dis)?connected\s+\S+\s+` + regexp.QuoteMeta(cell) + `\s`).MatchString(out) {
					t.Errorf("%s: want FLOW CONTROL %q:\n%s", id, cell, out)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("no %q in:\n%s", w, out)
				}
			}
			for _, w := range tc.wantNone {
				if strings.Contains(out, w) {
					t.Errorf("%q in:\n%s", w, out)
				}
			}
		})
	}
}

// TestStatusReadsOlderServers: doctor status reads the status of a server that predates the flow-control
// fields (captured from one), and says that it does not know their flow control, rather than "none".
func TestStatusReadsOlderServers(t *testing.T) {
	const older = `{
  "serverID": "s1", "serverCount": 1, "mode": "grpc", "frontend": "/s.sock", "agentAddress": "127.0.0.1:8132",
  "openFrontends": 0, "draining": false,
  "agents": [{"id": "node-1", "connected": true, "connections": 1, "since": "2026-01-02T03:04:05Z",
    "lastSeen": "2026-01-02T03:04:05Z", "remote": "198.19.0.1:5000"}]
}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/agents" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, older)
	}))
	defer srv.Close()
	out, err := runCmd(t, context.Background(), "status", "--admin-address", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatalf("doctor status of an older server: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^  node-1\s+connected\s+\S+\s+unknown\s`).MatchString(out) ||
		!strings.Contains(out, "note: flow control unknown for node-1") || strings.Contains(out, "warning") {
		t.Errorf("doctor status of an older server:\n%s", out)
	}
}
