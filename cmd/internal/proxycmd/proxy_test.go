package proxycmd

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/sshflags"
	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/socks/apiproxy"
	"github.com/konnect-dev/konnect/test/harness"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(harness.SpawnerFunc))
}

// kubectlProxyFlags is kubectl proxy's flag set as k8s.io/kubectl v0.36.1 (pkg/cmd/proxy/proxy.go)
// registers it: name, shorthand, default.
var kubectlProxyFlags = []struct{ name, short, def string }{
	{"www", "w", ""},
	{"www-prefix", "P", "/static/"},
	{"api-prefix", "", "/"},
	{"accept-paths", "", `^.*`},
	{"reject-paths", "", `^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach`},
	{"accept-hosts", "", `^localhost$,^127\.0\.0\.1$,^\[::1\]$`},
	{"reject-methods", "", `^$`},
	{"port", "p", "8001"},
	{"address", "", "127.0.0.1"},
	{"disable-filter", "", "false"},
	{"unix-socket", "u", ""},
	{"keepalive", "", "0s"},
	{"append-server-path", "", "false"},
}

// kubectlGlobalFlags are kubectl's global flags that select and override the kubeconfig; konnect proxy
// takes them too (all but --request-timeout, which a proxy does not apply).
var kubectlGlobalFlags = []string{
	"kubeconfig", "context", "cluster", "user", "namespace", "server", "token", "as", "as-group", "as-uid",
	"username", "password", "client-certificate", "client-key", "certificate-authority",
	"insecure-skip-tls-verify", "tls-server-name", "proxy-url", "disable-compression", "v", "vmodule",
	// Taken and ignored: they mean nothing to a proxy.
	"request-timeout", "cache-dir", "profile", "profile-output", "log-flush-frequency", "match-server-version", "warnings-as-errors",
}

// konnectDefaults are the kubectl proxy flags whose default konnect changes on purpose, and how: the
// kubelet's exec, attach, run and portForward through the node proxy are refused too.
var konnectDefaults = map[string]string{
	"reject-paths": `^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach,` + apiproxy.NodeProxyRejectPaths,
}

// kubectlDefault is what konnect's default for kubectl's flag name must be, given kubectl's.
func kubectlDefault(name, kubectls string) string {
	if d, ok := konnectDefaults[name]; ok {
		if !strings.HasPrefix(d, kubectls+",") {
			return "kubectl's " + kubectls + " followed by konnect's additions"
		}
		return d
	}
	return kubectls
}

// konnectFlags are konnect's additions; a new flag has to be added here on purpose.
// The SSH flags, shared with konnect socks, are checked where they are defined.
var konnectFlags = []string{"allow-remote", "max-connections", "backend-http2", "via", "health-listen", "help"}

