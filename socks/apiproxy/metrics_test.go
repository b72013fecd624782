package apiproxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/konnect-dev/konnect/test/harness"
)

// sample returns the value of the metric name whose labels include labels ("k=v"), or -1 if there is none.
func sample(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.Metric {
			have := map[string]string{}
			for _, l := range m.Label {
				have[l.GetName()] = l.GetValue()
			}
			for _, kv := range labels {
				k, v, _ := strings.Cut(kv, "=")
				if have[k] != v {
					continue next
				}
			}
			return value(m)
		}
	}
	return -1
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func TestServerMetrics(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	mux := http.NewServeMux()
	mux.Handle("/", echoBackend(&s))
	mux.Handle("/api/v1/namespaces/default/pods/web/portforward", upgradeBackend(t))
	backend := p.newTLSBackend(t, "", mux)
	_, rc := p.kubeconfig(t, backend.URL, "")
	reg := prometheus.NewRegistry()
	srv, _ := runServer(t, Config{HandlerConfig: HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())}, MaxConnections: 1, Registerer: reg})
	base := "http://" + srv.Addr().String()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	// The connection cap is 1: the client's previous connection may still hold the slot for a moment, and a
	// connection over the cap is answered 503 before its request is read.
	slotFree := func() {
		harness.EventuallyTrue(t, 5*time.Second, "the slot to be free", func() bool { return sample(t, reg, "konnect_proxy_client_connections") == 0 })
	}
	get := func(host string) int {
		slotFree()
		req, _ := http.NewRequest(http.MethodGet, base+"/api", nil)
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := get("localhost"); code != http.StatusOK {
		t.Fatalf("GET /api: %d", code)
	}
	if code := get("evil.example"); code != http.StatusForbidden {
		t.Fatalf("GET /api with Host evil.example: %d, want 403", code)
	}
	slotFree()

	// An upgraded connection holds the only slot while it is open: it is in flight, and another client is
	// refused.
	conn, _, resp := dialUpgrade(t, base, "/api/v1/namespaces/default/pods/web/portforward")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	if v := sample(t, reg, "konnect_proxy_requests_in_flight"); v != 1 {
		t.Errorf("requests in flight during the upgrade: %v, want 1", v)
	}
	if v := sample(t, reg, "konnect_proxy_client_connections"); v != 1 {
		t.Errorf("client connections during the upgrade: %v, want 1", v)
	}
	if resp, err := client.Get(base + "/api"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("a second client during the upgrade: %s, want 503", resp.Status)
		}
	}
	harness.EventuallyTrue(t, 5*time.Second, "the refusal to be counted", func() bool { return sample(t, reg, "konnect_proxy_refused_connections_total") == 1 })
	conn.Close()
	harness.EventuallyTrue(t, 5*time.Second, "the upgraded connection to end", func() bool { return sample(t, reg, "konnect_proxy_requests_in_flight") == 0 })

	for _, c := range []struct {
		code, method string
		want         float64
	}{{"200", "GET", 1}, {"403", "GET", 1}, {"101", "POST", 1}} {
		if v := sample(t, reg, "konnect_proxy_requests_total", "code="+c.code, "method="+c.method); v != c.want {
			t.Errorf("requests_total{code=%s,method=%s} = %v, want %v", c.code, c.method, v, c.want)
		}
	}
	if v := sample(t, reg, "konnect_proxy_response_header_seconds"); v != 3 {
		t.Errorf("response header latency observations: %v, want 3", v)
	}
}

// A proxy without a Registerer keeps no metrics and wraps nothing around its handler.
func TestServerWithoutMetrics(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	srv, _ := runServer(t, Config{HandlerConfig: HandlerConfig{REST: rc}})
	if srv.metrics != nil {
		t.Fatal("metrics kept without a Registerer")
	}
}

func TestProbe(t *testing.T) {
	p := newTestPKI(t)
	var unready atomic.Bool
	backend := p.newTLSBackend(t, "the-token", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if unready.Load() {
			http.Error(w, "[-]etcd failed: reason withheld\nreadyz check failed", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	_, rc := p.kubeconfig(t, backend.URL, "")
	h, err := NewHandler(HandlerConfig{REST: rc, APIPrefix: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Probe(ctx); err != nil {
		t.Fatalf("Probe of a ready API server: %v", err)
	}
	unready.Store(true)
	if err := h.Probe(ctx); err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "/readyz") {
		t.Fatalf("Probe of an API server that is not ready: %v, want an error naming 500 and /readyz", err)
	}

	// Without the kubeconfig's credentials the API server says 401, and the probe says so.
	_, anon := p.kubeconfig(t, backend.URL, "another-token")
	h2, err := NewHandler(HandlerConfig{REST: anon, APIPrefix: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.CloseIdleConnections()
	if err := h2.Probe(ctx); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("Probe with rejected credentials: %v, want an error naming 401", err)
	}

	// Nothing listening: the error names the address.
	addr := harness.ClosedAddr(t)
	_, gone := p.kubeconfig(t, "https://"+addr, "")
	h3, err := NewHandler(HandlerConfig{REST: gone, APIPrefix: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if err := h3.Probe(ctx); err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Probe with nothing listening: %v, want an error naming %s", err, addr)
	}
}
