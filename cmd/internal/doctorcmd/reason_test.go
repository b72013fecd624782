package doctorcmd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/tunnel"
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

// TestReasonOfDialErrors pins the explanation of the errors tunnel.Frontend's Dial returns, in the shapes the
// tunnel's tests see them take against a real server (tunnel_test.go, modes_test.go, dials_test.go).
func TestReasonOfDialErrors(t *testing.T) {
	frontend := func(err error) error { return &tunnel.FrontendError{Where: "/run/konnect.sock", Err: err} }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{frontend(&net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ENOENT)}), "socket does not exist"},
		{frontend(&net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), "nothing listens on the server's socket"},
		{frontend(tunnel.ErrOtherMode), "--mode"},
		{frontend(errors.New(`read CONNECT response: malformed HTTP response "\x00\x00"`)), "--mode"},
		{fmt.Errorf("503 Service Unavailable: %w", konnectivity.TooManyDials(4)), "--max-pending-dials"},
		{fmt.Errorf("dial failed: %s", konnectivity.DialTimedOut(300*time.Millisecond).Text), "did not answer in time"},
		{errors.New("dial failed: dial tcp 127.0.0.1:1: connect: connection refused"), "nothing listens on that port"},
		{errors.New("dial failed: No agent available"), "no agent is connected"},
	} {
		if got := Reason(tc.err); (tc.want == "" && got != "") || !strings.Contains(got, tc.want) {
			t.Errorf("Reason(%q) = %q, want it to mention %q", tc.err, got, tc.want)
		}
	}
}
