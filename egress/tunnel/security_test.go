package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/uds"
	"github.com/konnect-dev/konnect/test/harness"
	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// fakeTokenReview is a tiny TokenReview endpoint: each token has a user and audiences, and a review
// authenticates a token only for an audience it carries, as kube-apiserver does.
func fakeTokenReview(t *testing.T, tokens map[string]authv1.UserInfo, auds map[string][]string) kubernetes.Interface {
	t.Helper()
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
			return
		}
		var tr authv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		user, ok := tokens[tr.Spec.Token]
		switch {
		case !ok:
			tr.Status = authv1.TokenReviewStatus{Error: "invalid bearer token"}
		case !slices.ContainsFunc(tr.Spec.Audiences, func(a string) bool { return slices.Contains(auds[tr.Spec.Token], a) }):
			tr.Status = authv1.TokenReviewStatus{Error: "token audiences " + strings.Join(auds[tr.Spec.Token], ",") + " is invalid for the target audiences " + strings.Join(tr.Spec.Audiences, ",")}
		default:
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, User: user, Audiences: tr.Spec.Audiences}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(&tr)
	}))
	t.Cleanup(ts.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host:            ts.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: pemCert(ts.Certificate())},
		ContentConfig:   rest.ContentConfig{ContentType: "application/json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func TestTokenAuthentication(t *testing.T) {
	const aud = "system:konnectivity-server"
	agentUser := authv1.UserInfo{Username: "system:serviceaccount:kube-system:konnectivity-agent"}
	client := fakeTokenReview(t,
		map[string]authv1.UserInfo{
			"good-token":      agentUser,
			"wrong-aud-token": agentUser,
			"wrong-sa-token":  {Username: "system:serviceaccount:default:intruder"},
		},
		map[string][]string{
			"good-token":      {aud},
			"wrong-aud-token": {"https://kubernetes.default.svc"},
			"wrong-sa-token":  {aud},
		})
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterCA = "" // agents present tokens, no certificates
	cfg.TokenAuth = &TokenAuth{Namespace: "kube-system", ServiceAccount: "konnectivity-agent", Audience: aud, Client: client}
	s := start(t, cfg)

	for _, chk := range s.ReadyChecks() {
		if err := chk.Check(&http.Request{}); err != nil {
			t.Errorf("readiness %s: %v", chk.Name(), err)
		}
	}

	tokenFile := func(name, tok string) string {
		f := filepath.Join(e.dir, name)
		if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		return "--service-account-token-path=" + f
	}
	for _, tc := range []struct{ id, token, wantErr string }{
		{"agent-wrong-aud", "wrong-aud-token", "invalid for the target audiences"},
		{"agent-wrong-sa", "wrong-sa-token", `"default" namespace`},
	} {
		startUpstreamAgent(t, e, tc.id, s.agentPort(), tokenFile(tc.id, tc.token))
		deadline := time.Now().Add(15 * time.Second)
		var got AgentStatus
		for time.Now().Before(deadline) {
			for _, a := range s.Status().Agents {
				if a.ID == tc.id {
					got = a
				}
			}
			if got.LastError != "" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got.Connected || !strings.Contains(got.LastError, tc.wantErr) {
			t.Errorf("%s: want rejected with %q, got %+v", tc.id, tc.wantErr, got)
		}
		if strings.Contains(got.LastError, tc.token) {
			t.Errorf("%s: the token appears in the recorded error", tc.id)
		}
	}
	startUpstreamAgent(t, e, "agent-good", s.agentPort(), tokenFile("good", "good-token"))
	s.waitAgents(t, 1)
	web := startHTTPBackend(t)
	c := dial(t, s.frontend("grpc"), web)
	defer c.Close()
	if res, _ := httpGet(t, c, web, "/"); res.StatusCode != 200 {
		t.Fatalf("status %s", res.Status)
	}
}

func TestTokenReviewReadiness(t *testing.T) {
	// A kube-apiserver that cannot be reached makes the server not ready.
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + harness.ClosedAddr(t), TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterCA = ""
	cfg.TokenAuth = &TokenAuth{Namespace: "kube-system", ServiceAccount: "a", Audience: "x", Client: cs}
	s := start(t, cfg)
	logs := harness.CaptureKlog(t)
	var failed bool
	for _, chk := range s.ReadyChecks() {
		if chk.Name() == "tokenreview" {
			err := chk.Check(&http.Request{})
			failed = err != nil && strings.Contains(err.Error(), "connection refused")
			if !failed {
				t.Errorf("tokenreview check: %v", err)
			}
		}
	}
	if !failed {
		t.Error("no failing tokenreview check")
	}
	// /readyz?verbose withholds the reason, so the log gives it.
	if l := logs(); !strings.Contains(l, "agents cannot authenticate") || !strings.Contains(l, "connection refused") {
		t.Errorf("the failing TokenReview is not logged with its reason:\n%s", l)
	}
}

func TestWrongCARejected(t *testing.T) {
	e := newEnv(t)
	s := start(t, e.config("grpc"))
	other := newCA(t, e.dir, "other")
	badCert, badKey, _ := other.issue(t, e.dir, "bad-agent", true)

	// The handshake itself fails for a certificate from another CA.
	pair, err := tls.LoadX509KeyPair(badCert, badKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(e.ca.Cert.Cert)
	c, err := tls.Dial("tcp", s.AgentAddr(), &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, NextProtos: []string{"h2"}})
	if err == nil {
		// TLS 1.3 reports the client-certificate failure on the first read.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("handshake with a foreign CA's cert: %v", err)
	}

	// And upstream's agent with such a certificate never gets connected, while one from the cluster CA does.
	startUpstreamAgent(t, e, "bad", s.agentPort(), "--agent-cert="+badCert, "--agent-key="+badKey)
	startUpstreamAgent(t, e, "good", s.agentPort())
	s.waitAgents(t, 1)
	time.Sleep(500 * time.Millisecond) // give the bad agent several retries
	for _, a := range s.Status().Agents {
		if a.ID == "bad" && a.Connected {
			t.Fatal("agent with a foreign CA's certificate is connected")
		}
	}
}

// TestClusterAllowedNames: with allowed names, a client certificate from the cluster CA is not enough; its
// common name must be one of them (a kubelet's certificate from kubeadm's CA is not an agent's).
func TestClusterAllowedNames(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.ClusterAllowedNames = []string{"agent"} // the CN of e.agentCert
	s := start(t, cfg)
	nodeCert, nodeKey, _ := e.ca.issue(t, e.dir, "system:node:w1", true)
	startUpstreamAgent(t, e, "impostor", s.agentPort(), "--agent-cert="+nodeCert, "--agent-key="+nodeKey)
	startUpstreamAgent(t, e, "good", s.agentPort())
	s.waitAgents(t, 1)
	time.Sleep(500 * time.Millisecond) // give the impostor several retries
	for _, a := range s.Status().Agents {
		if a.ID == "impostor" && a.Connected {
			t.Fatal("an agent whose certificate CN is not allowed is connected")
		}
	}

	bad := e.config("grpc")
	bad.ClusterCA = ""
	bad.ClusterAllowedNames = []string{"agent"}
	if _, err := New(bad); err == nil || !strings.Contains(err.Error(), "ClusterAllowedNames") {
		t.Fatalf("allowed names without a CA: %v", err)
	}
}

func servedSerial(t *testing.T, addr string) *big.Int {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

// TestClusterCertReload: a renewed --cluster-cert is served to new agent connections without a restart,
// and a tunnel open during the renewal keeps working.
func TestClusterCertReload(t *testing.T) {
	e := newEnv(t)
	s := start(t, e.config("grpc"))
	startUpstreamAgent(t, e, "agent-1", s.agentPort())
	s.waitAgents(t, 1)
	echo := harness.StartEcho(t).Addr
	c := dial(t, s.frontend("grpc"), echo)
	defer c.Close()
	echoRoundTrip(t, c, 1<<20, 64<<10)

	old := servedSerial(t, s.AgentAddr())
	_, _, renewed := e.ca.issue(t, e.dir, "server", false) // same files, new certificate
	if renewed.Cmp(old) == 0 {
		t.Fatal("test bug: same serial")
	}
	deadline := time.Now().Add(10 * time.Second)
	for servedSerial(t, s.AgentAddr()).Cmp(renewed) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("renewed certificate not served")
		}
		time.Sleep(100 * time.Millisecond)
	}
	echoRoundTrip(t, c, 1<<20, 64<<10) // the open tunnel survived
	startUpstreamAgent(t, e, "agent-2", s.agentPort())
	s.waitAgents(t, 2)
}

