package apiproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
	"k8s.io/client-go/tools/clientcmd"
)

// seen records what the backend received.
type seen struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (s *seen) add(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r.Clone(context.Background()))
}

func (s *seen) last(t *testing.T) *http.Request {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		t.Fatal("the backend received no request")
	}
	return s.reqs[len(s.reqs)-1]
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// echoBackend answers every request with its method, path and query, and its body.
func echoBackend(s *seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s %s?%s %s", r.Method, r.URL.Path, r.URL.RawQuery, body)
	})
}

// startProxy serves NewHandler(cfg) on loopback and returns its base URL.
func startProxy(t *testing.T, cfg HandlerConfig) string {
	t.Helper()
	if cfg.APIPrefix == "" {
		cfg.APIPrefix = "/"
	}
	h, err := NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	t.Cleanup(front.Close)
	return front.URL
}

func do(t *testing.T, method, url, host, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProxyAuthenticatesToTheBackend(t *testing.T) {
	p := newTestPKI(t)
	var s seen

	// An exec plugin, as cloud providers' kubeconfigs use, that hands out a token.
	plugin := filepath.Join(t.TempDir(), "credential-plugin")
	script := "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"from-plugin\"}}'\n"
	if err := os.WriteFile(plugin, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name  string
		token string
		exec  bool
		http2 bool
	}{
		{name: "client certificate", http2: false},
		{name: "client certificate over HTTP/2", http2: true},
		{name: "bearer token", token: "s3cret"},
		{name: "exec plugin", token: "from-plugin", exec: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			backend := p.newTLSBackend(t, c.token, echoBackend(&s))
			kcToken := c.token
			if c.exec {
				kcToken = ""
			}
			path, rc := p.kubeconfig(t, backend.URL, kcToken)
			if c.exec {
				// Replace the client certificate with the plugin.
				kc, err := clientcmd.LoadFromFile(path)
				if err != nil {
					t.Fatal(err)
				}
				u := kc.AuthInfos["test"]
				u.ClientCertificate, u.ClientKey = "", ""
				u.Exec = &clientcmdExecConfig{Command: plugin, APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: "Never"}
				if err := clientcmd.WriteToFile(*kc, path); err != nil {
					t.Fatal(err)
				}
				if rc, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
					t.Fatal(err)
				}
			}
			base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), HTTP2: c.http2})
			code, body := do(t, "GET", base+"/api/v1/namespaces?limit=5", "", "")
			if code != http.StatusOK || body != "GET /api/v1/namespaces?limit=5 " {
				t.Fatalf("got %d %q", code, body)
			}
			r := s.last(t)
			if r.Host != strings.TrimPrefix(backend.URL, "https://") {
				t.Errorf("backend saw Host %q, want its own address", r.Host)
			}
			if got := r.Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
				t.Errorf("X-Forwarded-For = %q, want 127.0.0.1", got)
			}
			if c.http2 && r.ProtoMajor != 2 {
				t.Errorf("backend saw %s, want HTTP/2", r.Proto)
			}
			if !c.http2 && r.ProtoMajor != 1 {
				t.Errorf("backend saw %s, want HTTP/1.1", r.Proto)
			}
		})
	}

	t.Run("backend refuses the proxy's own client without credentials", func(t *testing.T) {
		backend := p.newTLSBackend(t, "", echoBackend(&s))
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.pool}}}
		if resp, err := client.Get(backend.URL + "/api"); err == nil {
			resp.Body.Close()
			t.Fatalf("a request without a client certificate got %s; the test backend must require one", resp.Status)
		}
	})
}

