package socks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
)

// replyCode maps a dial error to the SOCKS5 reply that tells the client what happened. Dialers that do not
// use the local network (an SSH channel) report the far side's failure by wrapping the matching errno.
func replyCode(err error) byte {
	var dnsErr *net.DNSError
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
	case errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return ReplyHostUnreachable
	default:
		return ReplyGeneralFailure
	}
}

// httpStatus maps a dial error to the status a proxy answers with.
func httpStatus(err error) int {
	if errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// dialReason is the short reason shown to an HTTP client.
func dialReason(target string, err error) string {
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
	case httpStatus(err) == http.StatusGatewayTimeout:
		why = "timed out"
	default:
		why = err.Error()
	}
	return fmt.Sprintf("cannot reach %s: %s", target, why)
}
