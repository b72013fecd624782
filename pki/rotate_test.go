package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// trusts reports whether a client holding caBundle accepts the serving pair of b for the Service name.
func trusts(t *testing.T, caBundle []byte, b ServingBundle) bool {
	t.Helper()
	pair, err := tls.X509KeyPair(b.Cert, b.Key)
	if err != nil {
		t.Fatalf("serving pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caBundle) {
		t.Fatal("caBundle holds no certificate")
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "hook.pizza.svc"})
	return err == nil
}

func TestRotateServingCA(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), KeyAlgorithm: ECDSAP256}
	_, before, err := EnsureServing(cfg, "hook", "pizza")
	if err != nil {
		t.Fatal(err)
	}
	rotate := func(step int) ([]Result, ServingBundle, RotationPhase, error) {
		t.Helper()
		return RotateServingCA(cfg, "hook", "pizza", step)
	}
	// Out of order: nothing is written.
	snap := snapshot(t, cfg.Dir)
	if _, _, _, err := rotate(2); !errors.Is(err, ErrRotationOrder) {
		t.Fatalf("step 2 first: %v", err)
	}
	if _, _, _, err := rotate(4); err == nil {
		t.Fatal("step 4 accepted")
	}
	// Step 3 before any rotation is not "already done": no CA was replaced.
	if _, _, _, err := rotate(3); !errors.Is(err, ErrRotationOrder) || !strings.Contains(err.Error(), "no rotation was started") {
		t.Fatalf("step 3 first: %v", err)
	}
	if d := diffSnapshots(snap, snapshot(t, cfg.Dir)); len(d) > 0 {
		t.Fatalf("refused steps wrote %v", d)
	}

	// Each step: the bundle applied after it must trust both the serving certificate that was live before
	// and the one live after, so that no request fails while the cluster catches up.
	live := before
	for _, tc := range []struct {
		step  int
		phase RotationPhase
		cas   int
	}{{1, BundleBoth, 2}, {2, ServingFromNext, 2}, {3, NotRotating, 1}} {
		res, b, phase, err := rotate(tc.step)
		if err != nil || len(res) == 0 || phase != tc.phase {
			t.Fatalf("step %d: %v %v %v", tc.step, res, phase, err)
		}
		if got := len(parseCerts(t, b.CA)); got != tc.cas {
			t.Fatalf("step %d: caBundle holds %d CAs, want %d", tc.step, got, tc.cas)
		}
		if !trusts(t, b.CA, b) {
			t.Fatalf("step %d: the new caBundle does not trust the new serving certificate", tc.step)
		}
		if tc.step != 3 && !trusts(t, b.CA, live) {
			t.Fatalf("step %d: the new caBundle does not trust the serving certificate still in use", tc.step)
		}
		if tc.step == 2 && trusts(t, before.CA, b) {
			t.Fatal("step 2: the serving certificate still chains to the old CA")
		}
		// The same step again changes nothing; the step before it is now out of order.
		snap := snapshot(t, cfg.Dir)
		if res, b2, _, err := rotate(tc.step); err != nil || res != nil || string(b2.CA) != string(b.CA) {
			t.Fatalf("step %d again: %v %v", tc.step, res, err)
		}
		if d := diffSnapshots(snap, snapshot(t, cfg.Dir)); len(d) > 0 {
			t.Fatalf("step %d again wrote %v", tc.step, d)
		}
		if tc.step > 1 && tc.step < 3 {
			if _, _, _, err := rotate(tc.step - 1); !errors.Is(err, ErrRotationOrder) {
				t.Fatalf("step %d after step %d: %v", tc.step-1, tc.step, err)
			}
		}
		// konnect certs apiservice/webhook in the middle of a rotation keeps its files and bundle.
		if _, b3, err := EnsureServing(cfg, "hook", "pizza"); err != nil || string(b3.CA) != string(b.CA) || string(b3.Cert) != string(b.Cert) {
			t.Fatalf("EnsureServing after step %d: %v", tc.step, err)
		}
		live = b
	}
	// The old CA is kept, not lost.
	retired, err := filepath.Glob(filepath.Join(cfg.Dir, RetiredSubdir, "ca-*.key"))
	if err != nil || len(retired) != 1 {
		t.Fatalf("retired CA keys: %v %v", retired, err)
	}
	if old, _ := os.ReadFile(filepath.Join(cfg.Dir, "ca.crt")); string(old) == string(before.CA) {
		t.Fatal("ca.crt is still the old CA after step 3")
	}
}

