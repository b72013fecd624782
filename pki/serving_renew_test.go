package pki

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
)

// servingSpec returns the spec of name in the serving table.
func servingSpec(t *testing.T, name string) *Spec {
	t.Helper()
	s, ok := Lookup(ServingSpecs("hook", "pizza", ServingFromNext), name)
	if !ok {
		t.Fatalf("no serving spec %q", name)
	}
	return s
}

// An expired serving CA is refused with advice that works: konnect certs renew apiservice-ca --dir OUT
// re-signs it with its key in OUT/pki, and then the serving certificate can be renewed too.
func TestRenewExpiredServingCA(t *testing.T) {
	out := t.TempDir()
	dir := filepath.Join(out, PKISubdir)
	past := time.Now().Add(-DefaultCAValidity - 24*time.Hour)
	if _, _, err := EnsureServing(Config{Dir: dir, KeyAlgorithm: ECDSAP256, Now: func() time.Time { return past }}, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	caSpec, tlsSpec := servingSpec(t, APIServiceCA), servingSpec(t, APIServiceServing)
	oldCA, oldTLS := loadCert(t, caSpec.CertFile(dir)), loadCert(t, tlsSpec.CertFile(dir))

	advice := "konnect certs renew " + APIServiceCA + " Dir " + out
	snap := snapshot(t, out)
	if _, _, err := EnsureServing(Config{Dir: dir, Force: true}, "hook", "pizza"); err == nil || !strings.Contains(err.Error(), advice) {
		t.Fatalf("EnsureServing with an expired CA: %v, want %q", err, advice)
	}
	if _, _, _, err := RotateServingCA(Config{Dir: dir}, "hook", "pizza", 1); err == nil || !strings.Contains(err.Error(), advice) {
		t.Fatalf("rotation step 1 with an expired CA: %v, want %q", err, advice)
	}
	if d := diffSnapshots(snap, snapshot(t, out)); len(d) > 0 {
		t.Fatalf("refused calls wrote %v", d)
	}

	// The names are the serving table's; the control plane's are unknown here.
	if _, err := Renew(Config{Dir: out}, CA); err == nil || !strings.Contains(err.Error(), `unknown certificate "ca"`) || !strings.Contains(err.Error(), APIServiceCA) {
		t.Fatalf("Renew(ca) in a serving directory: %v", err)
	}
	res, err := Renew(Config{Dir: out}, APIServiceCA)
	if err != nil || len(res) != 1 || res[0].Name != APIServiceCA || res[0].Action != Renewed {
		t.Fatalf("Renew(%s): %+v %v", APIServiceCA, res, err)
	}
	ca := loadCert(t, caSpec.CertFile(dir))
	if !ca.NotAfter.After(time.Now()) || ca.Subject.String() != oldCA.Subject.String() || !samePublicKey(ca.PublicKey, oldCA.PublicKey) {
		t.Fatalf("renewed CA: %v %v", ca.NotAfter, ca.Subject)
	}
	// The serving certificate, expired with its CA, still chains to the renewed CA, and is renewed with
	// its key, SANs and subject.
	if err := oldTLS.CheckSignatureFrom(ca); err != nil {
		t.Fatalf("the serving certificate no longer chains to the renewed CA: %v", err)
	}
	if _, err := Renew(Config{Dir: out}, All); err != nil {
		t.Fatal(err)
	}
	tls := loadCert(t, tlsSpec.CertFile(dir))
	if !tls.NotAfter.After(time.Now()) || tls.Subject.String() != oldTLS.Subject.String() || !slices.Equal(tls.DNSNames, oldTLS.DNSNames) ||
		!samePublicKey(tls.PublicKey, oldTLS.PublicKey) || !slices.Equal(tls.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Fatalf("renewed serving certificate: %v %v %v", tls.NotAfter, tls.Subject, tls.DNSNames)
	}
	res, b, err := EnsureServing(Config{Dir: dir}, "hook", "pizza")
	if err != nil || !trusts(t, b.CA, b) {
		t.Fatalf("after renewal: %v", err)
	}
	for _, r := range res {
		if r.Action != Kept {
			t.Errorf("after renewal, %s %s", r.Name, r.Action)
		}
	}

	// A serving certificate's name given with a control plane's directory, or the pki directory itself,
	// says which directory --dir wants.
	var fe *field.Error
	if _, err := Renew(Config{Dir: dir}, APIServiceCA); !errors.As(err, &fe) || !slices.Equal(fe.Fields(), []string{"Dir"}) {
		t.Fatalf("Renew(%s) one level too deep: %v", APIServiceCA, err)
	}
}

// In the middle of a rotation, renewing the serving certificate signs it with the CA that issued it.
func TestRenewServingDuringRotation(t *testing.T) {
	out := t.TempDir()
	dir := filepath.Join(out, PKISubdir)
	cfg := Config{Dir: dir, KeyAlgorithm: ECDSAP256}
	if _, _, err := EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	for step := 1; step <= 2; step++ {
		if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", step); err != nil {
			t.Fatal(err)
		}
		before := loadCert(t, servingSpec(t, APIServiceServing).CertFile(dir))
		res, err := Renew(Config{Dir: out}, All)
		if err != nil || len(res) != 1 || res[0].Name != APIServiceServing {
			t.Fatalf("after step %d: %+v %v", step, res, err)
		}
		after := loadCert(t, servingSpec(t, APIServiceServing).CertFile(dir))
		if after.SerialNumber.Cmp(before.SerialNumber) == 0 || after.Issuer.String() != before.Issuer.String() ||
			!samePublicKey(after.PublicKey, before.PublicKey) {
			t.Fatalf("after step %d: renewed %v by %v", step, after.SerialNumber, after.Issuer)
		}
		phase, err := ServingRotationPhase(dir)
		if err != nil || phase != RotationPhase(step) {
			t.Fatalf("after step %d and a renewal: phase %v %v", step, phase, err)
		}
		if _, b, err := EnsureServing(cfg, "hook", "pizza"); err != nil || !trusts(t, b.CA, b) {
			t.Fatalf("after step %d and a renewal: %v", step, err)
		}
	}
	if _, b, _, err := RotateServingCA(cfg, "hook", "pizza", 3); err != nil || !trusts(t, b.CA, b) {
		t.Fatalf("step 3 after a renewal: %v", err)
	}
}

