package initcmd

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// secretTLSCert returns tls.crt of the Secret in OUT/secret.yaml.
func secretTLSCert(t *testing.T, out string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(out, "secret.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := yaml.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return string(s.Data[corev1.TLSCertKey])
}

func readString(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// An expired serving CA: certs webhook (also with --force) and rotate-ca refuse it and name the renew
// command, and that command works on the directory.
func TestCertsRenewExpiredServingCA(t *testing.T) {
	hooks := filepath.Join(t.TempDir(), "hooks.yaml")
	if err := os.WriteFile(hooks, []byte(testWebhooks), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "hook")
	past := time.Now().Add(-pki.DefaultCAValidity - 24*time.Hour)
	cfg := pki.Config{Dir: filepath.Join(out, pki.PKISubdir), KeyAlgorithm: pki.ECDSAP256, Now: func() time.Time { return past }}
	if _, _, err := pki.EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	webhook := []string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out, hooks}
	advice := "konnect certs renew apiservice-ca --dir " + out
	for _, args := range [][]string{webhook, append(webhook, "--force"), {"certs", "rotate-ca", "--out", out, "--step", "1"}} {
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), advice) {
			t.Fatalf("konnect %s: %v, want %q", strings.Join(args, " "), err, advice)
		}
	}
	stdout := mustRun(t, "certs", "renew", "apiservice-ca", "--dir", out)
	if !strings.Contains(stdout, "[renewed] "+filepath.Join(out, "pki", "ca.crt")) {
		t.Fatalf("renew apiservice-ca:\n%s", stdout)
	}
	// No manifests yet (the refused run wrote none): the output says how to write them.
	if !strings.Contains(stdout, "next: run konnect certs apiservice or konnect certs webhook again with --out "+out) {
		t.Fatalf("renew apiservice-ca without manifests does not say how to write them:\n%s", stdout)
	}
	// The serving certificate expired with its CA: --force renews it now.
	mustRun(t, append(webhook, "--force")...)
	if cas := caBundleOf(t, filepath.Join(out, "hooks.yaml")); len(cas) != 1 || !cas[0].NotAfter.After(time.Now()) {
		t.Fatalf("caBundle after renewal: %v", cas)
	}

	// Renewing again rewrites the Secret and the caBundles to match, and says to apply them.
	stdout = mustRun(t, "certs", "renew", "apiservice-ca", "all", "--dir", out)
	if got, want := secretTLSCert(t, out), readString(t, filepath.Join(out, "pki", "tls.crt")); got != want {
		t.Fatalf("secret.yaml does not carry the renewed tls.crt:\n%s", stdout)
	}
	block, _ := pem.Decode([]byte(readString(t, filepath.Join(out, "pki", "ca.crt"))))
	if cas := caBundleOf(t, filepath.Join(out, "hooks.yaml")); len(cas) != 1 || block == nil || !bytes.Equal(cas[0].Raw, block.Bytes) {
		t.Fatalf("the caBundle is not the renewed ca.crt:\n%s", stdout)
	}
	if !strings.Contains(stdout, "next: apply "+out+" again (kubectl apply -k "+out+")") {
		t.Fatalf("renew does not say to apply the directory:\n%s", stdout)
	}
	// certs webhook agrees with what renew wrote.
	before := sums(t, out)
	mustRun(t, webhook...)
	if c := changed(before, sums(t, out)); len(c) > 0 {
		t.Fatalf("certs webhook after renew changed %v", c)
	}
}

// renew all in a certs apiservice directory renews tls.crt and writes the Secret as certs apiservice does.
func TestCertsRenewAPIServiceDir(t *testing.T) {
	out := filepath.Join(t.TempDir(), "api")
	args := []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1", "--out", out, "--key-algorithm", "ecdsa-p256"}
	mustRun(t, args...)
	tlsBefore := readString(t, filepath.Join(out, "pki", "tls.crt"))
	keyBefore := readString(t, filepath.Join(out, "pki", "tls.key"))
	stdout := mustRun(t, "certs", "renew", "all", "--dir", out)
	tls := readString(t, filepath.Join(out, "pki", "tls.crt"))
	if tls == tlsBefore || readString(t, filepath.Join(out, "pki", "tls.key")) != keyBefore {
		t.Fatalf("renew all did not renew tls.crt with its key:\n%s", stdout)
	}
	if secretTLSCert(t, out) != tls || !strings.Contains(stdout, "[updated] "+filepath.Join(out, "secret.yaml")) {
		t.Fatalf("secret.yaml does not carry the renewed tls.crt:\n%s", stdout)
	}
	before := sums(t, out)
	mustRun(t, args...)
	if c := changed(before, sums(t, out)); len(c) > 0 {
		t.Fatalf("certs apiservice after renew changed %v", c)
	}
}

