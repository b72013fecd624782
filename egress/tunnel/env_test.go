package tunnel

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	harness.RemoveUpstreamBinaries()
	if code == 0 {
		if err := goleak.Find(leakOptions()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func leakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Typed[...]).updateUnfinishedWorkLoop"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction(harness.SpawnerFunc),
	}
}

// --- PKI -------------------------------------------------------------------------------------------------

// testCA is a throwaway CA whose certificate is also on disk, for the --cluster-ca-cert and --ca-cert flags.
type testCA struct {
	*pkitest.Cert
	file string
}

func newCA(t testing.TB, dir, name string) *testCA {
	t.Helper()
	ca := pkitest.NewCA(t, name)
	return &testCA{Cert: ca, file: ca.WriteCert(t, filepath.Join(dir, name+"-ca.crt"))}
}

// issue writes dir/name.crt and dir/name.key for localhost, signed by ca, and returns their paths.
func (ca *testCA) issue(t testing.TB, dir, name string, client bool) (certFile, keyFile string, serialNo *big.Int) {
	t.Helper()
	c := ca.Issue(t, pkitest.Spec{CN: name, Hosts: []string{"localhost", "127.0.0.1"}, Server: !client, Client: client})
	certFile, keyFile = c.Write(t, dir, name)
	return certFile, keyFile, c.Cert.SerialNumber
}

// --- environment ----------------------------------------------------------------------------------------

type env struct {
	dir        string
	ca         *testCA
	serverCert string
	serverKey  string
	agentCert  string
	agentKey   string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	// Socket paths must stay short (108 bytes), so not under t.TempDir's long names.
	dir, err := os.MkdirTemp("", "kt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{dir: dir, ca: newCA(t, dir, "cluster")}
	e.serverCert, e.serverKey, _ = e.ca.issue(t, dir, "server", false)
	e.agentCert, e.agentKey, _ = e.ca.issue(t, dir, "agent", true)
	return e
}

func (e *env) config(mode string) *Config {
	return &Config{
		ServerID:          "test-server",
		ServerCount:       1,
		Mode:              mode,
		UDSName:           filepath.Join(e.dir, "s.sock"),
		DeleteExistingUDS: true,
		AgentAddr:         "127.0.0.1:0",
		ClusterCert:       e.serverCert,
		ClusterKey:        e.serverKey,
		ClusterCA:         e.ca.file, // agents authenticate with e.agentCert unless a test says otherwise
		GracefulTimeout:   5 * time.Second,
	}
}

// tcpConfig is config(mode) with kube-apiserver's TCP transport: an mTLS frontend on a loopback port in
// place of the Unix socket.
func (e *env) tcpConfig(mode string) *Config {
	cfg := e.config(mode)
	cfg.UDSName, cfg.ServerAddr = "", "127.0.0.1:0"
	cfg.ServerCert, cfg.ServerKey, cfg.ServerCA = e.serverCert, e.serverKey, e.ca.file
	return cfg
}

// tcpFrontend is a client of r's mTLS TCP frontend, with a client certificate from e's CA (any will do).
func (e *env) tcpFrontend(t testing.TB, r *running, mode string) Frontend {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(e.ca.Cert.Cert)
	pair, err := tls.LoadX509KeyPair(e.agentCert, e.agentKey)
	if err != nil {
		t.Fatal(err)
	}
	return Frontend{Addr: r.FrontendAddr(), Mode: mode, TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}
}

type running struct {
	*Server
	*harness.Daemon
}

// start runs a server until the test ends (or Stop is called).
func start(t testing.TB, cfg *Config) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &running{Server: s, Daemon: harness.RunDaemon(t, cfg.GracefulTimeout, s.Run)}
}

// startWithFirstDataHold is start, with the server holding first data for hold.
func startWithFirstDataHold(t *testing.T, cfg *Config, hold time.Duration) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s.firstDataHold = hold
	return &running{Server: s, Daemon: harness.RunDaemon(t, cfg.GracefulTimeout, s.Run)}
}

