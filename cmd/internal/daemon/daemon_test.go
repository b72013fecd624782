package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/reload"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
	"k8s.io/apiserver/pkg/server/healthz"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog's flush daemon and healthz's package-level metrics start goroutines at import time.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.BackoffUntil"),
	)
}

func TestCheckLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr        string
		allowRemote bool
		wantErr     string
	}{
		{"127.0.0.1:80", false, ""},
		{"127.5.0.1:80", false, ""},
		{"[::1]:80", false, ""},
		{"localhost:80", false, ""},
		{"0.0.0.0:80", false, "--listen: refusing to listen on 0.0.0.0:80"},
		{":80", false, "all interfaces"},
		{"198.18.0.1:80", false, "not loopback"},
		{"198.18.0.1:80", true, ""},
		{"nonsense", false, "is not host:port"},
		// Never looked up in DNS, also where remote addresses are allowed.
		{"999.1.1.1:80", true, `--listen: "999.1.1.1" looks like an IP address`},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			err := CheckLoopback(tc.addr, tc.allowRemote, "--listen")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestCheckLoopbackNamesTheAllowFlag(t *testing.T) {
	err := CheckLoopback("0.0.0.0:8133", false, "--admin-bind-address", "--allow-remote-admin")
	if err == nil || !strings.Contains(err.Error(), "pass --allow-remote-admin") {
		t.Fatalf("error %v, want it to name --allow-remote-admin", err)
	}
	err = CheckLoopback("0.0.0.0:1080", false, "-D")
	if err == nil || !strings.Contains(err.Error(), "pass --allow-remote ") {
		t.Fatalf("error %v, want it to name --allow-remote by default", err)
	}
}

func TestListenAddressInUse(t *testing.T) {
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Listen("tcp", ln.Addr().String(), false, "--health-port")
	if err == nil || !strings.Contains(err.Error(), "--health-port") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("second Listen: got %v, want an address-in-use error naming the flag", err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHealthEndpoints(t *testing.T) {
	var tunnelErr error = errors.New("no agent connected")
	ready := []healthz.HealthChecker{
		healthz.NamedCheck("uds", func(*http.Request) error { return nil }),
		healthz.NamedCheck("tunnel", func(*http.Request) error { return tunnelErr }),
	}
	reg := prometheus.NewRegistry()
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, NewHealthMux(nil, ready, reg)) }()
	base := "http://" + ln.Addr().String()

	if code, _ := get(t, base+"/livez"); code != 200 {
		t.Errorf("/livez = %d, want 200", code)
	}
	code, body := get(t, base+"/readyz?verbose")
	if code != 500 || !strings.Contains(body, "[+]uds ok") || !strings.Contains(body, "[-]tunnel failed") {
		t.Errorf("/readyz?verbose = %d %q, want 500 with [+]uds ok and [-]tunnel failed", code, body)
	}
	if code, _ := get(t, base+"/readyz?exclude=tunnel"); code != 200 {
		t.Errorf("/readyz?exclude=tunnel = %d, want 200", code)
	}
	if code, _ := get(t, base+"/readyz/uds"); code != 200 {
		t.Errorf("/readyz/uds = %d, want 200", code)
	}
	if code, _ := get(t, base+"/readyz/tunnel"); code != 500 {
		t.Errorf("/readyz/tunnel = %d, want 500", code)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200 while alive but not ready: it is upstream's liveness endpoint", code)
	}
	tunnelErr = nil
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz after recovery = %d, want 200", code)
	}
	if code, _ := get(t, base+"/metrics"); code != 200 {
		t.Errorf("/metrics = %d", code)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v after cancel, want nil", err)
		}
	case <-time.After(ShutdownGrace + time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestCertExpiryMetric(t *testing.T) {
	// A fixed certificate valid for a century (openssl req -x509 -days 36500).
	dir := t.TempDir()
	file := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(file, []byte(testCert), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle, err := reload.CAPool("CA bundle", file)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := RegisterCertExpiry(reg, "ca", reload.BundleCert(bundle)); err != nil {
		t.Fatal(err)
	}
	// A second certificate on the same registry is a daemon with both a CA bundle and a client certificate.
	if err := RegisterCertExpiry(reg, "client", reload.Cert{File: file, InUse: func() (*x509.Certificate, error) {
		c, _ := bundle.State()
		return c.Certs[0], errors.New("changed file does not load")
	}}); err != nil {
		t.Fatalf("second certificate on one registry: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 2 {
		t.Fatalf("Gather = %v, %v; want two metrics", mfs, err)
	}
	for _, mf := range mfs {
		if len(mf.Metric) != 2 {
			t.Fatalf("%s has %d samples, want one per certificate", mf.GetName(), len(mf.Metric))
		}
		for _, m := range mf.Metric {
			v, name := m.GetGauge().GetValue(), m.GetLabel()[1].GetValue()
			switch mf.GetName() {
			case "konnect_certificate_expiry_seconds":
				if v < 90*365*24*3600 {
					t.Errorf("%s: expiry seconds = %v, want about a century", name, v)
				}
			case "konnect_certificate_reload_pending":
				if want := map[string]float64{"ca": 0, "client": 1}[name]; v != want {
					t.Errorf("%s: reload pending = %v, want %v", name, v, want)
				}
			default:
				t.Errorf("unexpected metric %s", mf.GetName())
			}
		}
	}
}

func TestSlowlorisIsCutOff(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the header timeout")
	}
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, NewHealthMux(nil, nil, prometheus.NewRegistry())) }()
	defer func() { cancel(); <-done }()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	// Never finish the headers: the server must close the connection after ReadHeaderTimeout.
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(ReadHeaderTimeout + 5*time.Second))
	_, err = io.ReadAll(c)
	if elapsed := time.Since(start); err != nil || elapsed > ReadHeaderTimeout+3*time.Second {
		t.Fatalf("connection closed after %v (err %v), want within about %v", elapsed, err, ReadHeaderTimeout)
	}
}

