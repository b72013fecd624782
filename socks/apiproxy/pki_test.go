package apiproxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	caKey := mustKey(tb)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "apiproxy-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := &testPKI{dir: dir, pool: x509.NewCertPool(), clientCN: "jane"}
	p.pool.AddCert(ca)
	p.caFile = writePEM(tb, dir, "ca.crt", "CERTIFICATE", caDER)

	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		k := mustKey(tb)
		t := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, t, ca, &k.PublicKey, caKey)
		if err != nil {
			tb.Fatal(err)
		}
		return der, k
	}
	sDER, sKey := leaf(2, "apiserver", x509.ExtKeyUsageServerAuth)
	p.serverTLS = tls.Certificate{Certificate: [][]byte{sDER}, PrivateKey: sKey}
	cDER, cKey := leaf(3, p.clientCN, x509.ExtKeyUsageClientAuth)
	p.clientCert = writePEM(tb, dir, "client.crt", "CERTIFICATE", cDER)
	kDER, err := x509.MarshalECPrivateKey(cKey)
	if err != nil {
		tb.Fatal(err)
	}
	p.clientKey = writePEM(tb, dir, "client.key", "EC PRIVATE KEY", kDER)
	return p
}

func mustKey(tb testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func writePEM(tb testing.TB, dir, name, typ string, der []byte) string {
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
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
