package konnectivity

import (
	"errors"
	"strings"
)

// Why a dial through the tunnel failed. The agent returns ErrNotAllowed itself (and agents of earlier konnect
// releases ErrDraining, which is still recognised); the others
// come from upstream's server and client or from the agent's operating system. On the wire they are only
// text (the error of a DIAL_RSP, an HTTP CONNECT status body), so a caller that receives one gets it back as
// text and asks Classify which of these it is.
var (
	// ErrDraining: the agent is shutting down and takes no new dials (agents of earlier konnect releases).
	ErrDraining = errors.New("konnect agent is shutting down and accepts no new connections")
	// ErrNotAllowed: the destination is outside the agent's allow list.
	ErrNotAllowed = errors.New("destination not in --allow-destination")
	// ErrNoAgent: the server has no agent for the destination.
	ErrNoAgent = errors.New("no agent available")
	// ErrDialTimeout: the agent did not answer the dial in time.
	ErrDialTimeout = errors.New("dial timeout")
	// ErrTooManyDials: the server already holds as many dials waiting for agents as it allows.
	ErrTooManyDials = errors.New("too many pending dials (--max-pending-dials)")
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
	{ErrNotAllowed, []string{"not in --allow-destination"}},
	{ErrNoAgent, []string{"no agent available"}},
	{ErrDialTimeout, []string{"dial timeout", "timed out waiting for backend dial"}},
	{ErrTooManyDials, []string{"--max-pending-dials"}},
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
