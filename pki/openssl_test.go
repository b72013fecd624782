package pki

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func opensslOrSkip(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl not installed")
	}
	return p
}

func openssl(t *testing.T, bin, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestOpenSSLIssuedFiles: a CA made with openssl (as on a node set up by hand) is kept and used, and a
// client certificate issued with the openssl recipe from the Kubernetes documentation's Konnectivity
// set-up is accepted, with and without the CA key on the node.
func TestOpenSSLIssuedFiles(t *testing.T) {
	bin := opensslOrSkip(t)
	cfg := testConfig(t)
	cfg.KeyAlgorithm = RSA2048
	dir := cfg.PKIDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	openssl(t, bin, dir, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
		"-subj", "/CN=kubernetes", "-days", "3650",
		"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
	openssl(t, bin, dir, "req", "-subj", "/CN=system:konnectivity-server", "-new", "-newkey", "rsa:2048", "-nodes",
		"-out", "k.csr", "-keyout", "konnectivity-server-client.key")
	openssl(t, bin, dir, "x509", "-req", "-in", "k.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
		"-out", "konnectivity-server-client.crt", "-days", "375", "-sha256")
	os.Remove(filepath.Join(dir, "k.csr"))
	os.Remove(filepath.Join(dir, "ca.srl"))
	caBefore := snapshot(t, dir)

	res := mustEnsure(t, cfg)
	if r := resultByName(t, res, CA); r.Action != Kept {
		t.Fatalf("openssl CA: %+v", r)
	}
	if r := resultByName(t, res, KonnectivityServerClient); r.Action != Kept {
		t.Fatalf("openssl-issued client certificate: %+v", r)
	}
	for _, f := range []string{"ca.crt", "ca.key", "konnectivity-server-client.crt", "konnectivity-server-client.key"} {
		p := filepath.Join(dir, f)
		if snapshot(t, dir)[p] != caBefore[p] {
			t.Errorf("%s rewritten", f)
		}
	}
	// What konnect signed with the openssl CA verifies with openssl.
	openssl(t, bin, dir, "verify", "-purpose", "sslserver", "-CAfile", "ca.crt", "konnectivity-server.crt")

	// Renewed, the CA keeps its subject as openssl encoded it (UTF8String, where Go writes
	// PrintableString), so that what it signed still chains to it.
	if _, err := Renew(cfg, CA); err != nil {
		t.Fatal(err)
	}
	for _, r := range mustEnsure(t, cfg) {
		if r.Action != Kept {
			t.Errorf("after renewing the openssl CA: %s %s %s", r.Name, r.Action, r.Reason)
		}
	}
	openssl(t, bin, dir, "verify", "-CAfile", "ca.crt", "konnectivity-server-client.crt")

	// The same files with the CA key taken off the node: an external CA.
	os.Remove(filepath.Join(dir, "ca.key"))
	res = mustEnsure(t, cfg)
	if r := resultByName(t, res, KonnectivityServerClient); r.Action != Kept || !r.External {
		t.Fatalf("external: %+v", r)
	}
	// renew all renews what konnect's own CAs signed, and leaves the rest to whoever holds the CA's key.
	res, err := Renew(cfg, All)
	if err != nil {
		t.Fatal(err)
	}
	if r := resultByName(t, res, KonnectivityServerClient); r.Action != Kept || !r.External || !strings.Contains(r.Reason, "external CA") {
		t.Errorf("renew all, external CA's leaf: %+v", r)
	}
	if r := resultByName(t, res, FrontProxyClient); r.Action != Renewed {
		t.Errorf("renew all, the front-proxy CA's leaf: %+v", r)
	}
}
