package apiproxy

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki/field"
	kubectlproxy "k8s.io/kubectl/pkg/proxy"
)

// The defaults must be kubectl's, character for character, but for the node proxy's paths that
// --reject-paths adds to kubectl's.
func TestDefaultsAreKubectls(t *testing.T) {
	for _, c := range []struct{ name, ours, kubectl string }{
		{"accept-hosts", DefaultAcceptHosts, kubectlproxy.DefaultHostAcceptRE},
		{"accept-paths", DefaultAcceptPaths, kubectlproxy.DefaultPathAcceptRE},
		{"reject-paths", KubectlRejectPaths, kubectlproxy.DefaultPathRejectRE},
		{"reject-paths", DefaultRejectPaths, kubectlproxy.DefaultPathRejectRE + "," + NodeProxyRejectPaths},
		{"reject-methods", DefaultRejectMethods, kubectlproxy.DefaultMethodRejectRE},
	} {
		if c.ours != c.kubectl {
			t.Errorf("%s default = %q, kubectl's is %q", c.name, c.ours, c.kubectl)
		}
	}
}

func TestFilterAllows(t *testing.T) {
	def := mustFilter(t, DefaultFilterSpec())
	noPost := DefaultFilterSpec()
	noPost.RejectMethods = "^POST$,^PUT$,^PATCH$"
	readOnly := mustFilter(t, noPost)
	onlyCore := DefaultFilterSpec()
	onlyCore.AcceptPaths = "^/api/v1/.*"
	onlyCoreF := mustFilter(t, onlyCore)
	remote := DefaultFilterSpec()
	remote.AcceptHosts = `^proxy\.internal$`
	remoteF := mustFilter(t, remote)

	for _, c := range []struct {
		name               string
		f                  *Filter
		method, path, host string
		want               bool
	}{
		{"localhost", def, "GET", "/api", "localhost:8001", true},
		{"localhost without port", def, "GET", "/api", "localhost", true},
		{"127.0.0.1", def, "GET", "/api/v1/pods", "127.0.0.1:8001", true},
		{"bracketed ::1 without port", def, "GET", "/api", "[::1]", true},
		{"bracketed ::1 with port", def, "GET", "/api", "[::1]:8001", true},
		{"DNS rebinding host", def, "GET", "/api", "evil.example:8001", false},
		{"DNS rebinding host without port", def, "GET", "/api", "evil.example", false},
		{"host that only contains localhost", def, "GET", "/api", "localhost.evil.example", false},
		{"empty host", def, "GET", "/api", "", false},
		{"other loopback address", def, "GET", "/api", "127.0.0.2:8001", false},
		{"exec", def, "POST", "/api/v1/namespaces/default/pods/web/exec", "localhost:8001", false},
		{"exec with query", def, "GET", "/api/v1/namespaces/default/pods/web/exec", "localhost", false},
		{"attach", def, "POST", "/api/v1/namespaces/kube-system/pods/x/attach", "localhost", false},
		{"port-forward passes", def, "POST", "/api/v1/namespaces/default/pods/web/portforward", "localhost", true},
		{"logs pass", def, "GET", "/api/v1/namespaces/default/pods/web/log", "localhost", true},
		{"aggregated API", def, "GET", "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders", "localhost", true},
		{"POST allowed by default", def, "POST", "/api/v1/namespaces", "localhost", true},
		{"POST rejected", readOnly, "POST", "/api/v1/namespaces", "localhost", false},
		{"PATCH rejected", readOnly, "PATCH", "/api/v1/namespaces/x", "localhost", false},
		{"GET still allowed", readOnly, "GET", "/api/v1/namespaces", "localhost", true},
		{"accept-paths narrows", onlyCoreF, "GET", "/apis/apps/v1/deployments", "localhost", false},
		{"accept-paths passes", onlyCoreF, "GET", "/api/v1/pods", "localhost", true},
		{"custom host accepted", remoteF, "GET", "/api", "proxy.internal:8001", true},
		{"custom host: localhost no longer", remoteF, "GET", "/api", "localhost:8001", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.f.Allows(c.method, c.path, c.host); got != c.want {
				t.Errorf("Allows(%q, %q, %q) = %v, want %v", c.method, c.path, c.host, got, c.want)
			}
		})
	}
}

