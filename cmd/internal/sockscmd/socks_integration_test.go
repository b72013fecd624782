//go:build integration

package sockscmd

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/kubeconfigcmd"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/proxy"
)

// env is a running konnect socks against a real sshd.
type env struct {
	sshd       *harness.SSHD
	proxy      *Proxy
	key        string // the client's identity file
	knownHosts string // trusts sshd
	stop       func()
}

// startEnv runs konnect socks against a fresh sshd; sshdConfig lines are added to sshd's config before
// konnect connects.
func startEnv(t *testing.T, mutate func(o *Options), sshdConfig ...string) *env {
	t.Helper()
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	srv := harness.StartSSHD(t, pub)
	if len(sshdConfig) > 0 {
		f, err := os.OpenFile(filepath.Join(srv.Dir, "sshd_config"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = fmt.Fprintln(f, strings.Join(sshdConfig, "\n"))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		srv.Restart()
	}
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)

	o := NewOptions()
	o.DynamicForward = "127.0.0.1:0"
	o.HealthListen = "127.0.0.1:0"
	o.SSH.IdentityFiles = []string{key}
	o.SSH.KnownHostsFile = kh
	o.SSH.ConfigFile = "none"
	o.SSH.ConnectTimeout = 10 * time.Second
	if mutate != nil {
		mutate(o)
	}
	o.Destination = srv.Addr()
	cfg, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.SSH.AgentSocket = "none"
	p, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	e := &env{sshd: srv, proxy: p, key: key, knownHosts: kh}
	e.stop = func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s of cancel")
		}
	}
	t.Cleanup(e.stop)
	harness.EventuallyTrue(t, 20*time.Second, "SSH connected", func() bool { return p.Ready() == nil })
	return e
}

func backend(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "backend %s", r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return port
}

