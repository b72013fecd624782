package pkitest

import (
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"
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
