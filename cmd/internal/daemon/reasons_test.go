package daemon

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/server/healthz"
)

// /readyz names why a check failed to someone on the host (loopback), and withholds it from everyone else,
// as kube-apiserver's public endpoint does.
func TestReadyzReasonOnLoopback(t *testing.T) {
	ready := []healthz.HealthChecker{
		healthz.NamedCheck("uds", func(*http.Request) error { return nil }),
		healthz.NamedCheck("tokenreview", func(*http.Request) error {
			return errors.New("TokenReview: Post \"https://127.0.0.1:6443/apis/authentication.k8s.io/v1/tokenreviews\":\ndial tcp 127.0.0.1:6443: connect: connection refused")
		}),
		healthz.NamedGroupedCheck("draining", "drain", func(*http.Request) error { return errors.New("draining") }),
	}
	mux := NewHealthMux(nil, ready, prometheus.NewRegistry())

	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, mux) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(ShutdownGrace + time.Second):
			t.Error("Serve did not return")
		}
	})
	base := "http://" + ln.Addr().String()

	const reason = `[-]tokenreview failed: TokenReview: Post "https://127.0.0.1:6443/apis/authentication.k8s.io/v1/tokenreviews": dial tcp 127.0.0.1:6443: connect: connection refused` + "\n"
	for _, path := range []string{"/readyz?verbose", "/readyz"} {
		code, body := get(t, base+path)
		if code != 500 || !strings.Contains(body, reason) || !strings.Contains(body, "[+]uds ok\n") ||
			!strings.Contains(body, "[-]draining failed: draining\n") || strings.Contains(body, "withheld") {
			t.Errorf("GET %s from loopback: %d\n%s\nwant 500 with the reasons:\n%s", path, code, body, reason)
		}
	}
	// exclude, also by group, still works through the wrapped checks.
	if code, body := get(t, base+"/readyz?exclude=tokenreview&exclude=drain"); code != 200 {
		t.Errorf("/readyz?exclude=tokenreview&exclude=drain: %d %q, want 200", code, body)
	}

	// From another address, the reason stays in the log.
	req := httptest.NewRequest(http.MethodGet, "/readyz?verbose", nil)
	req.RemoteAddr = "198.18.0.7:40000"
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if body := rec.Body.String(); rec.Code != 500 || !strings.Contains(body, "[-]tokenreview failed: reason withheld\n") || strings.Contains(body, "connection refused") {
		t.Errorf("GET /readyz?verbose from 198.18.0.7: %d\n%s\nwant the reason withheld", rec.Code, body)
	}
}
