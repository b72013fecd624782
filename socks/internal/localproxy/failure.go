package localproxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
)

// A Dial whose route has hops of its own (an SSH server) tells the proxy which side failed through two
// optional methods on its errors, found with errors.As (FailedHop, ReportedBy):
//
//   - Hop() string: the route failed before the destination, at the hop named (an SSH server that is down).
//     The client is told that the proxy itself cannot serve: SOCKS5 reply 0x01, "general SOCKS server
//     failure" (RFC 1928 codes 0x03 to 0x05 describe the destination, which was never tried), and HTTP 503
//     Service Unavailable. The error's text, which names the hop, is the HTTP body.
//   - ReportedBy() string: the destination failed, as the hop named reports it (the SSH server could not
//     connect). The reply describes the destination (0x05 connection refused, HTTP 502, ...), and the HTTP
//     body says who reported it.
type (
	// HopFailure is a dial error of a route whose hop failed.
	HopFailure interface{ Hop() string }
	// ReportedFailure is a destination's failure as a hop reports it.
	ReportedFailure interface{ ReportedBy() string }
)

// FailedHop finds the HopFailure in err's chain, if any.
func FailedHop(err error) (HopFailure, bool) {
	var h HopFailure
	return h, errors.As(err, &h)
}

// ReportedBy names the hop that reported the destination's failure in err's chain, if any.
func ReportedBy(err error) (string, bool) {
	var r ReportedFailure
	if errors.As(err, &r) {
		return r.ReportedBy(), true
	}
	return "", false
}

// IsTimeout reports whether err is a net.Error that timed out.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// HTTPStatus maps a dial error to the status a proxy answers with: 503 when a hop of the proxy's own route
// is down (an error with a Hop method, see above), 504 when the destination did not answer in time, else
// 502.
func HTTPStatus(err error) int {
	if _, ok := FailedHop(err); ok {
		return http.StatusServiceUnavailable
	}
	if errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, context.DeadlineExceeded) || IsTimeout(err) {
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// Failed requests are logged at the default level, but a client retrying in a loop against a dead
// destination must not flood the log: a burst of failureLogBurst lines, then one per failureLogEvery, and
// the next line that is written says how many were left out.
const (
	failureLogBurst = 5
	failureLogEvery = time.Second
)

// FailureLog is the one rate limit of konnect's local proxies on logging failed requests (see
// failureLogBurst): socks.Server's and apiproxy's each keep one. The zero value is ready to use.
type FailureLog struct {
	// Logger receives the lines; the zero Logger discards them.
	Logger logr.Logger

	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed int
}

// allow reports whether a line may be written now, and how many were left out before it.
func (l *FailureLog) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last.IsZero() {
		l.tokens = failureLogBurst
	} else {
		l.tokens = min(failureLogBurst, l.tokens+float64(now.Sub(l.last))/float64(failureLogEvery))
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return false, 0
	}
	l.tokens--
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// Log writes msg with the key/value pairs kv at the default level, unless the limit leaves it out; a line
// written after some were left out says how many ("suppressedBefore").
func (l *FailureLog) Log(msg string, kv ...any) {
	ok, suppressed := l.allow(time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		kv = append(kv, "suppressedBefore", suppressed)
	}
	l.Logger.Info(msg, kv...)
}
