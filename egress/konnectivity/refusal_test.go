package konnectivity

import (
	"errors"
	"fmt"
	"testing"
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
