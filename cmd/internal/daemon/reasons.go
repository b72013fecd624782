package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"

	"k8s.io/apiserver/pkg/server/healthz"
)

// withheld is what k8s.io/apiserver's health handler writes for a failed check, to everyone: kube-apiserver's
// /readyz is public, so it keeps the reasons for its log.
const withheld = " failed: reason withheld"

// reasonsOnLoopback serves the health handler h and, for a request from loopback, puts each failed check's
// reason where the handler wrote "reason withheld". Someone on the host itself (or, for a pod, in its network
// namespace) is the operator asking why a daemon is not ready; a probe or scraper from elsewhere still gets the
// reasons withheld. Every check in h must be wrapped by recordReasons.
func reasonsOnLoopback(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromLoopback(r) {
			h.ServeHTTP(w, r)
			return
		}
		reasons := map[string]string{}
		rec := &recorder{header: w.Header(), status: http.StatusOK}
		h.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), reasonsKey{}, reasons)))
		body := rec.body.Bytes()
		for name, reason := range reasons {
			body = bytes.ReplaceAll(body, []byte("[-]"+name+withheld+"\n"), []byte("[-]"+name+" failed: "+reason+"\n"))
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.status)
		_, _ = w.Write(body)
	})
}

func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

type reasonsKey struct{}

// recordReasons wraps checks so that each failure is noted in the request's context for reasonsOnLoopback.
func recordReasons(checks []healthz.HealthChecker) []healthz.HealthChecker {
	out := make([]healthz.HealthChecker, len(checks))
	for i, c := range checks {
		rc := reasonCheck{c}
		if g, ok := c.(healthz.GroupedHealthChecker); ok {
			out[i] = groupedReasonCheck{rc, g.GroupName()}
		} else {
			out[i] = rc
		}
	}
	return out
}

type reasonCheck struct{ healthz.HealthChecker }

func (c reasonCheck) Check(r *http.Request) error {
	err := c.HealthChecker.Check(r)
	if err != nil {
		if reasons, ok := r.Context().Value(reasonsKey{}).(map[string]string); ok {
			// One line, as the handler's format has one check per line.
			reasons[c.Name()] = strings.Join(strings.Fields(fmt.Sprint(err)), " ")
		}
	}
	return err
}

type groupedReasonCheck struct {
	reasonCheck
	group string
}

func (c groupedReasonCheck) GroupName() string { return c.group }

// recorder holds a response so that it can be rewritten before it is sent.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(status int)      { r.status = status }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