// A crash between step 3's two renames leaves ca.key new and ca.crt old; the next call finishes it.
func TestRotateServingCAFinishesInterruptedPromotion(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), KeyAlgorithm: ECDSAP256}
	if _, _, err := EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	for _, step := range []int{1, 2} {
		if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", step); err != nil {
			t.Fatal(err)
		}
	}
	next, _ := os.ReadFile(filepath.Join(cfg.Dir, "ca-next.crt"))
	if err := os.Rename(filepath.Join(cfg.Dir, "ca-next.key"), filepath.Join(cfg.Dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	phase, err := ServingRotationPhase(cfg.Dir)
	if err != nil || phase != NotRotating {
		t.Fatalf("%v %v", phase, err)
	}
	if got, _ := os.ReadFile(filepath.Join(cfg.Dir, "ca.crt")); string(got) != string(next) {
		t.Fatal("ca.crt was not replaced by ca-next.crt")
	}
	if _, b, err := EnsureServing(cfg, "hook", "pizza"); err != nil || !trusts(t, b.CA, b) {
		t.Fatalf("after the finished promotion: %v", err)
	}
}

// A crash in step 2 after the new serving key was written, before its certificate, is finished by running
// step 2 again.
func TestRotateServingCAResumesInterruptedStep2(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), KeyAlgorithm: ECDSAP256}
	if _, _, err := EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", 1); err != nil {
		t.Fatal(err)
	}
	key, err := generateKey(ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	pemKey, _ := encodeKey(key)
	if err := os.WriteFile(filepath.Join(cfg.Dir, "tls.key"), pemKey, 0o600); err != nil {
		t.Fatal(err)
	}
	_, b, phase, err := RotateServingCA(cfg, "hook", "pizza", 2)
	if err != nil || phase != ServingFromNext || !trusts(t, b.CA, b) {
		t.Fatalf("step 2 again: phase %v, %v", phase, err)
	}
	tls := loadCert(t, filepath.Join(cfg.Dir, "tls.crt"))
	if err := tls.CheckSignatureFrom(loadCert(t, filepath.Join(cfg.Dir, "ca-next.crt"))); err != nil {
		t.Fatalf("tls.crt is not issued by ca-next.crt: %v", err)
	}
	if _, _, err := EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatalf("after the resumed step 2: %v", err)
	}
}

// A crash in step 1 after the new CA's key was written, before its certificate, is finished by running step 1
// again; any other step says so.
func TestRotateServingCAResumesInterruptedStep1(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), KeyAlgorithm: ECDSAP256}
	if _, _, err := EnsureServing(cfg, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", 1); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(cfg.Dir, "ca-next.key"))
	if err := os.Remove(filepath.Join(cfg.Dir, "ca-next.crt")); err != nil {
		t.Fatal(err)
	}
	for _, step := range []int{2, 3} {
		if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", step); !errors.Is(err, ErrRotationOrder) || !strings.Contains(err.Error(), "step 1 was interrupted") {
			t.Fatalf("step %d after an interrupted step 1: %v", step, err)
		}
	}
	_, b, phase, err := RotateServingCA(cfg, "hook", "pizza", 1)
	if err != nil || phase != BundleBoth || len(parseCerts(t, b.CA)) != 2 || !trusts(t, b.CA, b) {
		t.Fatalf("step 1 again: phase %v, %d CAs in the bundle, %v", phase, len(parseCerts(t, b.CA)), err)
	}
	if after, _ := os.ReadFile(filepath.Join(cfg.Dir, "ca-next.key")); string(after) != string(key) {
		t.Fatal("step 1 again replaced the new CA's key")
	}
	for _, step := range []int{2, 3} {
		if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", step); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
}