// check-expiration on an extension server's directory lists its certificates under the serving table's
// names, the serving certificate included, through a rotation, and writes nothing.
func TestCheckExpirationServing(t *testing.T) {
	out := t.TempDir()
	dir := filepath.Join(out, PKISubdir)
	cfg := Config{Dir: dir, KeyAlgorithm: ECDSAP256, CAValidity: 720 * time.Hour, CertValidity: 168 * time.Hour}
	if _, _, err := EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	check := func(want map[string]string) {
		t.Helper()
		snap := snapshot(t, out)
		exp, err := CheckExpiration(Config{Dir: out})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, e := range exp {
			if e.External || e.CA != (e.Name != APIServiceServing) {
				t.Errorf("%+v", e)
			}
			got[e.Name] = filepath.Base(e.File) + " " + e.Residual
		}
		if len(got) != len(want) {
			t.Fatalf("check-expiration lists %v, want %v", got, want)
		}
		for n, w := range want {
			if got[n] != w {
				t.Errorf("%s: %q, want %q", n, got[n], w)
			}
		}
		if d := diffSnapshots(snap, snapshot(t, out)); len(d) > 0 {
			t.Fatalf("CheckExpiration wrote %v", d)
		}
	}
	check(map[string]string{APIServiceCA: "ca.crt 29d", APIServiceServing: "tls.crt 6d"})
	if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", 1); err != nil {
		t.Fatal(err)
	}
	check(map[string]string{APIServiceCA: "ca.crt 29d", APIServiceNextCA: "ca-next.crt 29d", APIServiceServing: "tls.crt 6d"})

	// A step 3 cut short between its renames is reported as it is, and left for a writing command to finish.
	if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", 2); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "ca-next.key"), filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	snap := snapshot(t, out)
	if exp, err := CheckExpiration(Config{Dir: out}); err != nil || len(exp) != 3 {
		t.Fatalf("after an interrupted step 3: %+v %v", exp, err)
	}
	if d := diffSnapshots(snap, snapshot(t, out)); len(d) > 0 {
		t.Fatalf("CheckExpiration wrote %v", d)
	}
	// Nor does a dry run finish it: it says that a real run will.
	dry := cfg
	dry.DryRun = true
	const says = "a run without DryRun finishes it"
	if _, err := Renew(Config{Dir: out, DryRun: true}, All); err == nil || !strings.Contains(err.Error(), says) {
		t.Errorf("renew --dry-run: %v", err)
	}
	if _, _, err := EnsureServing(dry, "hook", "pizza"); err == nil || !strings.Contains(err.Error(), says) {
		t.Errorf("EnsureServing, dry run: %v", err)
	}
	if _, _, _, err := RotateServingCA(dry, "hook", "pizza", 3); err == nil || !strings.Contains(err.Error(), says) {
		t.Errorf("step 3, dry run: %v", err)
	}
	if d := diffSnapshots(snap, snapshot(t, out)); len(d) > 0 {
		t.Fatalf("a dry run wrote %v", d)
	}
	if _, err := Renew(Config{Dir: out}, All); err != nil {
		t.Fatalf("renew after the dry runs: %v", err)
	}
}