func curl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl is required: %v", err)
	}
	cmd := exec.Command(bin, append([]string{"-sS", "--max-time", "20", "--noproxy", ""}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func healthStatus(t *testing.T, p *Proxy, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.HealthAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestSocksAgainstSSHD(t *testing.T) {
	e := startEnv(t, nil)
	port := backend(t)
	addr := e.proxy.SOCKSAddr().String()

	d, err := proxy.SOCKS5("tcp", addr, nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{Dial: d.Dial, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://localhost:" + port + "/xnet")
	if err != nil {
		t.Fatalf("x/net/proxy through konnect socks: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "backend /xnet" {
		t.Fatalf("body %q", b)
	}
	for _, args := range [][]string{
		{"--socks5-hostname", addr, "http://localhost:" + port + "/curl-socks"},
		{"--proxy", "http://" + addr, "http://localhost:" + port + "/curl-http"},
		{"--proxytunnel", "--proxy", "http://" + addr, "http://localhost:" + port + "/curl-connect"},
	} {
		out, err := curl(t, args...)
		want := "backend " + args[len(args)-1][strings.LastIndex(args[len(args)-1], "/"):]
		if err != nil || out != want {
			t.Fatalf("curl %v: %v: %q, want %q", args, err, out, want)
		}
	}
	// Requests went through sshd: it logged the forwarded connections.
	if !strings.Contains(e.sshd.Log(), "target localhost port "+port) {
		t.Errorf("sshd did not forward to localhost:%s (names must be resolved remotely); log:\n%s", port, e.sshd.Log())
	}
	if code, body := healthStatus(t, e.proxy, "/readyz?verbose"); code != 200 || !strings.Contains(body, "[+]ssh ok") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	if code, body := healthStatus(t, e.proxy, "/metrics"); code != 200 || !strings.Contains(body, "konnect_socks_ssh_up 1") ||
		!strings.Contains(body, "konnect_socks_client_connections") {
		t.Fatalf("/metrics = %d, missing konnect gauges:\n%s", code, body)
	}
	// A refused destination is reported as such through SSH.
	closed := harness.FreePort(t)
	out, _ := curl(t, "--socks5-hostname", addr, fmt.Sprintf("http://127.0.0.1:%d/", closed))
	// curl prints the SOCKS5 reply code: 5 is "connection refused".
	if !strings.Contains(out, "(5)") {
		t.Errorf("curl to a closed port through SSH: %q, want reply 5 (connection refused)", out)
	}
	out, _ = curl(t, "--proxytunnel", "--proxy", "http://"+addr, fmt.Sprintf("http://127.0.0.1:%d/", closed))
	if !strings.Contains(out, "502") {
		t.Errorf("CONNECT to a closed port through SSH: %q, want 502", out)
	}
}

func TestSocksReconnect(t *testing.T) {
	e := startEnv(t, nil)
	port := backend(t)
	addr := e.proxy.SOCKSAddr().String()
	url := "http://localhost:" + port + "/r"
	if out, err := curl(t, "--socks5-hostname", addr, url); err != nil || out != "backend /r" {
		t.Fatalf("before restart: %v %q", err, out)
	}
	e.sshd.Stop()
	harness.EventuallyTrue(t, 20*time.Second, "readiness to fail", func() bool { return e.proxy.Ready() != nil })
	if code, body := healthStatus(t, e.proxy, "/readyz?verbose"); code == 200 || !strings.Contains(body, "[-]ssh failed") {
		t.Fatalf("/readyz while sshd is down = %d %q", code, body)
	}
	if _, body := healthStatus(t, e.proxy, "/metrics"); !strings.Contains(body, "konnect_socks_ssh_up 0") {
		t.Fatalf("/metrics while sshd is down does not say konnect_socks_ssh_up 0")
	}
	if code, _ := healthStatus(t, e.proxy, "/livez"); code != 200 {
		t.Fatalf("/livez while sshd is down = %d, want 200 (the process is fine)", code)
	}
	// The listener stays up; a client arriving now waits for the reconnect.
	res := make(chan string, 1)
	go func() {
		out, err := curl(t, "--socks5-hostname", addr, url)
		if err != nil {
			out += err.Error()
		}
		res <- out
	}()
	// Restart sshd only once that client is connected to the proxy and waiting.
	harness.EventuallyTrue(t, 20*time.Second, "the client to reach the proxy", func() bool { return e.proxy.server.ActiveConns() == 1 })
	e.sshd.Restart()
	select {
	case out := <-res:
		if out != "backend /r" {
			t.Fatalf("request during reconnect: %q", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("request during reconnect did not finish")
	}
	harness.EventuallyTrue(t, 20*time.Second, "ready again", func() bool { return e.proxy.Ready() == nil })
	if code, _ := healthStatus(t, e.proxy, "/readyz"); code != 200 {
		t.Fatalf("/readyz after reconnect = %d", code)
	}
}

func TestSocksUnknownHostKeyStopsRun(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	srv := harness.StartSSHD(t, pub)
	o := NewOptions()
	o.DynamicForward = "127.0.0.1:0"
	o.SSH.IdentityFiles = []string{key}
	o.SSH.KnownHostsFile = filepath.Join(dir, "known_hosts")
	o.SSH.ConfigFile = "none"
	o.Destination = srv.Addr()
	cfg, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.SSH.AgentSocket = "none"
	p, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "is not known") || !strings.Contains(err.Error(), srv.HostKeyLine) {
		t.Fatalf("Run = %v, want the unknown-host error with the line to add", err)
	}
	// The listener is closed once Run returns.
	if c, err := net.Dial("tcp", p.SOCKSAddr().String()); err == nil {
		c.Close()
		t.Fatal("listener still open after Run returned")
	}
}

func TestSocksAuthOnRemoteBind(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("pa55\n"), 0o600)
	e := startEnv(t, func(o *Options) {
		// Credentials are enforced whenever they are set, on loopback too; a remote bind only makes them
		// mandatory (TestOptionsConfig).
		o.ProxyUser = "dev"
		o.ProxyPasswordFile = pw
		o.HTTPListen = "127.0.0.1:0"
	})
	port := backend(t)
	addr := e.proxy.SOCKSAddr().String()
	url := "http://localhost:" + port + "/a"
	if out, err := curl(t, "--socks5-hostname", addr, url); err == nil {
		t.Fatalf("SOCKS5 without credentials succeeded: %q", out)
	}
	if out, err := curl(t, "--socks5-hostname", addr, "--proxy-user", "dev:pa55", url); err != nil || out != "backend /a" {
		t.Fatalf("SOCKS5 with credentials: %v %q", err, out)
	}
	httpAddr := e.proxy.HTTPAddr().String()
	if out, _ := curl(t, "-o", "/dev/null", "-w", "%{http_code}", "--proxy", "http://"+httpAddr, url); out != "407" {
		t.Fatalf("HTTP without credentials: %q, want 407", out)
	}
	if out, err := curl(t, "--proxy", "http://"+httpAddr, "--proxy-user", "dev:pa55", url); err != nil || out != "backend /a" {
		t.Fatalf("HTTP with credentials: %v %q", err, out)
	}
	// The --http-listen port speaks only HTTP.
	if out, err := curl(t, "--socks5-hostname", httpAddr, "--proxy-user", "dev:pa55", url); err == nil {
		t.Fatalf("SOCKS5 on the HTTP-only port succeeded: %q", out)
	}
}

// TestKubectlThroughSocks runs the real kubectl with a kubeconfig whose proxy-url points at konnect socks,
// written by `konnect kubeconfig set-proxy`, against an HTTPS endpoint that answers /api.
func TestKubectlThroughSocks(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is required: %v", err)
	}
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"remote"}]}`)
	}))
	defer api.Close()
	e := startEnv(t, nil)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	os.WriteFile(caFile, ca, 0o600)
	kc := filepath.Join(dir, "config")
	os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    server: %s
    certificate-authority: %s
  name: remote
contexts:
- context:
    cluster: remote
    user: dev
  name: remote
current-context: remote
users:
- name: dev
  user:
    token: not-a-secret
`, api.URL, caFile)), 0o600)
	set := kubeconfigcmd.NewKubeconfigCommand()
	set.SetArgs([]string{"set-proxy", "--kubeconfig", kc, "--context", "remote", "--proxy-url", "socks5://" + e.proxy.SOCKSAddr().String()})
	set.SetOut(io.Discard)
	if err := set.Execute(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kubectl, "--kubeconfig", kc, "get", "--raw", "/api")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"APIVersions"`) {
		t.Fatalf("kubectl through konnect socks: %v: %s", err, out)
	}
	_, apiPort, _ := net.SplitHostPort(api.Listener.Addr().String())
	if !strings.Contains(e.sshd.Log(), "port "+apiPort) {
		t.Errorf("kubectl's connection did not go through sshd")
	}
}
