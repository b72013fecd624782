package konnectivity

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The markers by which Classify knows konnect's own refusals. They are wire text: konnect servers and agents
// have written them into every such refusal since the first release, and doctors of every release read them.
// Each is spelled like the flag that operators read it next to, and renaming the flag must not change it.
const (
	pendingDialsMarker = "--max-pending-dials"
	notAllowedMarker   = "not in --allow-destination"
)

// Refusal is a dial refusal as konnect sends it: Text goes on the wire byte for byte (the error of a
// DIAL_RSP, an HTTP CONNECT status body), Reason is the sentinel it is on this side (errors.Is). The
// constructors below are the one place that writes these texts, as Classify is the one place that reads them.
type Refusal struct {
	Reason error
	Text   string
}

func (r *Refusal) Error() string { return r.Text }
func (r *Refusal) Unwrap() error { return r.Reason }

// TooManyDials is the server's refusal of a dial while max dials already wait for an agent's answer.
func TooManyDials(max int) *Refusal {
	return &Refusal{ErrTooManyDials, fmt.Sprintf(
		"konnect server: %d dials already wait for an agent's answer (%s=%d); dial refused, try again later",
		max, pendingDialsMarker, max)}
}

// upstreamTimeoutText is upstream proxy-server's dial timeout error, kept in konnect's so that tools matching
// it still do.
const upstreamTimeoutText = "timed out waiting for backend dial"

// DialTimedOut is the server's answer to a dial that no agent answered within timeout.
func DialTimedOut(timeout time.Duration) *Refusal {
	return &Refusal{ErrDialTimeout, fmt.Sprintf(
		"konnect server: %s: no agent answered within %s (--backend-dial-timeout)", upstreamTimeoutText, timeout)}
}

// NotAllowed is the agent's refusal of a dial to addr, which its allow list does not include.
func NotAllowed(addr string) *Refusal {
	return &Refusal{ErrNotAllowed, fmt.Sprintf("konnect agent refused to dial %s: %v", addr, ErrNotAllowed)}
}

// Why a dial through the tunnel failed. The agent returns ErrNotAllowed itself (and agents of earlier konnect
// releases ErrDraining, which is still recognised); the others
// come from upstream's server and client or from the agent's operating system. On the wire they are only
// text (the error of a DIAL_RSP, an HTTP CONNECT status body), so a caller that receives one gets it back as
// text and asks Classify which of these it is.
var (
	// ErrDraining: the agent is shutting down and takes no new dials (agents of earlier konnect releases).
	ErrDraining = errors.New("konnect agent is shutting down and accepts no new connections")
	// ErrNotAllowed: the destination is outside the agent's allow list.
	ErrNotAllowed = errors.New("destination " + notAllowedMarker)
	// ErrNoAgent: the server has no agent for the destination.
	ErrNoAgent = errors.New("no agent available")
	// ErrDialTimeout: the agent did not answer the dial in time.
	ErrDialTimeout = errors.New("dial timeout")
	// ErrTooManyDials: the server already holds as many dials waiting for agents as it allows.
	ErrTooManyDials = errors.New("too many pending dials (" + pendingDialsMarker + ")")
	// ErrConnectionRefused: nothing listens where the dial went.
	ErrConnectionRefused = errors.New("connection refused")
	// ErrIOTimeout: a connect timed out at the socket level.
	ErrIOTimeout = errors.New("i/o timeout")
	// ErrUnreachable: no route to the destination.
	ErrUnreachable = errors.New("unreachable")
	// ErrNoSuchHost: the destination's name does not resolve.
	ErrNoSuchHost = errors.New("no such host")
	// ErrTunnelClosed: the tunnel went away during the dial.
	ErrTunnelClosed = errors.New("tunnel closed")
	// ErrNoSuchFile: a socket (the server's frontend) does not exist.
	ErrNoSuchFile = errors.New("no such file")
	// ErrPermissionDenied: no permission on a socket.
	ErrPermissionDenied = errors.New("permission denied")
)

// wireText is what each reason looks like in an error's text, lower case.
var wireText = []struct {
	reason error
	texts  []string
}{
	{ErrDraining, []string{"shutting down and accepts no new connections"}},
	{ErrNotAllowed, []string{notAllowedMarker}},
	{ErrNoAgent, []string{"no agent available"}},
	{ErrDialTimeout, []string{"dial timeout", upstreamTimeoutText}},
	{ErrTooManyDials, []string{pendingDialsMarker}},
	{ErrConnectionRefused, []string{"connection refused"}},
	{ErrIOTimeout, []string{"i/o timeout"}},
	{ErrUnreachable, []string{"network is unreachable", "no route to host", "host is unreachable"}},
	{ErrNoSuchHost, []string{"no such host"}},
	{ErrTunnelClosed, []string{"tunnel closed", "connection ended before it answered"}},
	{ErrNoSuchFile, []string{"no such file"}},
	{ErrPermissionDenied, []string{"permission denied"}},
}

// Classify returns err so that errors.Is matches every reason above that its text names, besides whatever
// err wraps already. It is the one place where the tunnel's error text is read. A nil err stays nil; an err
// that names no reason is returned as it is.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	low := strings.ToLower(err.Error())
	var reasons []error
	for _, w := range wireText {
		for _, t := range w.texts {
			if strings.Contains(low, t) {
				reasons = append(reasons, w.reason)
				break
			}
		}
	}
	if len(reasons) == 0 {
		return err
	}
	return &classified{err: err, reasons: reasons}
}

type classified struct {
	err     error
	reasons []error
}

func (c *classified) Error() string { return c.err.Error() }

func (c *classified) Unwrap() []error { return append([]error{c.err}, c.reasons...) }