func TestProxyForwarding(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	def := mustFilter(t, DefaultFilterSpec())
	readOnlySpec := DefaultFilterSpec()
	readOnlySpec.RejectMethods = "^POST$,^DELETE$"
	readOnly := mustFilter(t, readOnlySpec)

	www := t.TempDir()
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte("hello from www"), 0o600); err != nil {
		t.Fatal(err)
	}
	withPath := *rc
	withPath.Host = backend.URL + "/prefix"

	for _, c := range []struct {
		name         string
		cfg          HandlerConfig
		method, path string
		host         string
		body         string
		wantCode     int
		wantBody     string // prefix of the body, or of the message of the proxy's own Status
		reachBackend bool
	}{
		{name: "GET /api", cfg: HandlerConfig{Filter: def}, method: "GET", path: "/api", wantCode: 200, wantBody: "GET /api? ", reachBackend: true},
		{name: "POST body", cfg: HandlerConfig{Filter: def}, method: "POST", path: "/api/v1/namespaces", body: `{"kind":"Namespace"}`, wantCode: 200, wantBody: `POST /api/v1/namespaces? {"kind":"Namespace"}`, reachBackend: true},
		{name: "Host evil.example", cfg: HandlerConfig{Filter: def}, method: "GET", path: "/api", host: "evil.example", wantCode: 403, wantBody: `konnect proxy: the request filter does not accept the Host header "evil.example"`},
		{name: "exec path", cfg: HandlerConfig{Filter: def}, method: "POST", path: "/api/v1/namespaces/default/pods/web/exec?command=sh", wantCode: 403},
		{name: "attach path", cfg: HandlerConfig{Filter: def}, method: "POST", path: "/api/v1/namespaces/default/pods/web/attach", wantCode: 403},
		{name: "rejected method", cfg: HandlerConfig{Filter: readOnly}, method: "DELETE", path: "/api/v1/namespaces/x", wantCode: 403},
		{name: "allowed method", cfg: HandlerConfig{Filter: readOnly}, method: "PUT", path: "/api/v1/namespaces/x", wantCode: 200, reachBackend: true},
		{name: "filter disabled lets exec and any host through", cfg: HandlerConfig{}, method: "POST", path: "/api/v1/namespaces/default/pods/web/exec", host: "evil.example", wantCode: 200, reachBackend: true},
		{name: "api prefix stripped", cfg: HandlerConfig{Filter: def, APIPrefix: "/k8s-api/"}, method: "GET", path: "/k8s-api/api/v1/pods", wantCode: 200, wantBody: "GET /api/v1/pods? ", reachBackend: true},
		{name: "filter applies after the prefix is stripped", cfg: HandlerConfig{Filter: def, APIPrefix: "/k8s-api/"}, method: "POST", path: "/k8s-api/api/v1/namespaces/a/pods/b/exec", wantCode: 403},
		{name: "outside the api prefix", cfg: HandlerConfig{Filter: def, APIPrefix: "/k8s-api/"}, method: "GET", path: "/api/v1/pods", wantCode: 404},
		{name: "an /api prefix is kept, as kubectl does", cfg: HandlerConfig{Filter: def, APIPrefix: "/api/"}, method: "GET", path: "/api/v1/pods", wantCode: 200, wantBody: "GET /api/v1/pods? ", reachBackend: true},
		{name: "static files", cfg: HandlerConfig{Filter: def, StaticDir: www, StaticPrefix: "/static/"}, method: "GET", path: "/static/index.html", host: "evil.example", wantCode: 200, wantBody: "hello from www"},
		{name: "server path not appended", cfg: HandlerConfig{Filter: def, REST: &withPath}, method: "GET", path: "/api", wantCode: 200, wantBody: "GET /api? ", reachBackend: true},
		{name: "server path appended", cfg: HandlerConfig{Filter: def, REST: &withPath, AppendServerPath: true}, method: "GET", path: "/api", wantCode: 200, wantBody: "GET /prefix/api? ", reachBackend: true},
		{name: "escaped path kept", cfg: HandlerConfig{Filter: def}, method: "GET", path: "/api/v1/namespaces/a/services/http%3Aweb%3A80/proxy/", wantCode: 200, reachBackend: true},
		{name: "encoded slash refused", cfg: HandlerConfig{Filter: def}, method: "GET", path: "/api/v1/namespaces/a%2Fb", wantCode: 400, wantBody: "konnect proxy: path"},
		{name: "encoded dot segment refused", cfg: HandlerConfig{Filter: def}, method: "GET", path: "/%2e/api/v1/namespaces/d/pods/p/exec?command=id", wantCode: 400, wantBody: "konnect proxy: path"},
		{name: "filter disabled passes an encoded slash", cfg: HandlerConfig{}, method: "GET", path: "/api/v1/namespaces/a%2Fb", wantCode: 200, reachBackend: true},
		{name: "query kept as sent", cfg: HandlerConfig{Filter: def}, method: "GET", path: "/api/v1/pods?labelSelector=a%3Db;x&limit=5", wantCode: 200, wantBody: "GET /api/v1/pods?labelSelector=a%3Db;x&limit=5 ", reachBackend: true},
		{name: "escaped path kept under a prefix", cfg: HandlerConfig{Filter: def, APIPrefix: "/k8s/"}, method: "GET", path: "/k8s/api/v1/namespaces/a/services/http%3Aweb%3A80/proxy/", wantCode: 200, reachBackend: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.cfg.REST == nil {
				c.cfg.REST = rc
			}
			base := startProxy(t, c.cfg)
			before := s.count()
			code, body := do(t, c.method, base+c.path, c.host, c.body)
			if strings.HasPrefix(c.wantBody, "konnect proxy") {
				body = decodeStatus(t, code, body).Message
			}
			if code != c.wantCode || !strings.HasPrefix(body, c.wantBody) {
				t.Fatalf("got %d %q, want %d %q...", code, body, c.wantCode, c.wantBody)
			}
			if reached := s.count() > before; reached != c.reachBackend {
				t.Fatalf("request reached the backend: %v, want %v", reached, c.reachBackend)
			}
			if strings.HasPrefix(c.name, "escaped path kept") {
				if got := s.last(t).URL.RawPath; got != "/api/v1/namespaces/a/services/http%3Aweb%3A80/proxy/" {
					t.Errorf("backend saw raw path %q", got)
				}
			}
		})
	}
}

