package tunnel

import (
	"errors"
	"strings"
	"testing"
)

// TestReasonTable pins the operator explanation for the agent-side failures whose text comes over the wire in
// a DIAL_RSP, so that the doctor names them instead of calling them unrecognised.
func TestReasonTable(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{"dial failed: konnect agent refused to dial 10.0.0.1:22: destination not in --allow-destination", "--allow-destination"},
		{"dial failed: No agent available", "no agent is connected"},
		{"dial failed: dial tcp 10.0.0.1:80: connect: connection refused", "nothing listens on that port"},
		{"dial failed: dial tcp 10.0.0.1:80: connect: network is unreachable", "no route"},
		{"something else entirely", ""},
	} {
		if got := Reason(errors.New(tc.err)); (tc.want == "" && got != "") || !strings.Contains(got, tc.want) {
			t.Errorf("Reason(%q) = %q, want it to mention %q", tc.err, got, tc.want)
		}
	}
}