func TestRedactSecretsInLogs(t *testing.T) {
	body := `{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","spec":{"token":"eyJhbGciOiJSUzI1NiJ9.secret"}}`
	_, kv := secretFilter{}.FilterS("Request Body", []interface{}{"body", body, "verb", "POST"})
	if kv[1] != redacted || kv[3] != "POST" {
		t.Fatalf("FilterS = %v, want the body redacted and the verb kept", kv)
	}
	args := secretFilter{}.Filter([]interface{}{"-----BEGIN EC PRIVATE KEY-----\nMHc...", "harmless"})
	if args[0] != redacted || args[1] != "harmless" {
		t.Fatalf("Filter = %v, want the key redacted", args)
	}
	if _, a := (secretFilter{}).FilterF("%s", []interface{}{"Authorization: Bearer abc.def"}); a[0] != redacted {
		t.Fatalf("FilterF kept a bearer token: %v", a)
	}
	if _, a := (secretFilter{}).FilterF("%s", []interface{}{"Authorization: Bearer <masked>"}); a[0] == redacted {
		t.Fatalf("FilterF redacted a header client-go already masked")
	}
	// Values that are not text print it all the same: an error, a header map.
	_, kv = secretFilter{}.FilterS("Request failed", []interface{}{
		"err", errors.New("decode " + body), "headers", http.Header{"Authorization": {"Bearer abc.def"}}, "code", 401})
	if kv[1] != redacted || kv[3] != redacted || kv[5] != 401 {
		t.Fatalf("FilterS = %v, want the error and the header map redacted and the code kept", kv)
	}
}

// TestFlowControlFlags: bad windows are refused naming the flag; with --flow-control=false they do not
// matter.
func TestFlowControlFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // substring of the error; empty means valid
	}{
		{nil, ""},
		{[]string{"--flow-control-window-bytes=16384", "--flow-control-max-window-bytes=16384"}, ""},
		{[]string{"--flow-control-window-bytes=1024"}, "--flow-control-window-bytes: must be between 16384 and 67108864, got 1024"},
		{[]string{"--flow-control-window-bytes=134217728"}, "--flow-control-window-bytes"},
		{[]string{"--flow-control-max-window-bytes=32768"}, "--flow-control-max-window-bytes: must be between --flow-control-window-bytes (65536)"},
		{[]string{"--flow-control-max-window-bytes=134217728"}, "--flow-control-max-window-bytes"},
		{[]string{"--flow-control=false", "--flow-control-window-bytes=1"}, ""},
	} {
		f := NewFlowControl()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f.AddFlags(fs, "agents")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := f.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestReleaseStartupPages: the pages of the executable that this process alone holds leave its resident
// set, and only what it touches again comes back.
func TestReleaseStartupPages(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	resident := func() int {
		data, err := os.ReadFile("/proc/self/smaps")
		if err != nil {
			t.Fatal(err)
		}
		kb, ours := 0, false
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 6 && strings.Contains(f[0], "-"):
				ours = f[5] == exe && !strings.Contains(f[1], "w")
			case ours && len(f) == 3 && f[0] == "Rss:":
				n, _ := strconv.Atoi(f[1])
				kb += n
			}
		}
		return kb
	}
	before := resident()
	advised, err := releaseStartupPages()
	if err != nil {
		t.Fatalf("after %d bytes: %v", advised, err)
	}
	after := resident()
	t.Logf("the executable's read-only pages: %d KiB resident before, %d KiB after (%d MiB advised)", before, after, advised>>20)
	if after > before/2 {
		t.Fatalf("%d KiB of %d KiB stayed resident", after, before)
	}
}
