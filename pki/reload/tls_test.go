package reload

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/konnect-dev/konnect/pki/pkitest"
)

// A CA bundle keeps its certificates in file order beside the pool, skipping other blocks as the pool does,
// and BundleCert and PairCert report the certificates in use.
func TestBundleAndPairCerts(t *testing.T) {
	dir := t.TempDir()
	a, b := pkitest.NewCA(t, "ca-a"), pkitest.NewCA(t, "ca-b")
	bundle := filepath.Join(dir, "ca.crt")
	data := append(append(append([]byte("# comment\n"), a.CertPEM...), a.KeyPEM...), b.CertPEM...)
	if err := os.WriteFile(bundle, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cas, err := CAPool("CA bundle", bundle)
	if err != nil {
		t.Fatal(err)
	}
	got := cas.Get()
	if len(got.Certs) != 2 || !got.Certs[0].Equal(a.Cert) || !got.Certs[1].Equal(b.Cert) {
		t.Fatalf("bundle certificates %v, want ca-a then ca-b", got.Certs)
	}
	if _, err := a.Cert.Verify(x509.VerifyOptions{Roots: got.Pool}); err != nil {
		t.Errorf("pool does not hold ca-a: %v", err)
	}
	if bc := BundleCert(cas); bc.File != bundle {
		t.Errorf("BundleCert file %q, want %q", bc.File, bundle)
	} else if c, err := bc.InUse(); err != nil || !c.Equal(a.Cert) {
		t.Errorf("BundleCert in use: %v, %v; want ca-a", c.Subject, err)
	}
	if err := os.WriteFile(bundle, a.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CAPool("CA bundle", bundle); err == nil {
		t.Error("a bundle without certificates loaded")
	}

	leaf := a.Server(t, "server", "127.0.0.1")
	certFile, keyFile := leaf.Write(t, dir, "server")
	pair, err := KeyPair("pair", certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if pc := PairCert(pair); pc.File != certFile {
		t.Errorf("PairCert file %q, want %q", pc.File, certFile)
	} else if c, err := pc.InUse(); err != nil || !c.Equal(leaf.Cert) {
		t.Errorf("PairCert in use: %v, %v; want the server certificate", c, err)
	}
}