// TestProxyAsksForCompression: as kubectl proxy's transport does, the proxy asks the API server for gzip when
// the client did not (and decompresses for it), unless the kubeconfig or --disable-compression says not to;
// a client's own Accept-Encoding passes through.
func TestProxyAsksForCompression(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	plain := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	get := func(base, encoding string) string {
		req, _ := http.NewRequest(http.MethodGet, base+"/api", nil)
		if encoding != "" {
			req.Header.Set("Accept-Encoding", encoding)
		}
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return s.last(t).Header.Get("Accept-Encoding")
	}
	base := startProxy(t, HandlerConfig{REST: rc})
	if got := get(base, ""); got != "gzip" {
		t.Errorf("client without Accept-Encoding: the API server saw %q, want gzip", got)
	}
	if got := get(base, "identity"); got != "identity" {
		t.Errorf("client with Accept-Encoding identity: the API server saw %q", got)
	}
	off := *rc
	off.DisableCompression = true
	if got := get(startProxy(t, HandlerConfig{REST: &off}), ""); got != "" {
		t.Errorf("with compression disabled: the API server saw %q, want none", got)
	}
}

func TestProxyBackendDown(t *testing.T) {
	p := newTestPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, rc := p.kubeconfig(t, "https://"+addr, "")
	base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())})
	code, body := do(t, "GET", base+"/api", "", "")
	if code != http.StatusBadGateway || !strings.Contains(body, "konnect proxy") {
		t.Fatalf("got %d %q, want 502 naming konnect proxy", code, body)
	}
}

func TestNewHandlerRefusesBadPrefixes(t *testing.T) {
	p := newTestPKI(t)
	_, rc := p.kubeconfig(t, "https://127.0.0.1:1", "")
	for _, c := range []struct {
		cfg   HandlerConfig
		field string
	}{
		{HandlerConfig{APIPrefix: "api/"}, "APIPrefix"},
		{HandlerConfig{APIPrefix: "/{x}/"}, "APIPrefix"},
		{HandlerConfig{APIPrefix: "/", StaticDir: ".", StaticPrefix: "/a b/"}, "StaticPrefix"},
		{HandlerConfig{APIPrefix: "/x/", StaticDir: ".", StaticPrefix: "/x/"}, "StaticPrefix"},
	} {
		c.cfg.REST = rc
		_, err := NewHandler(c.cfg)
		var fe *field.Error
		if !errors.As(err, &fe) || fe.Fields()[0] != c.field {
			t.Errorf("NewHandler(%+v) = %v, want an error naming %s", c.cfg, err, c.field)
		}
	}
}

// A server URL that client-go cannot use is refused without quoting it: it may carry user:password.
func TestNewHandlerHidesServerPassword(t *testing.T) {
	p := newTestPKI(t)
	_, rc := p.kubeconfig(t, "https://127.0.0.1:1", "")
	for _, host := range []string{"https://dev:s3cret-pw@127.0.0.1:abc", "dev:s3cret-pw@127.0.0.1:6443/some/path"} {
		rc.Host = host
		_, err := NewHandler(HandlerConfig{REST: rc, APIPrefix: "/"})
		var fe *field.Error
		if err == nil || strings.Contains(err.Error(), "s3cret-pw") || !errors.As(err, &fe) || !slices.Equal(fe.Fields(), []string{"REST.Host"}) {
			t.Errorf("server %s: %v", host, err)
		}
	}
}

