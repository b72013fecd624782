package apiproxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// testPKI is a throw-away CA with a serving certificate for 127.0.0.1 and a client certificate, written
// to a temporary directory the way a kubeconfig refers to them.
type testPKI struct {
	dir        string
	caFile     string
	clientCert string
	clientKey  string
	serverTLS  tls.Certificate
	pool       *x509.CertPool
	clientCN   string
}

func newTestPKI(tb testing.TB) *testPKI {
	tb.Helper()
	dir := tb.TempDir()
	ca := pkitest.NewCA(tb, "apiproxy-test-ca")
	p := &testPKI{dir: dir, pool: ca.Pool(), clientCN: "jane", caFile: ca.WriteCert(tb, filepath.Join(dir, "ca.crt"))}
	loopback := []string{"127.0.0.1", "::1"}
	p.serverTLS = ca.Issue(tb, pkitest.Spec{CN: "apiserver", Hosts: loopback, Server: true}).TLS()
	p.clientCert, p.clientKey = ca.Issue(tb, pkitest.Spec{CN: p.clientCN, Hosts: loopback, Client: true}).Write(tb, dir, "client")
	return p
}

// newTLSBackend starts an HTTPS server that, like kube-apiserver, accepts HTTP/2 and requires a client
// certificate from the test CA (or, with token set, a bearer token instead).
func (p *testPKI) newTLSBackend(tb testing.TB, token string, h http.Handler) *httptest.Server {
	tb.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case token != "" && r.Header.Get("Authorization") == "Bearer "+token:
		case r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == p.clientCN:
		default:
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{p.serverTLS}, ClientCAs: p.pool, ClientAuth: tls.VerifyClientCertIfGiven}
	if token == "" {
		srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
	}
	srv.StartTLS()
	tb.Cleanup(srv.Close)
	return srv
}

// kubeconfig writes a kubeconfig for server with either the client certificate or the token, and loads it
// back through clientcmd as the command does.
func (p *testPKI) kubeconfig(tb testing.TB, server, token string) (string, *rest.Config) {
	tb.Helper()
	user := fmt.Sprintf("    client-certificate: %s\n    client-key: %s\n", p.clientCert, p.clientKey)
	if token != "" {
		user = fmt.Sprintf("    token: %s\n", token)
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: test
  user:
%scontexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, server, p.caFile, user)
	path := filepath.Join(tb.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		tb.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		tb.Fatal(err)
	}
	return path, rc
}

type clientcmdExecConfig = clientcmdapi.ExecConfig
