package initcmd

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/pkitest"
)

// A tls.crt that openssl wrote with its curve parameters first ("openssl ecparam ... -out") still names its
// Service: servingRef reads the first CERTIFICATE block, not the first block.
func TestServingRefSkipsLeadingBlocks(t *testing.T) {
	dir := t.TempDir()
	ca := pkitest.NewCA(t, "test-ca")
	leaf := ca.Server(t, "api.pizza.svc", "api.pizza.svc")
	params := "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n" // prime256v1
	if err := os.MkdirAll(filepath.Join(dir, pki.PKISubdir), 0o755); err != nil {
		t.Fatal(err)
	}
	pkitest.WriteFile(t, filepath.Join(dir, pki.PKISubdir, "tls.crt"), append([]byte(params), leaf.CertPEM...))
	ref, err := servingRef(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Name != "api" || ref.Namespace != "pizza" {
		t.Errorf("servingRef = %+v, want api in pizza", ref)
	}

	pkitest.WriteFile(t, filepath.Join(dir, pki.PKISubdir, "tls.crt"), []byte(params))
	if _, err := servingRef(dir); err == nil || err.Error() != filepath.Join(dir, pki.PKISubdir, "tls.crt")+": no PEM certificate" {
		t.Errorf("servingRef of a file without a certificate = %v", err)
	}
}