func TestUDS(t *testing.T) {
	base, err := os.MkdirTemp("", "ku")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e := newEnv(t)

	t.Run("modes", func(t *testing.T) {
		cfg := e.config("grpc")
		cfg.UDSName = filepath.Join(base, "new", "s.sock")
		s := start(t, cfg)
		for path, want := range map[string]os.FileMode{cfg.UDSName: socketMode, filepath.Dir(cfg.UDSName): socketDirMode} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
			}
		}
		// A live socket is refused.
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), "another server is listening") {
			t.Fatalf("second server on a live socket: %v", err)
		}
		s.Stop(t)
	})
	t.Run("stale", func(t *testing.T) {
		path := filepath.Join(base, "stale.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
		cfg := e.config("grpc")
		cfg.UDSName = path
		cfg.DeleteExistingUDS = false
		if _, err := New(cfg); !errors.Is(err, uds.ErrStale) {
			t.Fatalf("stale socket without DeleteExistingUDS: %v", err)
		}
		cfg.DeleteExistingUDS = true
		s := start(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := s.frontend("grpc").Dial(ctx, "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "No agent available") {
			t.Fatalf("server on the replaced socket does not answer: %v", err)
		}
	})
	t.Run("not-a-socket", func(t *testing.T) {
		path := filepath.Join(base, "file")
		os.WriteFile(path, []byte("keep me"), 0o600)
		cfg := e.config("grpc")
		cfg.UDSName = path
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("regular file: %v", err)
		}
		if b, _ := os.ReadFile(path); string(b) != "keep me" {
			t.Fatal("regular file was touched")
		}
	})
	t.Run("world-writable-dir", func(t *testing.T) {
		dir := filepath.Join(base, "open")
		os.Mkdir(dir, 0o777)
		os.Chmod(dir, 0o777)
		cfg := e.config("grpc")
		cfg.UDSName = filepath.Join(dir, "s.sock")
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "writable by everyone") {
			t.Fatalf("world-writable dir: %v", err)
		}
		// Unless the config says the directory is shared (an emptyDir volume of one pod).
		cfg.UDSSharedDir = true
		s, err := New(cfg)
		if err != nil {
			t.Fatalf("world-writable dir with UDSSharedDir: %v", err)
		}
		s.closeListeners()
	})
	t.Run("agent-port-in-use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cfg := e.config("grpc")
		cfg.UDSName = filepath.Join(base, "inuse.sock")
		cfg.AgentAddr = ln.Addr().String()
		_, err = New(cfg)
		var fe *field.Error
		if err == nil || !strings.Contains(err.Error(), "address already in use") || !errors.As(err, &fe) || !slices.Equal(fe.Fields(), []string{"AgentAddr"}) {
			t.Fatalf("agent port in use: %v", err)
		}
		// Nothing stays bound after the failure.
		if _, err := os.Stat(cfg.UDSName); err == nil {
			t.Error("socket left behind by a failed New")
		}
	})
}