func parseCerts(t *testing.T, data []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var block *pem.Block
		if block, data = pem.Decode(data); block == nil {
			return out
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// TestServingRefusesAControlPlaneDir: pointed at a control plane's certificate directory, the extension
// server's commands would take the cluster CA for the serving CA, and a rotation would replace it. Both are
// refused, and nothing there changes.
func TestServingRefusesAControlPlaneDir(t *testing.T) {
	dir := t.TempDir()
	if _, err := Ensure(Config{Dir: dir}); err != nil { // the cluster CA, front-proxy CA and konnectivity certificates
		t.Fatal(err)
	}
	dir = filepath.Join(dir, PKISubdir) // where the serving functions keep their files directly
	before, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsureServing(Config{Dir: dir}, "hook", "pizza"); err == nil || !strings.Contains(err.Error(), "directory of its own") {
		t.Errorf("EnsureServing in a control plane's directory: %v", err)
	}
	if _, _, _, err := RotateServingCA(Config{Dir: dir}, "hook", "pizza", 1); err == nil || !strings.Contains(err.Error(), "directory of its own") {
		t.Errorf("RotateServingCA in a control plane's directory: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); string(after) != string(before) {
		t.Error("the cluster CA changed")
	}
	if exists(filepath.Join(dir, "tls.crt")) || exists(filepath.Join(dir, "ca-next.key")) {
		t.Error("serving files written beside the cluster CA")
	}
}

// A rotation keeps the directory's key algorithm and lifetimes: its new CA and serving certificate are like
// the ones they replace, not the defaults (RSA 2048, ten years, one year).
func TestRotateServingCAKeepsAlgorithmAndLifetimes(t *testing.T) {
	dir := t.TempDir()
	const caLife, certLife = 720 * time.Hour, 168 * time.Hour
	if _, _, err := EnsureServing(Config{Dir: dir, KeyAlgorithm: ECDSAP256, CAValidity: caLife, CertValidity: certLife}, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	check := func(step int, file string, want time.Duration) {
		t.Helper()
		c := loadCert(t, filepath.Join(dir, file+".crt"))
		if got := lifetime(c); got != want {
			t.Errorf("after step %d, %s.crt is valid for %s, want %s", step, file, got, want)
		}
		key, _, err := readKey(filepath.Join(dir, file+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if alg, _ := keyAlgorithmOf(key.Public()); alg != ECDSAP256 {
			t.Errorf("after step %d, %s.key is %s, want %s", step, file, alg, ECDSAP256)
		}
	}
	cfg := Config{Dir: dir} // what konnect certs rotate-ca passes
	for step := 1; step <= 3; step++ {
		if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", step); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		switch step {
		case 1:
			check(step, "ca-next", caLife)
		case 2:
			check(step, "tls", certLife)
		case 3:
			check(step, "ca", caLife)
			check(step, "tls", certLife)
		}
	}
	// Given explicitly, they win.
	explicit := Config{Dir: dir, KeyAlgorithm: ECDSAP384, CAValidity: 48 * time.Hour, CertValidity: 24 * time.Hour}
	if _, _, _, err := RotateServingCA(explicit, "hook", "pizza", 1); err != nil {
		t.Fatal(err)
	}
	next := loadCert(t, filepath.Join(dir, "ca-next.crt"))
	if alg, _ := keyAlgorithmOf(next.PublicKey); alg != ECDSAP384 || lifetime(next) != 48*time.Hour {
		t.Fatalf("explicit algorithm and lifetime: %s %s", alg, lifetime(next))
	}
}

// A serving certificate cut short to end with its CA (renewed near the CA's end) does not pass its
// shortened lifetime on to the certificate of the new CA.
func TestRotateServingCAIgnoresACutLifetime(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := EnsureServing(Config{Dir: dir, KeyAlgorithm: ECDSAP256, CAValidity: 100 * time.Hour, CertValidity: 50 * time.Hour}, "hook", "pizza"); err != nil {
		t.Fatal(err)
	}
	// Re-signed for longer than the CA has left: it ends with the CA.
	specs := ServingSpecs("hook", "pizza", NotRotating)
	caSpec, tlsSpec := specs[0], specs[len(specs)-1]
	ca, old := loadCert(t, caSpec.CertFile(dir)), loadCert(t, tlsSpec.CertFile(dir))
	caKey, _, _ := readKey(caSpec.KeyFile(dir))
	key, _, _ := readKey(tlsSpec.KeyFile(dir))
	cut, err := signCert(tlsSpec, key.Public(), AltNames{DNSNames: old.DNSNames}, ca, caKey, time.Now(), 1000*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(tlsSpec.CertFile(dir), encodeCert(cut), 0o644)
	if !cut.NotAfter.Equal(ca.NotAfter) {
		t.Fatalf("set-up: tls.crt ends %s, its CA %s", cut.NotAfter, ca.NotAfter)
	}
	cfg := Config{Dir: dir, CAValidity: 1000 * time.Hour}
	for step := 1; step <= 2; step++ {
		if _, _, _, err := RotateServingCA(cfg, "hook", "pizza", step); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
	// The default, one year, capped by the new CA's thousand hours; not the hundred hours it was cut to.
	if got := lifetime(loadCert(t, tlsSpec.CertFile(dir))); got < 900*time.Hour {
		t.Errorf("the new serving certificate is valid for %s", got)
	}
}
