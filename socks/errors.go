package socks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"

	"github.com/konnect-dev/konnect/socks/internal/localproxy"
)

// replyCode maps a dial error to the SOCKS5 reply that tells the client what happened; a Dial's errors say
// which side failed (a hop of its route, or the destination as a hop reports it) as localproxy describes.
// Dialers that do not
// use the local network (an SSH channel) report the far side's failure by wrapping the matching errno.
func replyCode(err error) byte {
	var dnsErr *net.DNSError
	if _, ok := localproxy.FailedHop(err); ok {
		return ReplyGeneralFailure
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReplyConnectionRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return ReplyNetworkUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EHOSTDOWN):
		return ReplyHostUnreachable
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return ReplyNotAllowed
	case errors.As(err, &dnsErr):
		return ReplyHostUnreachable
	case errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, context.DeadlineExceeded), localproxy.IsTimeout(err):
		return ReplyHostUnreachable
	default:
		return ReplyGeneralFailure
	}
}

// dialReason is the short reason shown to an HTTP client.
func dialReason(target string, err error) string {
	if h, ok := localproxy.FailedHop(err); ok {
		return fmt.Sprintf("cannot reach %s: %v", target, h)
	}
	var why string
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		why = "connection refused"
	case errors.Is(err, syscall.ENETUNREACH):
		why = "network unreachable"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EHOSTDOWN):
		why = "host unreachable"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		why = "not allowed"
	case localproxy.HTTPStatus(err) == http.StatusGatewayTimeout:
		why = "timed out"
	default:
		why = err.Error()
	}
	if by, ok := localproxy.ReportedBy(err); ok {
		why += " (as reported by the " + by + ")"
	}
	return fmt.Sprintf("cannot reach %s: %s", target, why)
}

// logDialFailure logs a request whose dial failed, with what the client was answered.
func (s *Server) logDialFailure(kind string, remote net.Addr, dest string, answer any, err error) {
	s.failures.Log("Proxy request failed", "kind", kind, "remote", remote, "dest", dest, "answer", answer, "err", err)
}