// A watch must reach the client event by event, not when the backend ends the response.
func TestProxyStreamsWatches(t *testing.T) {
	for _, http2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", http2), func(t *testing.T) {
			p := newTestPKI(t)
			next := make(chan struct{})
			done := make(chan struct{})
			backend := p.newTLSBackend(t, "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("watch") != "true" {
					http.Error(w, "not a watch", http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				rc := http.NewResponseController(w)
				for i := range 3 {
					fmt.Fprintf(w, "{\"type\":\"ADDED\",\"object\":{\"n\":%d}}\n", i)
					if err := rc.Flush(); err != nil {
						return
					}
					select {
					case <-next:
					case <-r.Context().Done():
						return
					}
				}
				close(done)
			}))
			_, rc := p.kubeconfig(t, backend.URL, "")
			base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), HTTP2: http2})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/pods?watch=true", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			for i := range 3 {
				// The backend holds event i+1 until this event has arrived.
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if want := fmt.Sprintf("{\"type\":\"ADDED\",\"object\":{\"n\":%d}}\n", i); line != want {
					t.Fatalf("event %d = %q, want %q", i, line, want)
				}
				next <- struct{}{}
			}
			<-done
		})
	}
}

// upgradeBackend switches to the protocol asked for (SPDY/3.1 or websocket, as kube-apiserver does for
// exec, attach and port-forward) and then echoes lines; it does not speak the protocols themselves, which
// the proxy only relays.
func upgradeBackend(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto := r.Header.Get("Upgrade")
		if proto == "" {
			http.Error(w, "upgrade required", http.StatusUpgradeRequired)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", proto)
		brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			brw.WriteString("echo: " + line)
			brw.Flush()
		}
	})
}

// dialUpgrade sends an upgrade request over a raw connection and returns the connection after the 101.
func dialUpgrade(t *testing.T, base, path string) (net.Conn, *bufio.Reader, *http.Response) {
	return dialUpgradeTo(t, base, path, "SPDY/3.1")
}

func dialUpgradeTo(t *testing.T, base, path, proto string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n", path, proto)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}

func TestProxyPassesUpgrades(t *testing.T) {
	for _, c := range []struct {
		proto string
		http2 bool
	}{{"SPDY/3.1", false}, {"SPDY/3.1", true}, {"websocket", false}, {"websocket", true}} {
		t.Run(fmt.Sprintf("%s/http2=%v", c.proto, c.http2), func(t *testing.T) {
			p := newTestPKI(t)
			backend := p.newTLSBackend(t, "", upgradeBackend(t))
			_, rc := p.kubeconfig(t, backend.URL, "")
			base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), HTTP2: c.http2})

			conn, br, resp := dialUpgradeTo(t, base, "/api/v1/namespaces/default/pods/web/portforward", c.proto)
			if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != c.proto {
				t.Fatalf("status %s, Upgrade %q; want 101 to %s", resp.Status, resp.Header.Get("Upgrade"), c.proto)
			}
			for _, msg := range []string{"hello\n", "second line\n"} {
				if _, err := io.WriteString(conn, msg); err != nil {
					t.Fatal(err)
				}
				got, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if got != "echo: "+msg {
					t.Fatalf("got %q", got)
				}
			}

			// The default filter stops the same upgrade on the exec path.
			_, _, resp = dialUpgradeTo(t, base, "/api/v1/namespaces/default/pods/web/exec", c.proto)
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("exec upgrade: status %s, want 403", resp.Status)
			}
		})
	}
}

// Spellings of the exec path that a client might hope the filter reads differently from the API server.
func TestFilterCannotBeBypassed(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	for _, prefix := range []string{"/", "/k8s/"} {
		base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), APIPrefix: prefix})
		pre := strings.TrimSuffix(prefix, "/")
		for _, path := range []string{
			"/api/v1/namespaces/a/pods/b/exec",
			"//api/v1/namespaces/a/pods/b/exec",
			"/api/v1/namespaces/a/pods/b/./exec",
			"/api/v1/namespaces/a/pods/x/../b/exec",
			"/api/v1/namespaces/a/pods/b/%65xec",
			"/api/v1/namespaces/a/pods/b%2Fexec",
			"/api/v1/namespaces/a/pods/b/exec/",
			"/api/v1/namespaces/a/pods/b/attach?stdin=true",
		} {
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			before := s.count()
			req, _ := http.NewRequest("POST", base+pre+path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || s.count() != before {
				t.Errorf("prefix %s: POST %s got %s and reached the backend: %v", prefix, path, resp.Status, s.count() != before)
			}
		}
	}
}

