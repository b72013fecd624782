package apiproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// decodeStatus reads body as the metav1.Status the proxy answers its own errors with, failing the test
// when it is not one.
func decodeStatus(t *testing.T, code int, body string) metav1.Status {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("%d answer is not a Status: %v\n%s", code, err, body)
	}
	if st.Kind != "Status" || st.APIVersion != "v1" || st.Status != metav1.StatusFailure || int(st.Code) != code || st.Message == "" {
		t.Fatalf("%d answer: not a failure Status of its code: %+v", code, st)
	}
	return st
}

// Every answer the proxy gives itself is a Status with Content-Type application/json, whose message says
// why: client-go (so kubectl) then reports that message for every code, where for a plain-text 400 or 503
// it reports a generic sentence.
func TestOwnAnswersAreStatus(t *testing.T) {
	p := newTestPKI(t)
	_, rc := p.kubeconfig(t, "https://198.18.0.1:6443", "") // never dialled: Dial answers
	dial := func(context.Context, string, string) (net.Conn, error) { return nil, hopDown{} }
	def := mustFilter(t, DefaultFilterSpec())
	readOnly := mustFilter(t, FilterSpec{AcceptPaths: DefaultAcceptPaths, RejectPaths: DefaultRejectPaths, AcceptHosts: DefaultAcceptHosts, RejectMethods: "^POST$"})
	for _, c := range []struct {
		name         string
		filter       *Filter
		prefix       string
		method, path string
		header       http.Header
		code         int
		reason       metav1.StatusReason
		message      string
	}{
		{"hop down", def, "/", "GET", "/api/v1/namespaces", nil, 503, metav1.StatusReasonServiceUnavailable, "konnect proxy: SSH server u@h:22 is unreachable"},
		{"path refused", def, "/", "GET", "/api/v1/namespaces/default/services/http:foo:80/proxy/caf%C3%A9", nil, 400, metav1.StatusReasonBadRequest, "konnect proxy: path"},
		{"host refused", def, "/", "GET", "/api", http.Header{"Host": {"evil.example"}}, 403, metav1.StatusReasonForbidden, `konnect proxy: the request filter does not accept the Host header "evil.example" (--accept-hosts)`},
		{"origin refused", def, "/", "GET", "/api", http.Header{"Origin": {"http://evil.example"}}, 403, metav1.StatusReasonForbidden, `konnect proxy: the request filter does not accept a request from a page of origin "http://evil.example" (--accept-hosts)`},
		{"path rejected", def, "/", "POST", "/api/v1/namespaces/d/pods/p/exec", nil, 403, metav1.StatusReasonForbidden, "konnect proxy: the request filter refuses the path /api/v1/namespaces/d/pods/p/exec (--reject-paths)"},
		{"method rejected", readOnly, "/", "POST", "/api/v1/namespaces", nil, 403, metav1.StatusReasonForbidden, "konnect proxy: the request filter refuses the method POST (--reject-methods)"},
		{"path not accepted", mustFilter(t, FilterSpec{AcceptPaths: "^/apis", AcceptHosts: DefaultAcceptHosts}), "/", "GET", "/api", nil, 403, metav1.StatusReasonForbidden, "konnect proxy: the request filter does not accept the path /api (--accept-paths)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := startProxy(t, HandlerConfig{REST: rc, Filter: c.filter, APIPrefix: c.prefix, Dial: dial})
			req, err := http.NewRequest(c.method, base+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.header {
				req.Header[k] = v
			}
			req.Host = c.header.Get("Host")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			st := decodeStatus(t, resp.StatusCode, b.String())
			if resp.StatusCode != c.code || st.Reason != c.reason || !strings.HasPrefix(st.Message, c.message) {
				t.Errorf("got %d %s %q, want %d %s %q...", resp.StatusCode, st.Reason, st.Message, c.code, c.reason, c.message)
			}

			// client-go, as kubectl uses it, reports the message, not its generic sentence for the code. It
			// sends the URL's host, so the Host case is left to curl-like clients above.
			if c.header.Get("Host") != "" {
				return
			}
			cfg := &rest.Config{Host: base, ContentConfig: rest.ContentConfig{NegotiatedSerializer: scheme.Codecs.WithoutConversion()}}
			client, err := rest.UnversionedRESTClientFor(cfg)
			if err != nil {
				t.Fatal(err)
			}
			req2 := client.Verb(c.method).RequestURI(c.path)
			if o := c.header.Get("Origin"); o != "" {
				req2.SetHeader("Origin", o)
			}
			_, err = req2.Stream(context.Background())
			if err == nil || !strings.Contains(err.Error(), c.message) {
				t.Errorf("client-go reports %v, want %q", err, c.message)
			}
		})
	}
}
