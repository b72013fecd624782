package doctorcmd

import (
	"context"
	"testing"

	"github.com/konnect-dev/konnect/egress/extensions"
)

// An endpoint that pods/portforward cannot reach reads as it always has: the library's cause, and doctor's
// advice on where to run instead.
func TestNotPodRemedy(t *testing.T) {
	detail := "10.0.0.7:443: " + extensions.ErrNotPod.Error()
	r := withRemedy(extensions.Result{Cause: extensions.DialCause(context.Background(), extensions.ErrNotPod), Detail: detail})
	want := "10.0.0.7:443: the endpoint is not a pod, and pods/portforward reaches only pods: run konnect doctor extensions on a control-plane node with --uds-name"
	if r.Cause != "endpoint is not a pod" || r.Detail != want {
		t.Errorf("cause %q, detail %q; want %q, %q", r.Cause, r.Detail, "endpoint is not a pod", want)
	}
	other := extensions.Result{Cause: extensions.CauseRefused, Detail: "x"}
	if got := withRemedy(other); got.Detail != "x" {
		t.Errorf("detail of another cause changed: %q", got.Detail)
	}
}