// connectProxy is an HTTP CONNECT proxy on loopback that counts the tunnels it opened.
func connectProxy(t *testing.T) (string, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var targets []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		mu.Lock()
		targets = append(targets, r.Host)
		mu.Unlock()
		up, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer up.Close()
		w.WriteHeader(http.StatusOK)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = brw.Flush()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, brw); done <- struct{}{} }()
		go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
		<-done
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), targets...)
	}
}

// The kubeconfig's proxy-url is honoured, for plain requests and for upgrades; an injected dialer takes
// precedence over it.
func TestProxyHonoursProxyURL(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	mux := http.NewServeMux()
	mux.Handle("/api/v1/namespaces/a/pods/b/portforward", upgradeBackend(t))
	mux.Handle("/", echoBackend(&s))
	backend := p.newTLSBackend(t, "", mux)
	backendHost := strings.TrimPrefix(backend.URL, "https://")
	proxyURL, targets := connectProxy(t)
	path, _ := p.kubeconfig(t, backend.URL, "")
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kc.Clusters["test"].ProxyURL = proxyURL
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}

	for _, http2 := range []bool{false, true} {
		before := len(targets())
		base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), HTTP2: http2})
		if code, body := do(t, "GET", base+"/api", "", ""); code != 200 {
			t.Fatalf("http2=%v: GET /api via proxy-url: %d %q", http2, code, body)
		}
		conn, br, resp := dialUpgrade(t, base, "/api/v1/namespaces/a/pods/b/portforward")
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("http2=%v: upgrade via proxy-url: %s", http2, resp.Status)
		}
		_, _ = io.WriteString(conn, "x\n")
		if line, err := br.ReadString('\n'); err != nil || line != "echo: x\n" {
			t.Fatalf("http2=%v: upgrade echo: %q %v", http2, line, err)
		}
		// With HTTP/2 the upgrade needs its own HTTP/1.1 connection, which must also use proxy-url.
		want := 1
		if http2 {
			want = 2
		}
		got := targets()[before:]
		if len(got) != want {
			t.Fatalf("http2=%v: CONNECTs %v, want %d to %s", http2, got, want, backendHost)
		}
		for _, g := range got {
			if g != backendHost {
				t.Fatalf("http2=%v: CONNECT to %s, want %s", http2, g, backendHost)
			}
		}
	}

	// An injected dialer decides the route: proxy-url is not used.
	before := len(targets())
	var dialed []string
	var mu sync.Mutex
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec()), Dial: dial})
	if code, body := do(t, "GET", base+"/api", "", ""); code != 200 {
		t.Fatalf("GET /api with a dialer: %d %q", code, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(targets()) != before || len(dialed) != 1 || dialed[0] != backendHost {
		t.Fatalf("with a dialer: CONNECTs %d (was %d), dialed %v; want no CONNECT and one dial to %s", len(targets()), before, dialed, backendHost)
	}
}

// A page from another origin cannot use the proxy through the user's browser: not with a cross-origin
// POST and not with a WebSocket to a service proxy, both of which carry "Host: localhost".
func TestProxyRefusesForeignOrigins(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	mux := http.NewServeMux()
	mux.Handle("/api/v1/namespaces/default/services/web:80/proxy/ws", upgradeBackend(t))
	mux.Handle("/", echoBackend(&s))
	backend := p.newTLSBackend(t, "", mux)
	_, rc := p.kubeconfig(t, backend.URL, "")
	base := startProxy(t, HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())})
	addr := strings.TrimPrefix(base, "http://")

	handshake := func(origin string) int {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "GET /api/v1/namespaces/default/services/web:80/proxy/ws HTTP/1.1\r\nHost: localhost:8001\r\n"+
			"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"+
			"Origin: %s\r\n\r\n", origin)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	if code := handshake("https://evil.example"); code != http.StatusForbidden {
		t.Errorf("WebSocket from https://evil.example: %d, want 403", code)
	}
	if code := handshake("http://localhost:8001"); code != http.StatusSwitchingProtocols {
		t.Errorf("WebSocket from the proxy's own origin: %d, want 101", code)
	}

	post := func(origin string) int {
		req, _ := http.NewRequest("POST", base+"/api/v1/namespaces/default/configmaps", strings.NewReader("x"))
		req.Header.Set("Origin", origin)
		req.Header.Set("Content-Type", "text/plain")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	before := s.count()
	if code := post("https://evil.example"); code != http.StatusForbidden || s.count() != before {
		t.Errorf("cross-origin POST: %d, reached the backend %v; want 403 and not reached", code, s.count() != before)
	}
	if code := post("http://127.0.0.1:8001"); code != http.StatusOK {
		t.Errorf("same-origin POST: %d, want 200", code)
	}
}
