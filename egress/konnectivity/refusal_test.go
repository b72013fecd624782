package konnectivity

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []error
	}{
		{"dial failed: konnect agent refused to dial 10.0.0.1:22: " + ErrNotAllowed.Error(), []error{ErrNotAllowed}},
		{ErrDraining.Error(), []error{ErrDraining}},
		{"dial failed: No agent available", []error{ErrNoAgent}},
		{"dial tcp 10.0.0.1:80: connect: connection refused", []error{ErrConnectionRefused}},
		{"dial tcp 10.0.0.1:80: connect: no route to host", []error{ErrUnreachable}},
		{"dial timeout: context deadline exceeded", []error{ErrDialTimeout}},
		{"konnect server: 2000 dials already wait for an agent's answer (--max-pending-dials=2000); dial refused", []error{ErrTooManyDials}},
	} {
		err := Classify(errors.New(tc.text))
		if err.Error() != tc.text {
			t.Errorf("Classify changed the text: %q", err)
		}
		for _, w := range tc.want {
			if !errors.Is(err, w) {
				t.Errorf("Classify(%q) is not %v", tc.text, w)
			}
		}
		if errors.Is(err, ErrTunnelClosed) {
			t.Errorf("Classify(%q) is ErrTunnelClosed", tc.text)
		}
	}
	if gone := "dial failed: konnect server: the agent's connection ended before it answered the dial"; !errors.Is(Classify(errors.New(gone)), ErrTunnelClosed) {
		t.Errorf("Classify(%q) is not ErrTunnelClosed", gone)
	}
	if Classify(nil) != nil {
		t.Error("Classify(nil) != nil")
	}
	inner := errors.New("inner")
	if err := Classify(fmt.Errorf("wrap: %w: tunnel closed", inner)); !errors.Is(err, inner) || !errors.Is(err, ErrTunnelClosed) {
		t.Errorf("lost the wrapped error or the reason: %v", err)
	}
}

// TestRefusalsRoundTrip: what konnect's producers send is, read back off the wire as text, what it is on
// their side; and the texts are the bytes that servers, agents and doctors of earlier releases exchange.
func TestRefusalsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		r    *Refusal
		want string
	}{
		{TooManyDials(2000), "konnect server: 2000 dials already wait for an agent's answer (--max-pending-dials=2000); dial refused, try again later"},
		{DialTimedOut(5 * time.Second), "konnect server: timed out waiting for backend dial: no agent answered within 5s (--backend-dial-timeout)"},
		{NotAllowed("10.0.0.1:22"), "konnect agent refused to dial 10.0.0.1:22: destination not in --allow-destination"},
	} {
		if tc.r.Error() != tc.want {
			t.Errorf("refusal text = %q, want %q", tc.r.Error(), tc.want)
		}
		if !errors.Is(tc.r, tc.r.Reason) {
			t.Errorf("%q is not %v on the producer's side", tc.r, tc.r.Reason)
		}
		if got := Classify(errors.New(tc.r.Error())); !errors.Is(got, tc.r.Reason) {
			t.Errorf("Classify(%q) is not %v", tc.r, tc.r.Reason)
		}
	}
}
