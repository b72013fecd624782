package tunnel

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
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
