package apiproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	kubectlproxy "k8s.io/kubectl/pkg/proxy"
)

// apiBody is the size and shape of kube-apiserver's answer to GET /api.
var apiBody = []byte(`{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1:6443"}]}`)

// BenchmarkProxyHandler measures the whole local path of one request: a client on loopback, the filter and
// the reverse proxy, and TLS with a client certificate to a backend that answers like GET /api. The
// impl=kubectl case runs kubectl proxy's own handler (k8s.io/kubectl/pkg/proxy) in the same harness.
func BenchmarkProxyHandler(b *testing.B) {
	for _, bc := range []struct {
		name    string
		http2   bool
		kubectl bool
	}{{"impl=konnect/backend=http1", false, false}, {"impl=konnect/backend=http2", true, false}, {"impl=kubectl/backend=http2", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			p := newTestPKI(b)
			backend := p.newTLSBackend(b, "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(apiBody)
			}))
			_, rc := p.kubeconfig(b, backend.URL, "")
			f, err := DefaultFilterSpec().Compile()
			if err != nil {
				b.Fatal(err)
			}
			var h http.Handler
			if bc.kubectl {
				filter := &kubectlproxy.FilterServer{
					AcceptPaths:   kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultPathAcceptRE),
					RejectPaths:   kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultPathRejectRE),
					AcceptHosts:   kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultHostAcceptRE),
					RejectMethods: kubectlproxy.MakeRegexpArrayOrDie(kubectlproxy.DefaultMethodRejectRE),
				}
				h, err = kubectlproxy.NewProxyHandler("/", filter, rc, 0, false)
			} else {
				var kh *Handler
				kh, err = NewHandler(HandlerConfig{REST: rc, APIPrefix: "/", Filter: f, HTTP2: bc.http2})
				if kh != nil {
					b.Cleanup(kh.CloseIdleConnections)
				}
				h = kh
			}
			if err != nil {
				b.Fatal(err)
			}
			front := httptest.NewServer(h)
			b.Cleanup(front.Close)
			client := &http.Transport{MaxIdleConnsPerHost: 64}
			b.Cleanup(client.CloseIdleConnections)
			url := front.URL + "/api"
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodGet, url, nil)
					resp, err := client.RoundTrip(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		})
	}
}
