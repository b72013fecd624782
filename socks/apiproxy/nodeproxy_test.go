//go:build integration

package apiproxy

import (
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// TestFilterRefusesNodeProxyExec drives the proxy with its default filter, with Go's HTTP client, curl and a
// raw SPDY upgrade, against a loopback backend that records every request: exec, attach, run, portForward,
// checkpoint and debug/flags of the kubelet API through a node's proxy subresource, which kube-apiserver
// forwards to the kubelet and kubectl proxy's default lets through, get 403 (or 400 for a spelling a hop
// could read another way) and never reach it, also under --api-prefix; the node proxy's other paths
// (debug/pprof among them), and pod port-forward (as with kubectl), still pass.
func TestFilterRefusesNodeProxyExec(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatal("curl is needed as an independent HTTP client: ", err)
	}
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	refused := []string{
		"/api/v1/nodes/w1/proxy/exec/default/web/app?command=id",
		"/api/v1/nodes/w1/proxy/exec/default/web/0a1b2c3d/app?command=id",
		"/api/v1/nodes/w1/proxy/attach/default/web/app?stdin=true",
		"/api/v1/nodes/w1/proxy/run/default/web/app?cmd=id",
		"/api/v1/nodes/w1/proxy/portForward/default/web?port=22",
		"/api/v1/nodes/w1/proxy/exec",
		"/api/v1/nodes/w1/proxy/exec/",
		"/api/v1/nodes/w1:10250/proxy/exec/default/web/app",
		"/api/v1/nodes/https:w1:10250/proxy/run/default/web/app",
		"/api/v1/nodes/w1%3A10250/proxy/exec/default/web/app",
		"/api/v1/nodes/w1/proxy/%65xec/default/web/app",
		"/api/v1/nodes/w1/proxy/port%46orward/default/web",
		"/api/v1/nodes/w1/proxy/exec%2Fdefault/web/app",
		"/api/v1/nodes/w1/proxy//exec/default/web/app",
		"/api/v1/nodes/w1/proxy/./exec/default/web/app",
		"/api/v1/nodes/w1/proxy/checkpoint/default/web/app",
		"/api/v1/nodes/w1:10250/proxy/checkpoint/default/web/app?timeout=10",
		"/api/v1/nodes/w1/proxy/%63heckpoint/default/web/app",
		"/api/v1/nodes/w1/proxy/debug/flags/v",
		"/api/v1/nodes/w1/proxy/debug/%66lags/v",
		"/api/v1/nodes/w1/proxy/debug//flags/v",
		"/api/v1/nodes/w1/proxy/%2e/exec/default/web/app",
		"/api/v1/nodes/w1/./proxy/exec/default/web/app",
	}
	allowed := []string{
		"/api/v1/nodes/w1/proxy/pods",
		"/api/v1/nodes/w1/proxy/stats/summary",
		"/api/v1/nodes/w1/proxy/containerLogs/default/web/app",
		"/api/v1/nodes/w1/proxy/configz",
		"/api/v1/nodes/w1/proxy/executor",
		"/api/v1/nodes/w1/proxy/debug/pprof/heap",
		"/api/v1/nodes/w1/proxy/checkpoints",
		"/api/v1/nodes/w1/proxy/",
		"/api/v1/nodes/exec",
		"/api/v1/namespaces/default/pods/web/portforward",
	}
	for _, prefix := range []string{"/", "/k8s/"} {
		base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), APIPrefix: prefix})
		addr := strings.TrimPrefix(base, "http://")
		pre := strings.TrimSuffix(prefix, "/")
		for _, path := range refused {
			target := pre + path
			before := s.count()
			codes := map[string]int{"raw": sendRaw(t, addr, target), "curl": sendCurl(t, curl, base, target)}
			if code, ok := sendGo(t, base, target); ok {
				codes["go"] = code
			}
			for client, code := range codes {
				if code != http.StatusForbidden && code != http.StatusBadRequest && code != http.StatusTemporaryRedirect && code != http.StatusMovedPermanently {
					t.Errorf("%s: GET %s: %d, want a refusal", client, target, code)
				}
			}
			// A WebSocket or SPDY upgrade, as kubectl exec sends it.
			if _, _, resp := dialUpgrade(t, base, target); resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusTemporaryRedirect && resp.StatusCode != http.StatusMovedPermanently {
				t.Errorf("upgrade: POST %s: %d, want a refusal", target, resp.StatusCode)
			}
			if n := s.count(); n != before {
				t.Errorf("%s reached the backend as %q", target, s.last(t).RequestURI)
			}
		}
		for _, path := range allowed {
			target := pre + path
			for client, code := range map[string]int{"raw": sendRaw(t, addr, target), "curl": sendCurl(t, curl, base, target)} {
				if code != http.StatusOK {
					t.Errorf("%s: GET %s: %d, want 200", client, target, code)
				} else if got := s.last(t).RequestURI; got != path {
					t.Errorf("%s: GET %s reached the backend as %q, want %q", client, target, got, path)
				}
			}
		}
	}
}
