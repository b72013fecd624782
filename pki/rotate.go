package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
)

// RotationPhase is how far the rotation of an extension server's serving CA has come. Each step is applied
// to the cluster before the next one is written, so that at every moment every kube-apiserver trusts the
// certificate every server replica presents:
//
//	NotRotating      caBundle = CA,          serving certificate from CA
//	BundleBoth       caBundle = CA + next,   serving certificate from CA      (after step 1)
//	ServingFromNext  caBundle = CA + next,   serving certificate from next    (after step 2)
//	NotRotating      caBundle = next,        serving certificate from next    (after step 3: next is the CA)
type RotationPhase int

const (
	NotRotating RotationPhase = iota
	BundleBoth
	ServingFromNext
)

func (p RotationPhase) String() string {
	switch p {
	case BundleBoth:
		return "step 1 done: the caBundle holds the old and the new CA"
	case ServingFromNext:
		return "step 2 done: the serving certificate is from the new CA"
	default:
		return "not rotating"
	}
}

// RetiredSubdir holds the CAs that a finished rotation replaced, under names that never collide.
const RetiredSubdir = "retired"

// ServingRotationPhase reads the phase from the files in dir, and finishes a step 3 that was interrupted
// between its two renames.
func ServingRotationPhase(dir string) (RotationPhase, error) { return servingRotationPhase(dir, true) }

// servingPhaseFor is the phase that cfg's run in cfg.Dir starts from. A real run first finishes a step 3 that
// was cut short between its two renames; a dry run writes nothing, so it cannot, and says so rather than
// check files that are about to change.
func servingPhaseFor(cfg Config) (RotationPhase, error) {
	if !cfg.DryRun {
		return servingRotationPhase(cfg.Dir, true)
	}
	phase, err := servingRotationPhase(cfg.Dir, false)
	next := ServingSpecs("x", "x", ServingFromNext)[1]
	if err == nil && exists(next.CertFile(cfg.Dir)) && !exists(next.KeyFile(cfg.Dir)) {
		return 0, field.Errorf("pki: %s: step 3 of konnect certs rotate-ca was cut short between its two renames (%s is there without its key); a run without {DryRun} finishes it first, and a dry run checks nothing before that",
			cfg.Dir, filepath.Base(next.CertFile(cfg.Dir)))
	}
	return phase, err
}

// servingRotationPhase reads the phase from the files in dir. A step 3 interrupted between its two renames
// is finished when finish is set, and otherwise reported as the phase before it, with nothing written.
func servingRotationPhase(dir string, finish bool) (RotationPhase, error) {
	specs := ServingSpecs("x", "x", ServingFromNext)
	caSpec, nextSpec, tlsSpec := specs[0], specs[1], specs[2]
	hasNextCert, hasNextKey := exists(nextSpec.CertFile(dir)), exists(nextSpec.KeyFile(dir))
	switch {
	case !hasNextCert && !hasNextKey:
		return NotRotating, nil
	case hasNextCert && !hasNextKey && !finish:
		return ServingFromNext, nil
	case hasNextCert && !hasNextKey:
		// Step 3 renames the key first: finish it if ca.key is already the new CA's key.
		next, _, err := readCert(nextSpec.CertFile(dir))
		if err != nil {
			return 0, fmt.Errorf("pki: %w", err)
		}
		key, _, err := readKey(caSpec.KeyFile(dir))
		if err != nil || !samePublicKey(next.PublicKey, key.Public()) {
			return 0, fmt.Errorf("pki: %s exists without %s and %s is not its key: restore %s",
				nextSpec.CertFile(dir), nextSpec.KeyFile(dir), caSpec.KeyFile(dir), nextSpec.KeyFile(dir))
		}
		if err := os.Rename(nextSpec.CertFile(dir), caSpec.CertFile(dir)); err != nil {
			return 0, fmt.Errorf("pki: finish the interrupted rotation: %w", err)
		}
		return NotRotating, syncDir(dir)
	case !hasNextCert && hasNextKey:
		// Keys are written before certificates: an interrupted step 1. Ensure re-creates the certificate.
		return BundleBoth, nil
	}
	next, _, err := readCert(nextSpec.CertFile(dir))
	if err != nil {
		return 0, fmt.Errorf("pki: %w", err)
	}
	serving, _, err := readCert(tlsSpec.CertFile(dir))
	if err != nil {
		return 0, fmt.Errorf("pki: %w", err)
	}
	if serving.CheckSignatureFrom(next) == nil {
		return ServingFromNext, nil
	}
	return BundleBoth, nil
}

// ErrRotationOrder is returned for a rotation step that does not follow the phase reached.
var ErrRotationOrder = errors.New("rotation step out of order")

