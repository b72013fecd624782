package tunnel

import (
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
)

// TestStatusKeepsAgentsBesideRefusalFloods: refusals under IDs that no agent authenticated with (any peer
// that reaches the agent port can claim one) have their own bound, so that a flood of them never pushes out
// what is remembered of agents that did connect; a refusal under a known, disconnected agent's ID is its
// last error, and one under a connected agent's ID changes nothing.
func TestStatusKeepsAgentsBesideRefusalFloods(t *testing.T) {
	tr := newAgentTracker()
	for i := range 10 {
		id := fmt.Sprintf("node-%d", i)
		tr.connected(id, "host=198.19.0.1", "198.19.0.1:5000", flow.Version)
		tr.disconnected(id, flow.Version, errors.New("stream reset"))
	}
	tr.connected("up", "", "198.19.0.2:5000", flow.None)
	for i := range 5000 {
		tr.refused(fmt.Sprintf("made-up-%d", i), "", "198.18.9.9:4000", errors.New("token rejected"))
	}
	tr.refused("node-3", "", "198.18.9.9:4000", errors.New("token expired"))
	tr.refused("up", "", "198.18.9.9:4000", errors.New("token rejected"))

	byID := map[string]AgentStatus{}
	refusals := 0
	for _, a := range tr.list() {
		byID[a.ID] = a
		if a.LastError == "token rejected" {
			refusals++
		}
	}
	for i := range 10 {
		if _, ok := byID[fmt.Sprintf("node-%d", i)]; !ok {
			t.Errorf("node-%d was forgotten beside the flood of refusals", i)
		}
	}
	if refusals != maxRefused {
		t.Errorf("%d refusals remembered, want the bound %d", refusals, maxRefused)
	}
	if got := byID["node-3"].LastError; got != "token expired" {
		t.Errorf("node-3's last error %q, want the refusal under its ID", got)
	}
	if a := byID["up"]; !a.Connected || a.LastError != "" {
		t.Errorf("a refusal under a connected agent's ID changed it: %+v", a)
	}
	// An agent that authenticates after refusals under its ID keeps them as its history.
	tr.refused("late", "", "198.19.0.3:5000", errors.New("token expired"))
	tr.connected("late", "", "198.19.0.3:5000", flow.Version)
	n := 0
	for _, a := range tr.list() {
		if a.ID == "late" {
			n++
			if !a.Connected || a.LastError != "token expired" {
				t.Errorf("late: %+v", a)
			}
		}
	}
	if n != 1 {
		t.Errorf("late listed %d times", n)
	}
}

// TestStatusCountsStreamsByFlowControl: an agent's status counts its connected streams by the flow control
// each negotiated, so that two streams under one agent ID (an agent replaced while its predecessor is still
// connected) that differ both show; the counts go with the streams, and a disconnected agent has none.
func TestStatusCountsStreamsByFlowControl(t *testing.T) {
	tr := newAgentTracker()
	flowOf := func(id string) map[string]int {
		t.Helper()
		for _, a := range tr.list() {
			if a.ID == id {
				return a.FlowControl
			}
		}
		t.Fatalf("%s not listed", id)
		return nil
	}
	check := func(id string, want map[string]int) {
		t.Helper()
		if got := flowOf(id); !maps.Equal(got, want) {
			t.Errorf("%s: flow control %v, want %v", id, got, want)
		}
	}
	tr.connected("node-1", "", "198.19.0.1:5000", flow.Version)
	tr.connected("node-2", "", "198.19.0.2:5000", flow.None)
	check("node-1", map[string]int{flow.Version: 1})
	check("node-2", map[string]int{flow.None: 1})
	tr.connected("node-1", "", "198.19.0.1:5001", flow.None)
	check("node-1", map[string]int{flow.Version: 1, flow.None: 1})
	tr.disconnected("node-1", flow.Version, nil)
	check("node-1", map[string]int{flow.None: 1})
	tr.disconnected("node-1", flow.None, nil)
	if got := flowOf("node-1"); got != nil {
		t.Errorf("disconnected node-1: flow control %v, want none listed", got)
	}
	// A listed status is a copy: what changes after list does not show in it.
	listed := flowOf("node-2")
	tr.connected("node-2", "", "198.19.0.2:5001", flow.Version)
	if !maps.Equal(listed, map[string]int{flow.None: 1}) {
		t.Errorf("a status listed before another stream connected changed to %v", listed)
	}
}
