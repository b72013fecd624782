package servercmd

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/agent"
	"github.com/konnect-dev/konnect/cmd/internal/doctorcmd"
	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction(harness.SpawnerFunc), // the thread that starts upstream's binaries
		goleak.Cleanup(func(code int) {
			harness.RemoveUpstreamBinaries()
			os.Exit(code)
		}),
	)
}

// writePKI writes a CA and a server and agent certificate (SAN 127.0.0.1) into dir.
func writePKI(t *testing.T, dir string) (ca, serverCert, serverKey, agentCert, agentKey string) {
	t.Helper()
	c := pkitest.NewCA(t, "test-ca")
	ca = c.WriteCert(t, filepath.Join(dir, "ca.crt"))
	serverCert, serverKey = c.Server(t, "server", "127.0.0.1").Write(t, dir, "server")
	agentCert, agentKey = c.Issue(t, pkitest.Spec{CN: "agent", Hosts: []string{"127.0.0.1"}, Client: true}).Write(t, dir, "agent")
	return
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// runCmd runs konnect doctor, which TestServerAndDoctor drives against a server.
func runCmd(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := doctorcmd.NewDoctorCommand()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// startServer runs `konnect server` with args until the test ends, and returns its agent, health (a URL)
// and admin addresses.
func startServer(t *testing.T, args ...string) (agentAddr, health, admin string) {
	t.Helper()
	var out harness.SyncBuffer
	cmd := NewServerCommand()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("server command did not return")
		}
	})

	re := regexp.MustCompile(`agents (\S+), health (\S+), admin (\S+)`)
	var m []string
	for deadline := time.Now().Add(10 * time.Second); m == nil; {
		m = re.FindStringSubmatch(out.String())
		if time.Now().After(deadline) {
			t.Fatalf("server did not start: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return m[1], "http://" + m[2], m[3]
}

// TestServerAndDoctor runs `konnect server` as a user would, checks its health, metrics and admin
// endpoints, and drives `konnect doctor status` and `konnect doctor dial` against it, before and after an
// agent connects.
func TestServerAndDoctor(t *testing.T) {
	dir, err := os.MkdirTemp("", "ksc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ca, sc, sk, ac, ak := writePKI(t, dir)
	sock := filepath.Join(dir, "konnectivity-server.socket")

	agentAddr, health, admin := startServer(t,
		"--uds-name="+sock, "--cluster-cert="+sc, "--cluster-key="+sk, "--cluster-ca-cert="+ca,
		"--mode=grpc", "--server-port=0", "--agent-port=0", "--agent-bind-address=127.0.0.1",
		"--admin-port=0", "--health-port=0", "--graceful-timeout=2s", "--server-id=cmd-test",
		"--logtostderr=true", "--v=0")

	if code, body := get(t, health+"/readyz?verbose"); code != 200 || !strings.Contains(body, "[+]frontend-socket ok") || !strings.Contains(body, "[+]shutdown ok") {
		t.Errorf("/readyz?verbose: %d %s", code, body)
	}
	for _, p := range []string{"/livez", "/healthz", "/readyz/frontend-socket", "/ready"} {
		if code, body := get(t, health+p); code != 200 {
			t.Errorf("%s: %d %s", p, code, body)
		}
	}
	if code, body := get(t, health+"/readyz?exclude=frontend-socket&verbose"); code != 200 || !strings.Contains(body, "frontend-socket excluded") {
		t.Errorf("/readyz?exclude: %d %s", code, body)
	}
	_, metrics := get(t, health+"/metrics")
	for _, want := range []string{"konnectivity_network_proxy_server_", `konnect_certificate_expiry_seconds{file="` + sc, "konnect_tunnel_server_frontend_queued_bytes", `konnect_endpoint_connections_rejected_total{port="health",reason="evicted"} 0`, `konnect_endpoint_connections_rejected_total{port="admin",reason="refused"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, _ := get(t, "http://"+admin+"/debug/pprof/"); code != 404 {
		t.Errorf("pprof served without --enable-profiling: %d", code)
	}

	// No agent yet: status says so, and dial gives the reason users meet.
	o, err := runCmd(t, context.Background(), "status", "--admin-address", admin)
	if err != nil || !strings.Contains(o, "0 agent(s) connected") || !strings.Contains(o, "No agent available") {
		t.Errorf("status without agents: %v\n%s", err, o)
	}
	web := httpBackend(t)
	o, err = runCmd(t, context.Background(), "dial", web, "--uds-name", sock, "--timeout", "5s")
	if err == nil || !strings.Contains(o, "No agent available") || !strings.Contains(o, "no agent is connected") {
		t.Errorf("dial without agents: %v\n%s", err, o)
	}

	// konnect's agent connects; status lists it, and dial gets through.
	a, err := agent.New(agent.Config{Servers: []string{agentAddr}, CAFile: ca, CertFile: ac, KeyFile: ak,
		AgentID: "node-1", Identifiers: "host=node-1", SyncInterval: 100 * time.Millisecond, GracefulTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgent := context.WithCancel(context.Background())
	agentDone := make(chan struct{})
	go func() { defer close(agentDone); a.Run(actx) }()
	defer func() { stopAgent(); <-agentDone }()
	var st tunnel.Status
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, body := get(t, "http://"+admin+"/debug/agents")
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("/debug/agents: %v: %s", err, body)
		}
		if len(st.Agents) == 1 && st.Agents[0].Connected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not connected: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.ServerID != "cmd-test" || st.Agents[0].ID != "node-1" || st.Agents[0].Identifiers != "host=node-1" {
		t.Errorf("status %+v", st)
	}
	o, err = runCmd(t, context.Background(), "status", "--admin-address", admin)
	if err != nil || !strings.Contains(o, "1 agent(s) connected") || !regexp.MustCompile(`node-1\s+connected`).MatchString(o) {
		t.Errorf("status with an agent: %v\n%s", err, o)
	}
	o, err = runCmd(t, context.Background(), "dial", web, "--uds-name", sock, "--request", "GET /")
	if err != nil || !strings.Contains(o, "OK dial") || !strings.Contains(o, "HTTP/1.1 200 OK") {
		t.Errorf("dial with an agent: %v\n%s", err, o)
	}
	o, err = runCmd(t, context.Background(), "dial", "127.0.0.1:1", "--uds-name", sock)
	if err == nil || !strings.Contains(o, "connection refused") {
		t.Errorf("dial to a closed port: %v\n%s", err, o)
	}
	o, err = runCmd(t, context.Background(), "status", "--admin-address", "127.0.0.1:1")
	if err == nil || !strings.Contains(o, "UNREACHABLE") {
		t.Errorf("status of a server that is not there: %v\n%s", err, o)
	}
}

func httpBackend(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), ReadHeaderTimeout: time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestServerFlagErrors(t *testing.T) {
	dir := t.TempDir()
	ca, sc, sk, _, _ := writePKI(t, dir)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, busyPort, _ := net.SplitHostPort(busy.Addr().String())
	stale := filepath.Join(dir, "stale.sock")
	staleLn, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	staleLn.SetUnlinkOnClose(false)
	staleLn.Close()
	shared := filepath.Join(dir, "shared") // as kubelet makes an emptyDir volume
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	// Where a relative --uds-name would be bound.
	t.Chdir(dir)
	fifo := filepath.Join(dir, "fifo.key") // its open blocks until a writer comes, unless made not to
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--uds-name=" + filepath.Join(dir, "s.sock"), "--cluster-cert=" + sc, "--cluster-key=" + sk, "--cluster-ca-cert=" + ca,
		"--server-port=0", "--agent-port=0", "--admin-port=0", "--health-port=0"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"mode", []string{"--mode=tcp"}, "--mode"},
		{"remote admin", []string{"--admin-bind-address=0.0.0.0"}, "--allow-remote-admin"},
		{"health port in use", []string{"--health-port=" + busyPort, "--health-bind-address=127.0.0.1"}, "address already in use"},
		{"agent port in use", []string{"--agent-port=" + busyPort, "--agent-bind-address=127.0.0.1"}, "--agent-bind-address/--agent-port"},
		{"stale socket", []string{"--uds-name=" + stale, "--delete-existing-uds-file=false"}, "--delete-existing-uds-file"},
		{"shared socket directory", []string{"--uds-name=" + filepath.Join(shared, "s.sock")}, "--allow-shared-uds-dir"},
		{"unknown flag", []string{"--no-such-flag"}, "unknown flag"},
		{"cluster key a fifo", []string{"--cluster-key=" + fifo}, "--cluster-key: " + fifo + ": not a regular file (a fifo)"},
		// kube-apiserver's egress selector configuration takes only an absolute path, as konnect init does.
		{"relative socket", []string{"--uds-name=s.sock"}, `--uds-name: unix socket path "s.sock" must be absolute`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := NewServerCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(append(append([]string{}, base...), tc.args...))
			// In a goroutine, so that a start that blocks (on a FIFO) fails the test instead of hanging it.
			done := make(chan error, 1)
			go func() { done <- cmd.Execute() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the command did not return within 10s")
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error with %q, got %v", tc.want, err)
			}
		})
	}
}

// TestTwoServersInOneProcess: each server has its own metrics registry, so a second one in the same process
// neither fails to register nor shows the first one's metrics twice.
func TestTwoServersInOneProcess(t *testing.T) {
	dir := t.TempDir()
	ca, sc, sk, _, _ := writePKI(t, dir)
	for i := range 2 {
		o := NewOptions()
		fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse([]string{"--uds-name=" + filepath.Join(dir, fmt.Sprintf("s%d.sock", i)), "--cluster-cert=" + sc,
			"--cluster-key=" + sk, "--cluster-ca-cert=" + ca, "--server-port=0", "--agent-port=0", "--admin-port=0", "--health-port=0"}); err != nil {
			t.Fatal(err)
		}
		cfg, err := o.Config()
		if err != nil {
			t.Fatal(err)
		}
		before := goleak.IgnoreCurrent()
		s, err := New(cfg)
		if err != nil {
			t.Fatalf("server %d: %v", i, err)
		}
		if err := goleak.Find(before); err != nil {
			t.Errorf("server %d: New started goroutines (New binds, Run starts): %v", i, err)
		}
		rec := httptest.NewRecorder()
		s.endpoints.HealthMux.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body := rec.Body.String()
		if rec.Code != 200 || strings.Count(body, "\nkonnect_tunnel_server_frontend_queued_bytes ") != 1 ||
			strings.Count(body, "# TYPE go_goroutines ") != 1 || !strings.Contains(body, "konnectivity_network_proxy_server_") {
			t.Fatalf("server %d: /metrics %d:\n%s", i, rec.Code, body)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCertificateMetricsShowTheCertificateInUse: after a renewal that does not load (a certificate for
// another key, a CA bundle with no certificate), the server keeps the old certificate, and so must
// konnect_certificate_expiry_seconds, or an expiry alert would be silenced until the old one expires;
// konnect_certificate_reload_pending shows the failed renewal until a good one loads.
func TestCertificateMetricsShowTheCertificateInUse(t *testing.T) {
	dir, err := os.MkdirTemp("", "ksc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ca := pkitest.NewCA(t, "test-ca")
	caFile := ca.WriteCert(t, filepath.Join(dir, "ca.crt"))
	sc, sk := ca.Server(t, "server", "127.0.0.1").Write(t, dir, "server")
	client := ca.Client(t, "agent")
	agentAddr, health, _ := startServer(t,
		"--uds-name="+filepath.Join(dir, "s.sock"), "--cluster-cert="+sc, "--cluster-key="+sk, "--cluster-ca-cert="+caFile,
		"--mode=grpc", "--server-port=0", "--agent-port=0", "--agent-bind-address=127.0.0.1",
		"--admin-port=0", "--health-port=0", "--graceful-timeout=2s", "--logtostderr=true", "--v=0")

	// sample reads name's two series; each scrape checks the files, at most once per reload.CheckInterval.
	sample := func(name, file string) (expiry time.Duration, pending string) {
		t.Helper()
		_, body := get(t, health+"/metrics")
		labels := regexp.QuoteMeta(`{file="` + file + `",name="` + name + `"} `)
		e := regexp.MustCompile(`(?m)^konnect_certificate_expiry_seconds` + labels + `(\S+)$`).FindStringSubmatch(body)
		p := regexp.MustCompile(`(?m)^konnect_certificate_reload_pending` + labels + `(\S+)$`).FindStringSubmatch(body)
		if e == nil || p == nil {
			t.Fatalf("/metrics lacks %s's series:\n%s", name, body)
		}
		secs, err := strconv.ParseFloat(e[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(secs * float64(time.Second)), p[1]
	}
	// waitPending scrapes until name's pending series is want, and returns the expiry then.
	waitPending := func(name, file, want string) time.Duration {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			expiry, pending := sample(name, file)
			if pending == want {
				return expiry
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: konnect_certificate_reload_pending %s, want %s", name, pending, want)
			}
		}
	}
	// served is the certificate the agent port presents.
	served := func() *x509.Certificate {
		t.Helper()
		c, err := tls.Dial("tcp", agentAddr, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{client.TLS()}, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	near := func(d time.Duration, notAfter time.Time) bool {
		return (time.Until(notAfter) - d).Abs() < time.Minute
	}

	old := served()
	if e := waitPending("cluster-cert", sc, "0"); !near(e, old.NotAfter) {
		t.Fatalf("at start: cluster-cert expires in %v, want the served certificate's %v", e, time.Until(old.NotAfter))
	}
	// A renewal that wrote a ten-day certificate for a new key, but not the key.
	renewed := ca.Issue(t, pkitest.Spec{CN: "server", Hosts: []string{"127.0.0.1"}, Server: true, NotAfter: time.Now().Add(10 * 24 * time.Hour)})
	pkitest.WriteFile(t, sc, renewed.CertPEM)
	e := waitPending("cluster-cert", sc, "1")
	if !served().Equal(old) {
		t.Fatal("the server serves a certificate whose key it does not have")
	}
	if !near(e, old.NotAfter) {
		t.Errorf("broken renewal: cluster-cert expires in %v, want the certificate in use's %v, not the file's %v",
			e, time.Until(old.NotAfter), time.Until(renewed.Cert.NotAfter))
	}
	// The renewal completes: the key, then the certificate, each renamed into place.
	renewed.Write(t, dir, "server")
	if e := waitPending("cluster-cert", sc, "0"); !near(e, renewed.Cert.NotAfter) {
		t.Errorf("good renewal: cluster-cert expires in %v, want %v", e, time.Until(renewed.Cert.NotAfter))
	}
	if !served().Equal(renewed.Cert) {
		t.Error("the renewed certificate is not served")
	}

	// The CA bundle the server trusts: one without a certificate does not load; the CA in use is reported.
	if e := waitPending("cluster-ca-cert", caFile, "0"); !near(e, ca.Cert.NotAfter) {
		t.Fatalf("cluster-ca-cert expires in %v, want %v", e, time.Until(ca.Cert.NotAfter))
	}
	pkitest.WriteFile(t, caFile, []byte("# no certificate yet\n"))
	if e := waitPending("cluster-ca-cert", caFile, "1"); !near(e, ca.Cert.NotAfter) {
		t.Errorf("broken CA bundle: cluster-ca-cert expires in %v, want the CA in use's %v", e, time.Until(ca.Cert.NotAfter))
	}
	ca.WriteCert(t, caFile)
	waitPending("cluster-ca-cert", caFile, "0")
}