func (r *running) frontend(mode string) Frontend {
	return Frontend{UDSName: r.cfg.UDSName, Mode: mode}
}

func (r *running) agentPort() int {
	_, p, _ := net.SplitHostPort(r.AgentAddr())
	n, _ := strconv.Atoi(p)
	return n
}

// waitAgents polls until n agents are connected.
func (r *running) waitAgents(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c := 0
		for _, a := range r.Status().Agents {
			if a.Connected {
				c++
			}
		}
		if c == n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("want %d connected agents, have %+v", n, r.Status().Agents)
}

// startUpstreamAgent runs the upstream proxy-agent binary against port with the given auth args.
func startUpstreamAgent(t testing.TB, e *env, id string, port int, auth ...string) *harness.Proc {
	t.Helper()
	args := []string{
		"--proxy-server-host=127.0.0.1", "--proxy-server-port=" + strconv.Itoa(port),
		"--ca-cert=" + e.ca.file, "--agent-id=" + id,
		"--health-server-host=127.0.0.1", "--health-server-port=" + strconv.Itoa(harness.FreePort(t)),
		"--admin-bind-address=127.0.0.1", "--admin-server-port=" + strconv.Itoa(harness.FreePort(t)),
		"--sync-interval=100ms", "--probe-interval=100ms", "--sync-interval-cap=500ms",
		"--v=1",
	}
	if len(auth) == 0 {
		auth = []string{"--agent-cert=" + e.agentCert, "--agent-key=" + e.agentKey}
	}
	args = append(args, auth...)
	return harness.Start(t, e.dir, id, nil, harness.UpstreamBinary(t, "proxy-agent"), args...)
}

// --- backends -------------------------------------------------------------------------------------------

// pattern is the byte at offset i of every generated body, so corruption anywhere is caught.
func pattern(i int64) byte { return byte(i*7 + i>>11) }

func fill(b []byte, off int64) {
	for i := range b {
		b[i] = pattern(off + int64(i))
	}
}

// startHTTPBackend serves "/" (hello) and "/bytes?n=N" (N pattern bytes) on loopback.
func startHTTPBackend(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello from backend\n") })
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		buf := make([]byte, 256<<10)
		for off := int64(0); off < n; {
			m := min(int64(len(buf)), n-off)
			fill(buf[:m], off)
			if _, err := w.Write(buf[:m]); err != nil {
				return
			}
			off += m
		}
	})
	blob := make([]byte, 1<<20)
	fill(blob, 0)
	// /blob?n=N: N bytes without generating them, for benchmarks (no content check).
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for off := int64(0); off < n; {
			m := min(int64(len(blob)), n-off)
			if _, err := w.Write(blob[:m]); err != nil {
				return
			}
			off += m
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// startServerFirstBackend accepts connections that get n pattern bytes at once, before the client says
// anything (as an SSH, SMTP or MySQL server greets), and are then closed.
func startServerFirstBackend(t *testing.T, n int) string {
	t.Helper()
	body := make([]byte, n)
	fill(body, 0)
	return harness.Serve(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.Write(body)
	}).Addr
}

// readAllWithin reads c to its end, and closes c once d has passed (konnectivity-client's connections have
// no deadlines).
func readAllWithin(c net.Conn, d time.Duration) ([]byte, error) {
	t := time.AfterFunc(d, func() { c.Close() })
	defer t.Stop()
	return io.ReadAll(c)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// download reads one /bytes response of n bytes on a fresh tunnel and checks every byte.
func download(t *testing.T, f Frontend, web string, n int64) time.Duration {
	t.Helper()
	start := time.Now()
	c := dial(t, f, web)
	defer c.Close()
	res, body := httpGet(t, c, web, fmt.Sprintf("/bytes?n=%d", n))
	if res.StatusCode != 200 || int64(len(body)) != n {
		t.Fatalf("got %s, %d bytes", res.Status, len(body))
	}
	checkPattern(t, body, 0)
	return time.Since(start)
}
