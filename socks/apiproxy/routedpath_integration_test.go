//go:build integration

package apiproxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// sendRaw sends one request line as is over TCP and returns the response's status code.
func sendRaw(t *testing.T, addr, target string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %q: %v", target, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// sendGo sends target with Go's HTTP client, which keeps a valid escaped path as given; it reports false
// for a target the client refuses to send.
func sendGo(t *testing.T, base, target string) (int, bool) {
	t.Helper()
	req, err := http.NewRequest("GET", base+target, nil)
	if err != nil || req.URL.RequestURI() != target {
		return 0, false
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %q: %v", target, err)
	}
	resp.Body.Close()
	return resp.StatusCode, true
}

// sendCurl sends target with curl, told to leave the path as it is.
func sendCurl(t *testing.T, curl, base, target string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, curl, "--path-as-is", "--globoff", "-s", "-o", "/dev/null", "-w", "%{http_code}", base+target).Output()
	if err != nil {
		t.Fatalf("curl %q: %v", target, err)
	}
	var code int
	fmt.Sscan(string(out), &code)
	return code
}

// TestFilterRoutesPathsAsTheAPIServer drives the proxy, with its default filter and with an --accept-paths
// that admits one namespace, with real HTTP clients (Go's, curl, and raw request lines for what clients
// would not send) against a loopback backend that records every request it gets. No spelling of an exec
// request, nor of a path outside the accepted namespace, reaches the backend; paths that mean one thing
// reach it exactly as sent.
func TestFilterRoutesPathsAsTheAPIServer(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatal("curl is needed as an independent HTTP client: ", err)
	}
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	onlyPublic := DefaultFilterSpec()
	onlyPublic.AcceptPaths, onlyPublic.RejectPaths = `^/api/v1/namespaces/public/`, ""
	execRE := regexp.MustCompile(`^/api/.*/pods/.*/(exec|attach)`)
	public := regexp.MustCompile(`^/api/v1/namespaces/public/`)
	for _, c := range []struct {
		name    string
		spec    FilterSpec
		prefix  string
		allowed func(normalised string) bool
	}{
		{"default filter", DefaultFilterSpec(), "/", func(n string) bool { return !execRE.MatchString(n) }},
		{"default filter under --api-prefix", DefaultFilterSpec(), "/k8s/", func(n string) bool { return !execRE.MatchString(n) }},
		{"accept-paths", onlyPublic, "/", public.MatchString},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, c.spec), APIPrefix: c.prefix})
			addr := strings.TrimPrefix(base, "http://")
			pre := strings.TrimSuffix(c.prefix, "/")
			// Encoded, but decoded once it is exec itself, as kubectl proxy's filter also sees it.
			for _, path := range append(bypassPaths(), "/api/v1/namespaces/d/pods/p/ex%65c") {
				if c.allowed(hostileNormalise(path)) {
					continue // not an attempt against this filter
				}
				target := pre + path
				before := s.count()
				codes := map[string]int{"raw": sendRaw(t, addr, target)}
				if strings.HasPrefix(target, "/") { // curl takes a URL, and "\" cannot follow its port
					codes["curl"] = sendCurl(t, curl, base, target)
				}
				if code, ok := sendGo(t, base, target); ok {
					codes["go"] = code
				}
				for client, code := range codes {
					if code < 300 || code >= 500 {
						t.Errorf("%s: GET %s: %d, want a refusal", client, target, code)
					}
				}
				if n := s.count(); n != before {
					t.Errorf("GET %s reached the backend as %q", target, s.last(t).RequestURI)
				}
			}
			for _, path := range []string{
				"/api/v1/namespaces/public/pods",
				"/api/v1/namespaces/public/services/http:web:80/proxy/",
				"/api/v1/namespaces/public/services/http%3Aweb%3A80/proxy/a%20b?x=%2e%2e",
				"/api/v1/namespaces/public/configmaps/kube-root-ca.crt",
				"/api/v1/namespaces/public/pods?labelSelector=app%3Dweb,tier!%3Ddb&limit=5",
			} {
				if !c.allowed(hostileNormalise(path)) {
					t.Fatalf("the test is wrong: %s is not allowed", path)
				}
				target := pre + path
				for client, code := range map[string]int{"raw": sendRaw(t, addr, target), "curl": sendCurl(t, curl, base, target)} {
					if code != http.StatusOK {
						t.Errorf("%s: GET %s: %d, want 200", client, target, code)
					} else if got := s.last(t).RequestURI; got != path {
						t.Errorf("%s: GET %s reached the backend as %q, want %q", client, target, got, path)
					}
				}
			}
		})
	}
}
