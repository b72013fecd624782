package tunnel

import (
	"errors"
	"fmt"
	"testing"
)

// TestStatusKeepsAgentsBesideRefusalFloods: refusals under IDs that no agent authenticated with (any peer
// that reaches the agent port can claim one) have their own bound, so that a flood of them never pushes out
// what is remembered of agents that did connect; a refusal under a known, disconnected agent's ID is its
// last error, and one under a connected agent's ID changes nothing.
func TestStatusKeepsAgentsBesideRefusalFloods(t *testing.T) {
	tr := newAgentTracker()
	for i := range 10 {
		id := fmt.Sprintf("node-%d", i)
		tr.connected(id, "host=198.19.0.1", "198.19.0.1:5000")
		tr.disconnected(id, errors.New("stream reset"))
	}
	tr.connected("up", "", "198.19.0.2:5000")
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
	tr.connected("late", "", "198.19.0.3:5000")
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