// RotateServingCA carries out one step (1, 2 or 3) of the serving CA rotation in dir, for the extension
// server name.namespace, and returns the phase it reached with the bundle to apply. A step already done
// changes nothing; a step out of order is refused with ErrRotationOrder and writes nothing. A key algorithm
// or lifetime left zero in cfg is the directory's (see inferServing), not the default.
func RotateServingCA(cfg Config, name, namespace string, n int) ([]Result, ServingBundle, RotationPhase, error) {
	cfg = inferServing(cfg).withDefaults()
	if err := ValidateService(name, namespace); err != nil {
		return nil, ServingBundle{}, 0, fmt.Errorf("pki: %w", err)
	}
	if n < 1 || n > 3 {
		return nil, ServingBundle{}, 0, fmt.Errorf("pki: rotation step %d: must be 1, 2 or 3", n)
	}
	if err := checkServingDir(cfg.Dir); err != nil {
		return nil, ServingBundle{}, 0, err
	}
	phase, err := servingPhaseFor(cfg)
	if err != nil {
		return nil, ServingBundle{}, 0, err
	}
	// A step 1 cut short left the new CA's key without its certificate: step 1 again finishes it.
	if nextSpec := ServingSpecs("x", "x", ServingFromNext)[1]; phase == BundleBoth && !exists(nextSpec.CertFile(cfg.Dir)) {
		if n != 1 {
			return nil, ServingBundle{}, phase, fmt.Errorf("pki: %w: step 1 was interrupted (%s has no %s), so the next step is 1 again, not %d",
				ErrRotationOrder, nextSpec.KeyFile(cfg.Dir), filepath.Base(nextSpec.CertFile(cfg.Dir)), n)
		}
		if cfg.DryRun {
			return []Result{{Name: "rotate-ca", CertFile: cfg.Dir, Action: Updated, DryRun: true, Reason: "step 1, interrupted before"}}, ServingBundle{}, phase, nil
		}
		res, err := runServing(cfg, name, namespace, BundleBoth)
		if err != nil {
			return res, ServingBundle{}, phase, err
		}
		b, err := readServingBundle(cfg.Dir, BundleBoth)
		return res, b, BundleBoth, err
	}
	// The files of the phase reached must be sound before anything moves on; a step 2 cut short between its
	// key and its certificate is not, and step 2 again replaces both.
	check := cfg
	check.DryRun, check.Force = true, false
	if _, _, err := EnsureServing(check, name, namespace); err != nil && !(n == 2 && phase == BundleBoth && servingPairSplit(cfg.Dir)) {
		return nil, ServingBundle{}, phase, err
	}
	if !exists(ServingSpecs(name, namespace, phase)[0].CertFile(cfg.Dir)) {
		return nil, ServingBundle{}, phase, fmt.Errorf("pki: %s holds no serving CA: run konnect certs apiservice or konnect certs webhook first", cfg.Dir)
	}
	// Step n starts from phase n-1 and ends in phase n (phase 3 is NotRotating again, with the new CA).
	from, to := RotationPhase(n-1), RotationPhase(n%3)
	if phase == to { // already done; for step 3, nothing is in progress and the bundle is one CA
		// Step 3 is done when a rotation was finished, which retired a CA. Without one, no rotation was ever
		// started: "done" would tell whoever skipped steps 1 and 2 that the CA was replaced.
		if n == 3 && !retiredCA(cfg.Dir) {
			return nil, ServingBundle{}, phase, fmt.Errorf("pki: %w: no rotation was started in %s (step 1 was never run, and %s holds no retired CA), so the next step is 1, not 3",
				ErrRotationOrder, cfg.Dir, filepath.Join(cfg.Dir, RetiredSubdir))
		}
		b, err := readServingBundle(cfg.Dir, phase)
		return nil, b, phase, err
	}
	if phase != from {
		return nil, ServingBundle{}, phase, fmt.Errorf("pki: %w: %s, so the next step is %d, not %d", ErrRotationOrder, phase, int(phase)+1, n)
	}
	if cfg.DryRun {
		return []Result{{Name: "rotate-ca", CertFile: cfg.Dir, Action: Updated, DryRun: true, Reason: fmt.Sprintf("step %d", n)}}, ServingBundle{}, phase, nil
	}

	var res []Result
	switch n {
	case 1: // a new CA beside the old one
		res, err = runServing(cfg, name, namespace, BundleBoth)
	case 2: // the serving certificate from the new CA, with a new key
		specs := ServingSpecs(name, namespace, ServingFromNext)
		tls := specs[len(specs)-1]
		e := &engine{dir: cfg.Dir, specs: specs, cfg: &cfg, now: cfg.now(), authorities: map[string]*authority{}}
		for _, s := range specs[:len(specs)-1] {
			e.planCA(s)
		}
		if len(e.problems) > 0 {
			return nil, ServingBundle{}, phase, fmt.Errorf("pki: nothing written: %w", errors.Join(e.problems...))
		}
		r := e.newResult(tls)
		r.Action, r.Reason = Renewed, "new key, issued by "+APIServiceNextCA
		if err = e.apply(step{spec: tls, result: r, altNames: tls.altNames(&cfg)}); err == nil {
			res = e.flatten()[len(specs)-1:]
		}
	case 3: // the new CA becomes the CA; the old one is retired
		res, err = promoteNextCA(cfg.Dir)
	}
	if err != nil {
		return res, ServingBundle{}, phase, err
	}
	b, err := readServingBundle(cfg.Dir, to)
	return res, b, to, err
}

