package tunnel

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// upstreamBin holds proxy-agent and proxy-server built from the module cache (the peers konnect must
// interoperate with). KONNECT_UPSTREAM_BIN may point at a directory that already has them.
var (
	upstreamBin  string
	upstreamOnce sync.Once
	upstreamErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "konnect-tunnel-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	upstreamBin = dir
	code := m.Run()
	os.RemoveAll(dir)
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
	}
}

func upstreamBinary(t testing.TB, name string) string {
	t.Helper()
	if d := os.Getenv("KONNECT_UPSTREAM_BIN"); d != "" {
		return filepath.Join(d, name)
	}
	upstreamOnce.Do(func() {
		for _, b := range []struct{ name, pkg string }{
			{"proxy-agent", "sigs.k8s.io/apiserver-network-proxy/cmd/agent"},
			{"proxy-server", "sigs.k8s.io/apiserver-network-proxy/cmd/server"},
		} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(upstreamBin, b.name), b.pkg).CombinedOutput()
			if err != nil {
				upstreamErr = fmt.Errorf("build upstream %s: %v\n%s", b.name, err, out)
				return
			}
		}
	})
	if upstreamErr != nil {
		t.Fatal(upstreamErr)
	}
	return filepath.Join(upstreamBin, name)
}

// --- PKI -------------------------------------------------------------------------------------------------

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

var serial atomic64

type atomic64 struct {
	mu sync.Mutex
	n  int64
}

func (a *atomic64) next() *big.Int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	return big.NewInt(time.Now().UnixNano() + a.n)
}

func newCA(t testing.TB, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial.next(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	file := filepath.Join(dir, name+"-ca.crt")
	writePEM(t, file, "CERTIFICATE", der)
	return &testCA{cert: cert, key: key, file: file}
}

// issue writes name.crt/name.key signed by ca and returns their paths.
func (ca *testCA) issue(t testing.TB, dir, name string, client bool) (certFile, keyFile string, serialNo *big.Int) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial.next(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	// Key first, then certificate, each renamed into place, as a renewal tool would.
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	writePEM(t, certFile, "CERTIFICATE", der)
	return certFile, keyFile, tmpl.SerialNumber
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
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
		GracefulTimeout:   5 * time.Second,
	}
}

type running struct {
	*Server
	cancel context.CancelFunc
	done   chan error
}

// start runs a server until the test ends (or stop is called).
func start(t testing.TB, cfg *Config) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Server: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	began := time.Now()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
			t.Logf("Run returned %v after %v", err, time.Since(began))
		}
		return err
	case <-time.After(r.cfg.GracefulTimeout + 10*time.Second):
		t.Fatalf("Run did not return within graceful timeout %v", r.cfg.GracefulTimeout)
		return nil
	}
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

type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startUpstreamAgent runs the upstream proxy-agent binary against port with the given auth args.
func startUpstreamAgent(t testing.TB, e *env, id string, port int, auth ...string) *proc {
	t.Helper()
	args := []string{
		"--proxy-server-host=127.0.0.1", "--proxy-server-port=" + strconv.Itoa(port),
		"--ca-cert=" + e.ca.file, "--agent-id=" + id,
		"--health-server-host=127.0.0.1", "--health-server-port=" + strconv.Itoa(freePort(t)),
		"--admin-bind-address=127.0.0.1", "--admin-server-port=" + strconv.Itoa(freePort(t)),
		"--sync-interval=100ms", "--probe-interval=100ms", "--sync-interval-cap=500ms",
		"--v=1",
	}
	if len(auth) == 0 {
		auth = []string{"--agent-cert=" + e.agentCert, "--agent-key=" + e.agentKey}
	}
	args = append(args, auth...)
	return startProc(t, e.dir, id, upstreamBinary(t, "proxy-agent"), args...)
}

func startProc(t testing.TB, dir, name, bin string, args ...string) *proc {
	t.Helper()
	logf, err := os.CreateTemp(dir, name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies (a timeout panic skips cleanups), the child goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: logf.Name(), done: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log tail:\n%s", name, b)
		}
	})
	return p
}

func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	// SIGKILL: these tests are about the server, and upstream's agent waits on SIGTERM.
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
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

// startEchoBackend echoes every byte back on each connection.
func startEchoBackend(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// closedPort returns a loopback address where nothing listens.
func closedPort(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(freePort(t))
}