// check-expiration on a certs webhook directory lists the serving certificate, which expires first, under
// the name certs renew takes.
func TestCertsCheckExpirationServingDir(t *testing.T) {
	out := filepath.Join(t.TempDir(), "hook")
	mustRun(t, "certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out, "--key-algorithm", "ecdsa-p256", "--cert-validity-period", "168h")
	text := mustRun(t, "certs", "check-expiration", "--dir", out)
	for _, want := range []string{"apiservice-ca ", "apiservice-serving ", filepath.Join(out, "pki", "tls.crt")} {
		if !strings.Contains(text, want) {
			t.Errorf("check-expiration does not list %q:\n%s", want, text)
		}
	}
	js := mustRun(t, "certs", "check-expiration", "--dir", out, "-o", "json")
	var doc struct {
		Certificates []pki.Expiration `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil || len(doc.Certificates) != 2 {
		t.Fatalf("%v\n%s", err, js)
	}
	if e := doc.Certificates[1]; e.Name != pki.APIServiceServing || e.Residual != "6d" || e.CA || e.External {
		t.Fatalf("%+v", e)
	}
	stdout := mustRun(t, "certs", "renew", doc.Certificates[1].Name, "--dir", out)
	if !strings.Contains(stdout, "[renewed] "+filepath.Join(out, "pki", "tls.crt")) {
		t.Fatalf("renew %s:\n%s", doc.Certificates[1].Name, stdout)
	}
}

// rotate-ca keeps what certs webhook was given: the key algorithm and the lifetimes.
func TestRotateCAKeepsAlgorithmAndLifetimes(t *testing.T) {
	out := filepath.Join(t.TempDir(), "hook")
	mustRun(t, "certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out,
		"--key-algorithm", "ecdsa-p384", "--ca-validity-period", "720h", "--cert-validity-period", "168h")
	for _, step := range []string{"1", "2", "3"} {
		mustRun(t, "certs", "rotate-ca", "--out", out, "--step", step)
	}
	for file, life := range map[string]time.Duration{"ca": 720 * time.Hour, "tls": 168 * time.Hour} {
		block, _ := pem.Decode([]byte(readString(t, filepath.Join(out, "pki", file+".crt"))))
		if block == nil {
			t.Fatalf("%s.crt: no PEM", file)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		pub, ok := c.PublicKey.(*ecdsa.PublicKey)
		if !ok || pub.Curve != elliptic.P384() {
			t.Errorf("after the rotation %s.crt has a %T key, want ECDSA P-384", file, c.PublicKey)
		}
		// NotBefore is backdated by five minutes for clock skew.
		if got := c.NotAfter.Sub(c.NotBefore) - 5*time.Minute; got != life {
			t.Errorf("after the rotation %s.crt is valid for %s, want %s", file, got, life)
		}
	}
}

// check-expiration on a directory without certificates fails in JSON as in text, and prints nothing.
func TestCheckExpirationNoCertificates(t *testing.T) {
	dir := t.TempDir()
	for _, format := range []string{"text", "json"} {
		stdout, err := run(t, "certs", "check-expiration", "--dir", dir, "-o", format)
		if err == nil || !strings.Contains(err.Error(), "no certificates found in "+filepath.Join(dir, "pki")) || !strings.Contains(err.Error(), "--dir") {
			t.Errorf("-o %s: %v", format, err)
		}
		if stdout != "" {
			t.Errorf("-o %s printed %q", format, stdout)
		}
	}
}

// check-expiration with one certificate corrupt still lists the others, in text and JSON, shows the bad one
// with its error, and fails naming its file.
func TestCheckExpirationAroundUnreadable(t *testing.T) {
	out := filepath.Join(t.TempDir(), "hook")
	mustRun(t, "certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out, "--key-algorithm", "ecdsa-p256")
	bad := filepath.Join(out, "pki", "tls.crt")
	if err := os.WriteFile(bad, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"text", "json"} {
		stdout, err := run(t, "certs", "check-expiration", "--dir", out, "-o", format)
		if err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("-o %s: error %v, want one naming %s", format, err, bad)
		}
		for _, want := range []string{"apiservice-ca", "apiservice-serving", bad} {
			if !strings.Contains(stdout, want) {
				t.Errorf("-o %s does not list %q:\n%s", format, want, stdout)
			}
		}
		if format == "text" && !strings.Contains(stdout, "unreadable") {
			t.Errorf("the text does not say which certificate is unreadable:\n%s", stdout)
		}
	}
}

// rotate-ca --step 3 on a directory that never rotated fails and says to start with step 1; after a
// finished rotation it is done, and says so.
func TestRotateCAStep3WithoutRotation(t *testing.T) {
	out := filepath.Join(t.TempDir(), "hook")
	mustRun(t, "certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out, "--key-algorithm", "ecdsa-p256")
	before := sums(t, out)
	stdout, err := run(t, "certs", "rotate-ca", "--out", out, "--step", "3")
	if err == nil || !strings.Contains(err.Error(), "--step 3") || !strings.Contains(err.Error(), "no rotation was started") || !strings.Contains(err.Error(), "next step is 1") {
		t.Fatalf("step 3 first: %v\n%s", err, stdout)
	}
	if strings.Contains(stdout, "complete") {
		t.Fatalf("step 3 first says the rotation is complete:\n%s", stdout)
	}
	if c := changed(before, sums(t, out)); len(c) > 0 {
		t.Fatalf("step 3 first changed %v", c)
	}
	for _, step := range []string{"1", "2", "3"} {
		mustRun(t, "certs", "rotate-ca", "--out", out, "--step", step)
	}
	if stdout := mustRun(t, "certs", "rotate-ca", "--out", out, "--step", "3"); !strings.Contains(stdout, "Step 3 was already done") {
		t.Fatalf("step 3 again after a rotation:\n%s", stdout)
	}
}

// An expired serving certificate: rotate-ca, which has no --force, names the command that renews it, and
// after that command the step goes through.
func TestRotateCAExpiredServingCert(t *testing.T) {
	hooks := filepath.Join(t.TempDir(), "hooks.yaml")
	if err := os.WriteFile(hooks, []byte(testWebhooks), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "hook")
	webhook := []string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out, hooks}
	past := time.Now().Add(-pki.DefaultCertValidity - 24*time.Hour)
	cfg := pki.Config{Dir: filepath.Join(out, pki.PKISubdir), KeyAlgorithm: pki.ECDSAP256, Now: func() time.Time { return past }}
	if _, _, err := pki.EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	mustRun(t, append(webhook, "--force")...) // renews tls.crt, which expired
	mustRun(t, "certs", "rotate-ca", "--out", out, "--step", "1")
	// Now tls.crt expires again, issued by ca.crt as before step 2.
	expired := pki.Config{Dir: cfg.Dir, KeyAlgorithm: pki.ECDSAP256, Now: func() time.Time { return past }, Force: true}
	if _, _, err := pki.EnsureServing(expired, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	advice := "konnect certs renew apiservice-serving --dir " + out
	for _, step := range []string{"2", "3"} {
		_, err := run(t, "certs", "rotate-ca", "--out", out, "--step", step)
		if err == nil || !strings.Contains(err.Error(), advice) || strings.Contains(err.Error(), "--force") {
			t.Fatalf("rotate-ca --step %s: %v, want %q and no --force", step, err, advice)
		}
	}
	mustRun(t, "certs", "renew", "apiservice-serving", "--dir", out)
	mustRun(t, "certs", "rotate-ca", "--out", out, "--step", "2")
}