// Where kubectl's own filter and ours see the same request, they must decide the same; the only
// differences are the bracketed IPv6 loopback with a port, which kubectl refuses against its own default,
// and the node proxy's exec, which kubectl lets through (TestFilterRefusesNodeProxyExec).
func TestFilterAgreesWithKubectl(t *testing.T) {
	ours := mustFilter(t, DefaultFilterSpec())
	theirs := &kubectlproxy.FilterServer{
		AcceptPaths:   kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultPathAcceptRE),
		RejectPaths:   kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultPathRejectRE),
		AcceptHosts:   kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultHostAcceptRE),
		RejectMethods: kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultMethodRejectRE),
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	kubectl := theirs.HandlerFor(ok)
	for _, host := range []string{"localhost", "localhost:8001", "127.0.0.1:1", "[::1]", "evil.example", "evil.example:8001", "", "LOCALHOST"} {
		for _, path := range []string{"/api", "/api/v1/namespaces/a/pods/b/exec", "/api/v1/namespaces/a/pods/b/attach", "/apis/x/y", "/", "/api/v1/namespaces/a/pods/b/portforward"} {
			for _, method := range []string{"GET", "POST", ""} {
				r := httptest.NewRequest("GET", "http://x"+path, nil)
				r.Method, r.Host = method, host
				rec := httptest.NewRecorder()
				kubectl.ServeHTTP(rec, r)
				want := rec.Code == http.StatusNoContent
				if got := ours.Allows(method, path, host); got != want {
					t.Errorf("%s %s Host %q: ours %v, kubectl %v", method, path, host, got, want)
				}
			}
		}
	}
}

func TestFilterWrapAnswers403(t *testing.T) {
	f := mustFilter(t, DefaultFilterSpec())
	called := false
	h := f.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
	r := httptest.NewRequest("GET", "http://evil.example/api", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusForbidden || called {
		t.Fatalf("status %d, delegate called %v; want 403 and not called", rec.Code, called)
	}
	if st := decodeStatus(t, rec.Code, rec.Body.String()); st.Reason != "Forbidden" || !strings.Contains(st.Message, "evil.example") {
		t.Errorf("body %q", rec.Body.String())
	}
}

func TestFilterSpecCompileNamesTheField(t *testing.T) {
	for _, c := range []struct {
		spec  FilterSpec
		field string
	}{
		{FilterSpec{AcceptPaths: "("}, "AcceptPaths"},
		{FilterSpec{RejectPaths: "^/ok,[z-a]"}, "RejectPaths"},
		{FilterSpec{AcceptHosts: "*"}, "AcceptHosts"},
		{FilterSpec{RejectMethods: "^(GET"}, "RejectMethods"},
	} {
		_, err := c.spec.Compile()
		var fe *field.Error
		if !errors.As(err, &fe) || !slices.Contains(fe.Fields(), c.field) {
			t.Errorf("Compile(%+v) = %v, want an error naming %s", c.spec, err, c.field)
		}
	}
}

func TestParseRegexps(t *testing.T) {
	res, err := ParseRegexps("")
	if err != nil || len(res) != 0 {
		t.Fatalf("empty list: %v, %v", res, err)
	}
	res, err = ParseRegexps(`^a$,^b$`)
	if err != nil || len(res) != 2 || !res[1].MatchString("b") {
		t.Fatalf("two patterns: %v, %v", res, err)
	}
}

func mustFilter(t *testing.T, s FilterSpec) *Filter {
	t.Helper()
	f, err := s.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFilterOrigin(t *testing.T) {
	f := mustFilter(t, DefaultFilterSpec())
	for _, c := range []struct {
		origin string
		want   bool
	}{
		{"", true},
		{"http://localhost:8001", true},
		{"http://localhost:3000", true},
		{"http://127.0.0.1:8001", true},
		{"http://[::1]:8001", true},
		{"https://evil.example", false},
		{"http://evil.example:8001", false},
		{"http://localhost.evil.example", false},
		{"null", false},
		{"file://", false},
		{"%zz", false},
	} {
		if got := f.AllowsOrigin(c.origin); got != c.want {
			t.Errorf("AllowsOrigin(%q) = %v, want %v", c.origin, got, c.want)
		}
	}
}
