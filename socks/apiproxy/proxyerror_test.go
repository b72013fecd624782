package apiproxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"k8s.io/klog/v2"
)

// hopDown is a dial error of a route whose own hop failed, as sshdial.ServerError is.
type hopDown struct{}

func (hopDown) Error() string { return "SSH server u@h:22 is unreachable: connection refused" }
func (hopDown) Hop() string   { return "SSH server u@h:22" }

// refusedThere is a destination the hop reports as refused, as sshdial.TargetError is.
type refusedThere struct{}

func (refusedThere) Error() string {
	return "SSH server u@h:22 could not open api:6443: connect failed"
}
func (refusedThere) ReportedBy() string { return "SSH server u@h:22" }
func (refusedThere) Unwrap() error      { return syscall.ECONNREFUSED }

// TestProxyErrorsNameTheHop: a request the dialer could not carry is answered as konnect socks answers
// it: 503 when a hop of the route is down, 502 when the destination refused as the hop reports it, 504 on a
// timeout, with the error (which names the hop) as a Status's message; failures are logged at the default
// level, a burst of 5 and then one a second, the next line saying how many were left out.
func TestProxyErrorsNameTheHop(t *testing.T) {
	p := newTestPKI(t)
	_, rc := p.kubeconfig(t, "https://198.18.0.1:6443", "") // never dialled: Dial answers
	for _, c := range []struct {
		name string
		err  error
		code int
	}{
		{"hop down", hopDown{}, http.StatusServiceUnavailable},
		{"wrapped hop down", fmt.Errorf("dial: %w", hopDown{}), http.StatusServiceUnavailable},
		{"destination refused", refusedThere{}, http.StatusBadGateway},
		{"timeout", &net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}, http.StatusGatewayTimeout},
		{"other", fmt.Errorf("something else"), http.StatusBadGateway},
	} {
		t.Run(c.name, func(t *testing.T) {
			dial := func(context.Context, string, string) (net.Conn, error) { return nil, c.err }
			base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), Dial: dial})
			code, body := do(t, "GET", base+"/api", "", "")
			body = decodeStatus(t, code, body).Message
			if code != c.code || !strings.HasPrefix(body, "konnect proxy: ") || !strings.Contains(body, c.err.Error()) {
				t.Errorf("got %d %q, want %d and the error", code, body, c.code)
			}
		})
	}

	t.Run("logged, rate-limited", func(t *testing.T) {
		logs := harness.CaptureKlogAt(t, 0)
		dial := func(context.Context, string, string) (net.Conn, error) { return nil, hopDown{} }
		base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), Dial: dial})
		const n = 30
		for range n {
			if code, _ := do(t, "GET", base+"/api/v1/pods", "", ""); code != http.StatusServiceUnavailable {
				t.Fatalf("got %d, want 503", code)
			}
		}
		klog.Flush()
		lines := strings.Count(logs(), `"Proxying to the API server failed"`)
		// A burst of 5, and at most one more per second that the requests took.
		if lines < 5 || lines > 7 {
			t.Fatalf("%d failures logged %d lines, want the burst of 5 (and one a second):\n%s", n, lines, logs())
		}
		// A second later a failure is logged again, saying how many were left out.
		time.Sleep(1100 * time.Millisecond)
		do(t, "GET", base+"/api/v1/pods", "", "")
		klog.Flush()
		left := 0
		for _, m := range regexp.MustCompile(`suppressedBefore=(\d+)`).FindAllStringSubmatch(logs(), -1) {
			k, _ := strconv.Atoi(m[1])
			left += k
		}
		if left != n-lines {
			t.Errorf("the lines say %d were left out, want %d:\n%s", left, n-lines, logs())
		}
		for _, w := range []string{"answer=503", `path="/api/v1/pods"`, "SSH server u@h:22 is unreachable"} {
			if !strings.Contains(logs(), w) {
				t.Errorf("the log does not say %s:\n%s", w, logs())
			}
		}
	})
}