// servingPairSplit reports whether dir's serving key and certificate both parse but do not belong together,
// as step 2 leaves them when it is cut short after writing the new key.
func servingPairSplit(dir string) bool {
	tls := ServingSpecs("x", "x", BundleBoth)[2]
	cert, _, err := readCert(tls.CertFile(dir))
	if err != nil {
		return false
	}
	key, _, err := readKey(tls.KeyFile(dir))
	return err == nil && !samePublicKey(cert.PublicKey, key.Public())
}

// inferServing fills what cfg leaves zero from the serving directory, so that a rotation replaces the CA
// and the serving certificate with ones like them, not with the defaults: the key algorithm of the serving
// CA, the lifetime of the serving CA, and that of the serving certificate (which may be its CA's remaining
// life, when it was cut to that). What cannot be read is left to the defaults, and to the checks that
// report it.
func inferServing(cfg Config) Config {
	dir := cfg.withDefaults().Dir
	specs := ServingSpecs("x", "x", NotRotating)
	caSpec, tlsSpec := specs[0], specs[len(specs)-1]
	ca, _, err := readCert(caSpec.CertFile(dir))
	if err != nil {
		return cfg
	}
	if cfg.KeyAlgorithm == "" {
		if alg, err := keyAlgorithmOf(ca.PublicKey); err == nil {
			cfg.KeyAlgorithm = alg
		}
	}
	if cfg.CAValidity == 0 {
		cfg.CAValidity = lifetime(ca)
	}
	if cfg.CertValidity == 0 {
		// A certificate that ends with its CA was cut short to fit it (a renewal near the CA's end): its
		// lifetime is not the one it was asked for, and the default is the better guess.
		cfg.CertValidity = min(DefaultCertValidity, cfg.withDefaults().CAValidity)
		if tls, _, err := readCert(tlsSpec.CertFile(dir)); err == nil && tls.NotAfter.Sub(ca.NotAfter).Abs() > time.Minute {
			cfg.CertValidity = min(lifetime(tls), cfg.withDefaults().CAValidity)
		}
	}
	return cfg
}

// lifetime is the validity a certificate was issued with: signCert backdates NotBefore by clockSkew.
func lifetime(c *x509.Certificate) time.Duration {
	d := c.NotAfter.Sub(c.NotBefore)
	if d > 2*clockSkew {
		d -= clockSkew
	}
	return d
}

// runServing runs the serving table of phase, creating what is missing.
func runServing(cfg Config, name, namespace string, phase RotationPhase) ([]Result, error) {
	specs := ServingSpecs(name, namespace, phase)
	e := &engine{dir: cfg.Dir, specs: specs, cfg: &cfg, now: cfg.now(), authorities: map[string]*authority{}}
	return e.run(selectAll(specs))
}

// retiredCA reports whether a finished rotation left a CA in dir's RetiredSubdir.
func retiredCA(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, RetiredSubdir, "ca-*.crt"))
	return len(m) > 0
}

// promoteNextCA makes ca-next the CA. The old pair is first hard-linked into RetiredSubdir, so that no CA
// is ever lost, then ca-next.key and ca-next.crt are renamed over ca.key and ca.crt, key first: a crash
// between the two renames is finished by ServingRotationPhase.
func promoteNextCA(dir string) ([]Result, error) {
	specs := ServingSpecs("x", "x", ServingFromNext)
	caSpec, nextSpec := specs[0], specs[1]
	old, _, err := readCert(caSpec.CertFile(dir))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	retired := filepath.Join(dir, RetiredSubdir)
	if err := os.MkdirAll(retired, DirMode); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	base := "ca-" + strings.ToLower(old.SerialNumber.Text(16))
	for _, ext := range []string{".crt", ".key"} {
		dst := filepath.Join(retired, base+ext)
		if err := os.Link(filepath.Join(dir, "ca"+ext), dst); err != nil && !os.IsExist(err) {
			return nil, fmt.Errorf("pki: keep the retired CA: %w", err)
		}
	}
	if err := syncDir(retired); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	for _, f := range []struct{ from, to string }{
		{nextSpec.KeyFile(dir), caSpec.KeyFile(dir)},
		{nextSpec.CertFile(dir), caSpec.CertFile(dir)},
	} {
		if err := os.Rename(f.from, f.to); err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
	}
	if err := syncDir(dir); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	next, _, err := readCert(caSpec.CertFile(dir))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return []Result{
		{Name: APIServiceCA, CertFile: caSpec.CertFile(dir), KeyFile: caSpec.KeyFile(dir), CA: true, Action: Renewed,
			Reason: "replaced by " + APIServiceNextCA + "; the old CA is kept in " + retired, NotAfter: next.NotAfter},
	}, nil
}