func TestFlagsMatchKubectlProxy(t *testing.T) {
	fs := NewProxyCommand().Flags()
	known := map[string]bool{}
	for _, f := range kubectlProxyFlags {
		known[f.name] = true
		got := fs.Lookup(f.name)
		if got == nil {
			t.Errorf("--%s: missing", f.name)
			continue
		}
		if got.Shorthand != f.short {
			t.Errorf("--%s: shorthand %q, kubectl has %q", f.name, got.Shorthand, f.short)
		}
		if want := kubectlDefault(f.name, f.def); got.DefValue != want {
			t.Errorf("--%s: default %q, want %q (kubectl has %q)", f.name, got.DefValue, want, f.def)
		}
	}
	for _, n := range append(append([]string{}, kubectlGlobalFlags...), konnectFlags...) {
		known[n] = true
	}
	sshFlags := pflag.NewFlagSet("ssh", pflag.ContinueOnError)
	sshflags.NewFlags().AddFlags(sshFlags)
	sshFlags.VisitAll(func(f *pflag.Flag) { known[f.Name] = true })
	NewProxyCommand().Flags().VisitAll(func(f *pflag.Flag) {
		if !known[f.Name] {
			t.Errorf("--%s is neither a kubectl flag nor a listed konnect addition", f.Name)
		}
	})
	for _, n := range kubectlGlobalFlags {
		if fs.Lookup(n) == nil {
			t.Errorf("--%s: missing", n)
		}
	}
	if f := fs.Lookup("server"); f == nil || f.Shorthand != "s" {
		t.Errorf("--server has no -s, as kubectl's has")
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string // "" means valid
	}{
		{"defaults", nil, ""},
		{"port 0", []string{"--port=0"}, ""},
		{"unix socket", []string{"--unix-socket=/tmp/x.sock"}, ""},
		{"unix socket and port", []string{"-u", "/tmp/x.sock", "-p", "9000"}, "cannot set --unix-socket and --port at the same time"},
		{"port out of range", []string{"--port=70000"}, "--port"},
		{"negative port", []string{"--port=-1"}, "--port"},
		{"address not an IP", []string{"--address=example.com"}, "--address"},
		{"non-loopback address", []string{"--address=0.0.0.0"}, "--allow-remote"},
		{"non-loopback address names the port", []string{"--address=0.0.0.0", "--port=9000"}, "0.0.0.0:9000"},
		{"non-loopback address allowed", []string{"--address=0.0.0.0", "--allow-remote"}, ""},
		{"IPv6 loopback", []string{"--address=::1"}, ""},
		{"bad accept-hosts", []string{"--accept-hosts=("}, "--accept-hosts"},
		{"bad reject-paths", []string{"--reject-paths=[z-a]"}, "--reject-paths"},
		{"bad accept-paths", []string{"--accept-paths=("}, "--accept-paths"},
		{"bad reject-methods", []string{"--reject-methods=^(GET"}, "--reject-methods"},
		{"bad pattern ignored with the filter off", []string{"--accept-hosts=(", "--disable-filter"}, ""},
		{"max connections", []string{"--max-connections=0"}, "--max-connections"},
		{"health endpoint on loopback", []string{"--health-listen=127.0.0.1:8002"}, ""},
		{"non-loopback health endpoint", []string{"--health-listen=0.0.0.0:8002"}, "--health-listen"},
		{"health endpoint not host:port", []string{"--health-listen=8002"}, "--health-listen"},
		// SSH flags without --via would be silently ignored.
		{"jump without via", []string{"--jump=bastion.example"}, "--jump: applies only with --via"},
		{"SSH flags without via", []string{"-i", "/nonexistent", "--ssh-port=2222", "--accept-new"}, "--ssh-port, --identity, --accept-new: applies only with --via"},
		// ssh's own flags: -N and -C belong to --via, -q to the whole command.
		{"ssh -N without via", []string{"-N"}, "--no-command: applies only with --via"},
		{"ssh -N -C with via", []string{"-N", "-C", "--via=bastion"}, ""},
		{"ssh -q without via", []string{"-q"}, ""},
		{"ssh -f with via", []string{"-f", "--via=bastion"}, "--via: -f (--background): konnect does not go to the background"},
		{"ssh -o with via", []string{"-o", "User=alice", "--via=bastion"}, "--via: -o (--ssh-option \"User=alice\"): not supported; use --ssh-user (-l)"},
		{"SSH flags with via", []string{"--via=bastion.example", "--jump=j.example", "--ssh-config=none"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// backend is an HTTPS server that requires a client certificate from its own CA or a bearer token, as
// kube-apiserver does, and answers GET /api.
type backend struct {
	url                       string
	caFile, certFile, keyFile string
	token                     string
	unready                   atomic.Bool // /readyz answers 500
}

func newBackend(t *testing.T) *backend {
	t.Helper()
	dir := t.TempDir()
	ca := pkitest.NewCA(t, "test-ca")
	enc := base64.RawURLEncoding.EncodeToString
	jwt := enc([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + enc([]byte(`{"iss":"https://issuer.invalid","exp":4102444800}`)) + "." + enc([]byte("signature"))
	b := &backend{caFile: ca.WriteCert(t, filepath.Join(dir, "ca.crt")), token: jwt}
	b.certFile, b.keyFile = ca.Issue(t, pkitest.Spec{CN: "jane", Hosts: []string{"127.0.0.1"}, Client: true}).Write(t, dir, "client")
	serving := ca.Server(t, "apiserver", "127.0.0.1")

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		certOK := r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == "jane"
		if !certOK && r.Header.Get("Authorization") != "Bearer "+b.token {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/readyz" && b.unready.Load() {
			http.Error(w, "[-]etcd failed: reason withheld\nreadyz check failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kind":"APIVersions","versions":["v1"],"path":%q}`, r.URL.Path)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serving.TLS()}, ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

// kubeconfig writes a kubeconfig with three contexts: "cert" (client certificate), "token", and "oidc"
// (client-go's oidc auth-provider, holding the token as its ID token: it expires in 2100, so the plugin
// never asks the issuer for a new one).
func (b *backend) kubeconfig(t *testing.T, current string) string {
	t.Helper()
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: cert
  user:
    client-certificate: %s
    client-key: %s
- name: token
  user:
    token: %[5]s
- name: oidc
  user:
    auth-provider:
      name: oidc
      config:
        client-id: konnect-test
        idp-issuer-url: https://issuer.invalid
        id-token: %[5]s
contexts:
- name: cert
  context: {cluster: test, user: cert}
- name: token
  context: {cluster: test, user: token}
- name: oidc
  context: {cluster: test, user: oidc}
current-context: %[6]s
`, b.url, b.caFile, b.certFile, b.keyFile, b.token, current)
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// runCommand runs `konnect proxy args...` in-process until the returned stop is called, and returns the
// address from its "Starting to serve on" line.
func runCommand(t *testing.T, args ...string) (addr string, stop func() error) {
	t.Helper()
	cmd := NewProxyCommand()
	out := &harness.SyncBuffer{}
	cmd.SetOut(out)
	cmd.SetErr(out)
	cmd.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- cmd.ExecuteContext(ctx) }()
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-errc:
			case <-time.After(20 * time.Second):
				result = errors.New("the command did not stop within 20s")
			}
		})
		return result
	}
	t.Cleanup(func() { _ = stop() })
	re := regexp.MustCompile(`Starting to serve on (\S+)\n`)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1], stop
		}
		select {
		case err := <-errc:
			t.Fatalf("the command ended before serving: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("no \"Starting to serve on\" line within 10s:\n%s", out.String())
	return "", nil
}

func get(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if host != "" {
		req.Host = host
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestCommandProxiesWithKubeconfigCredentials(t *testing.T) {
	b := newBackend(t)
	kc := b.kubeconfig(t, "cert")
	for _, c := range []struct {
		name string
		args []string
	}{
		{"client certificate", []string{"--kubeconfig", kc}},
		{"token context", []string{"--kubeconfig", kc, "--context", "token"}},
		{"token over HTTP/2", []string{"--kubeconfig", kc, "--context", "token", "--backend-http2"}},
		{"KUBECONFIG and an API prefix", []string{"--api-prefix", "/k8s-api"}},
		{"kubectl's global flags", []string{"--kubeconfig", kc, "-s", b.url, "--request-timeout=5s", "--match-server-version", "--cache-dir=/nonexistent"}},
		{"auth-provider oidc", []string{"--kubeconfig", kc, "--context", "oidc"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", kc)
			addr, stop := runCommand(t, append([]string{"--port=0"}, c.args...)...)
			prefix := ""
			if strings.Contains(c.name, "prefix") {
				prefix = "/k8s-api"
			}
			code, body := get(t, "http://"+addr+prefix+"/api", "")
			if code != 200 || !strings.Contains(body, `"path":"/api"`) {
				t.Fatalf("GET /api: %d %q", code, body)
			}
			if code, _ := get(t, "http://"+addr+prefix+"/api", "evil.example"); code != http.StatusForbidden {
				t.Fatalf("Host evil.example: %d, want 403", code)
			}
			if code, _ := get(t, "http://"+addr+prefix+"/api/v1/namespaces/default/pods/web/exec", ""); code != http.StatusForbidden {
				t.Fatalf("exec: %d, want 403", code)
			}
			if err := stop(); err != nil {
				t.Fatalf("command returned %v after cancel", err)
			}
		})
	}
}

// --health-listen serves kube-style health endpoints, ready while the API server answers its /readyz, and the
// proxy's metrics.
func TestCommandHealthEndpoints(t *testing.T) {
	b := newBackend(t)
	health := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	addr, stop := runCommand(t, "--kubeconfig", b.kubeconfig(t, "cert"), "--port=0", "--health-listen", health)
	if code, _ := get(t, "http://"+addr+"/api", ""); code != http.StatusOK {
		t.Fatalf("GET /api: %d", code)
	}
	if code, _ := get(t, "http://"+addr+"/api", "evil.example"); code != http.StatusForbidden {
		t.Fatalf("Host evil.example: %d, want 403", code)
	}
	for _, path := range []string{"/livez?verbose", "/readyz?verbose", "/healthz?verbose"} {
		code, body := get(t, "http://"+health+path, "")
		if code != http.StatusOK || !strings.Contains(body, "[+]ping ok") {
			t.Errorf("GET %s: %d %q", path, code, body)
		}
		if path == "/readyz?verbose" && !strings.Contains(body, "[+]apiserver ok") {
			t.Errorf("GET %s: no apiserver check: %q", path, body)
		}
	}
	_, metrics := get(t, "http://"+health+"/metrics", "")
	for _, want := range []string{
		`konnect_proxy_requests_total{code="200",method="GET"} 1`,
		`konnect_proxy_requests_total{code="403",method="GET"} 1`,
		"konnect_proxy_client_connections ",
		"go_goroutines ",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}

	b.unready.Store(true)
	code, body := get(t, "http://"+health+"/readyz?verbose", "")
	// From loopback the reason is shown (daemon.NewHealthMux).
	if code != http.StatusInternalServerError || !strings.Contains(body, "[-]apiserver failed: the API server at ") {
		t.Errorf("/readyz with the API server not ready: %d %q", code, body)
	}
	if code, body := get(t, "http://"+health+"/readyz/apiserver", ""); code != http.StatusInternalServerError || !strings.Contains(body, "500") {
		t.Errorf("/readyz/apiserver with the API server not ready: %d %q, want 500 naming the API server's answer", code, body)
	}
	if code, _ := get(t, "http://"+health+"/livez", ""); code != http.StatusOK {
		t.Errorf("/livez with the API server not ready: %d, want 200: the proxy itself is alive", code)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestCommandRefuses(t *testing.T) {
	b := newBackend(t)
	kc := b.kubeconfig(t, "cert")
	garbage := filepath.Join(t.TempDir(), "garbage.key")
	os.WriteFile(garbage, []byte("not a key"), 0o600)
	// client-go would block opening a FIFO, and read a device without end.
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"non-loopback address", []string{"--address=0.0.0.0", "--port=0"}, "--allow-remote"},
		{"missing context", []string{"--context=nope", "--port=0"}, "nope"},
		{"missing kubeconfig", []string{"--kubeconfig=" + filepath.Join(t.TempDir(), "absent"), "--port=0"}, "--kubeconfig"},
		{"argument", []string{"extra"}, "unknown command"},
		// The first request would fail on it, naming neither the flag nor the file.
		{"client key not a key", []string{"--client-key=" + garbage, "--port=0"}, "--client-certificate and --client-key"},
		{"kubeconfig a fifo", []string{"--kubeconfig=" + fifo, "--port=0"}, "--kubeconfig: " + fifo + ": not a regular file (a fifo)"},
		{"kubeconfig a device", []string{"--kubeconfig=/dev/zero", "--port=0"}, "--kubeconfig: /dev/zero: not a regular file"},
		{"kubeconfig's client key a fifo", []string{"--kubeconfig=" + kcWithKey(t, kc, fifo), "--port=0"}, "kubeconfig context "},
		{"client key a fifo", []string{"--client-key=" + fifo, "--port=0"}, "--client-key: " + fifo + ": not a regular file (a fifo)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := NewProxyCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			args := c.args
			if !strings.Contains(strings.Join(args, " "), "--kubeconfig") {
				args = append(args, "--kubeconfig", kc)
			}
			cmd.SetArgs(args)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- cmd.ExecuteContext(ctx) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				t.Fatalf("still running after 15 s, want an error containing %q", c.want)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// kcWithKey is a copy of the kubeconfig kc whose user's client key is key.
func kcWithKey(t *testing.T, kc, key string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.ClientKey, a.ClientKeyData = key, nil
	}
	out := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// With --allow-remote the proxy listens on a non-loopback address; this uses the wildcard address and
// talks to it over loopback only.
func TestCommandAllowRemote(t *testing.T) {
	b := newBackend(t)
	logs := harness.CaptureKlogAt(t, 0)
	addr, stop := runCommand(t, "--kubeconfig", b.kubeconfig(t, "cert"), "--address=0.0.0.0", "--port=0", "--allow-remote")
	_, port, _ := net.SplitHostPort(addr)
	if code, _ := get(t, "http://127.0.0.1:"+port+"/api", ""); code != 200 {
		t.Fatalf("GET /api: %d", code)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	if !strings.Contains(logs(), "--allow-remote") {
		t.Errorf("no warning about --allow-remote in the log:\n%s", logs())
	}
}

func TestCommandDisableFilterWarns(t *testing.T) {
	b := newBackend(t)
	logs := harness.CaptureKlogAt(t, 0)
	addr, stop := runCommand(t, "--kubeconfig", b.kubeconfig(t, "cert"), "--port=0", "--disable-filter")
	if code, _ := get(t, "http://"+addr+"/api", "evil.example"); code != 200 {
		t.Fatalf("filter disabled, Host evil.example: %d, want 200", code)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	if want := "Request filter disabled, your proxy is vulnerable to XSRF attacks, please be cautious"; !strings.Contains(logs(), want) {
		t.Errorf("log lacks kubectl's warning %q:\n%s", want, logs())
	}
}

func TestCommandRefusesForeignOrigin(t *testing.T) {
	b := newBackend(t)
	check := func(t *testing.T, addr string, wants map[string]int) {
		t.Helper()
		for origin, want := range wants {
			req, _ := http.NewRequest("GET", "http://"+addr+"/api", nil)
			req.Header.Set("Origin", origin)
			client := &http.Client{Transport: &http.Transport{}}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			client.CloseIdleConnections()
			if resp.StatusCode != want {
				t.Errorf("Origin %s: %d, want %d", origin, resp.StatusCode, want)
			}
		}
	}
	addr, stop := runCommand(t, "--kubeconfig", b.kubeconfig(t, "cert"), "--port=0")
	check(t, addr, map[string]int{"https://evil.example": 403, "http://localhost:8001": 200})
	stop()
	// The check is the filter's, as the help says: --disable-filter turns it off with the rest.
	addr, stop = runCommand(t, "--kubeconfig", b.kubeconfig(t, "cert"), "--port=0", "--disable-filter")
	defer stop()
	check(t, addr, map[string]int{"https://evil.example": 200})
}
