package pkitest

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/keyutil"
)

// TestChainAndFiles: a leaf verifies against its CA for its hosts and usage only, and survives a round trip
// through files.
func TestChainAndFiles(t *testing.T) {
	ca := NewCA(t, "test-ca")
	leaf := ca.Server(t, "server", "127.0.0.1", "localhost")
	opts := x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		opts.DNSName = host
		if _, err := leaf.Cert.Verify(opts); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}
	opts.DNSName = "example.com"
	if _, err := leaf.Cert.Verify(opts); err == nil {
		t.Error("verified for a host not in its SANs")
	}
	opts.DNSName, opts.KeyUsages = "localhost", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, err := leaf.Cert.Verify(opts); err == nil {
		t.Error("a serving certificate verified as a client certificate")
	}
	if _, err := NewCA(t, "other-ca").Server(t, "x", "localhost").Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "localhost"}); err == nil {
		t.Error("another CA's leaf verified")
	}

	dir := t.TempDir()
	certFile, keyFile := leaf.Write(t, dir, "server")
	back, err := Load(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Cert.Equal(leaf.Cert) || filepath.Dir(certFile) != dir {
		t.Fatal("certificate changed on disk")
	}

	expired := ca.Issue(t, Spec{CN: "old", Client: true, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if _, err := expired.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("an expired certificate verified")
	}
}

// TestKubeconfigAndServiceAccountKeys: client-go loads the kubeconfig with the client's credentials, and the
// token signing keys parse as kube-apiserver reads them.
func TestKubeconfigAndServiceAccountKeys(t *testing.T) {
	ca := NewCA(t, "ca")
	admin := ca.Client(t, "admin", "system:masters")
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.conf")
	if err := WriteKubeconfig(path, clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: ca.CertPEM}, admin.User()); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || !bytes.Equal(cfg.CAData, ca.CertPEM) || !bytes.Equal(cfg.CertData, admin.CertPEM) || !bytes.Equal(cfg.KeyData, admin.KeyPEM) {
		t.Errorf("kubeconfig loads as host %q with other credentials", cfg.Host)
	}

	pub, priv, err := WriteServiceAccountKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := keyutil.PublicKeysFromFile(pub); err != nil || len(keys) != 1 {
		t.Errorf("%s: %d keys, %v", pub, len(keys), err)
	}
	if _, err := keyutil.PrivateKeyFromFile(priv); err != nil {
		t.Errorf("%s: %v", priv, err)
	}
	if fi, err := os.Stat(priv); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v", priv, fi.Mode())
	}
}
