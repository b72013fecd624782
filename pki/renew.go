package pki

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/smallfile"
)

// All is the name that renews every leaf.
const All = "all"

// Renew re-signs existing certificates with their CA, keeping each key (and so its algorithm), the SANs
// of the existing certificate and the subject. A CA is renewed only when named explicitly: it is
// re-signed with its own key and subject, so that every certificate it issued stays valid. "all" means
// every leaf present on disk. The Konnectivity server's kubeconfig, which embeds both, follows a renewed
// konnectivity-server-client certificate or cluster CA. Either every problem is reported and nothing is
// written, or every certificate is renewed. Unless it is a dry run, the temporary files that a killed run
// left beside those files are removed first (see RemoveStaleTemps; the caller holds the directory's lock).
//
// In an extension server's directory (DIR/pki written by konnect certs apiservice or konnect certs
// webhook, see IsServingDir) the certificates are those of ServingSpecs in the rotation phase reached:
// apiservice-ca, apiservice-ca-next during a rotation, and apiservice-serving, which keeps its subject.
func Renew(cfg Config, names ...string) ([]Result, error) {
	r := &renewal{cfg: cfg.withDefaults(), specs: Specs(), cas: map[string]*loaded{}}
	r.dir = r.cfg.PKIDir()
	if err := checkTrusted(r.dir); err != nil {
		return nil, fmt.Errorf("pki: nothing renewed: %w", err)
	}
	if IsServingDir(r.dir) {
		phase, err := servingPhaseFor(Config{Dir: r.dir, DryRun: r.cfg.DryRun})
		if err != nil {
			return nil, err
		}
		// The Service's name only makes the subject of new certificates, and a renewal keeps the old one.
		r.specs, r.serving = ServingSpecs("x", "x", phase), true
	}
	if err := checkTable(r.specs); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if !r.cfg.DryRun {
		r.removeStaleTemps()
	}
	sel, err := r.selected(names)
	if err != nil {
		return nil, err
	}
	if err := r.load(sel); err != nil {
		return nil, err
	}
	results, err := r.resign()
	results = append(r.external, results...)
	if err != nil || !r.kubeconfigStale {
		return results, err
	}
	if r.cfg.DryRun {
		return append(results, r.kubeconfigDryRun()...), nil
	}
	if kr, ok, err := refreshKubeconfig(r.cfg); err != nil {
		return results, err
	} else if ok {
		results = append(results, kr)
	}
	return results, nil
}

// removeStaleTemps deletes the temporary files that a killed run left beside the files of the table and the
// kubeconfig, whichever of them this renewal writes: a renewal of one certificate may never write the file
// whose temporary file holds a key.
func (r *renewal) removeStaleTemps() {
	specs := r.specs
	if r.serving { // with the rotation's files, whichever phase it reached
		specs = ServingSpecs("x", "x", ServingFromNext)
	}
	for _, s := range specs {
		RemoveStaleTemps(s.CertFile(r.dir))
		RemoveStaleTemps(s.KeyFile(r.dir))
	}
	if !r.serving {
		RemoveStaleTemps(r.cfg.KubeconfigPath())
	}
}

// renewal is one Renew: what it loaded, then what it re-signed.
type renewal struct {
	cfg     Config
	dir     string
	specs   []*Spec
	serving bool // an extension server's directory: ServingSpecs

	cas  map[string]*loaded // the CAs of the selected certificates, and selected CAs
	todo []*loaded          // what to re-sign, CAs first

	external        []Result  // leaves of an external CA that "all" leaves to whoever holds its key
	kubeconfigStale bool      // a certificate the kubeconfig embeds was renewed
	clientNotAfter  time.Time // the renewed konnectivity-server-client certificate's
}

// loaded is a certificate on disk with its key.
type loaded struct {
	spec *Spec
	cert *x509.Certificate
	key  crypto.Signer
}

// selected resolves the names given to Renew ("all": every leaf on disk) to a set of spec names.
func (r *renewal) selected(names []string) (map[string]bool, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("pki: name a certificate to renew, or %q (one of %s)", All, strings.Join(Names(r.specs), ", "))
	}
	sel := map[string]bool{}
	for _, n := range names {
		if n == All {
			for _, s := range r.specs {
				if s.IsCA || !exists(s.CertFile(r.dir)) {
					continue
				}
				// Whoever holds an external CA's key renews what it signed: "all" is the rest.
				if ca, ok := Lookup(r.specs, s.CA); ok && exists(ca.CertFile(r.dir)) && !exists(ca.KeyFile(r.dir)) {
					r.external = append(r.external, Result{Name: s.Name, CertFile: s.CertFile(r.dir), KeyFile: s.KeyFile(r.dir),
						Action: Kept, External: true, NotAfter: notAfter(s.CertFile(r.dir)),
						Reason: "signed by the external CA " + ca.CertFile(r.dir) + ": renew it with whoever holds that CA's key"})
					continue
				}
				sel[s.Name] = true
			}
			continue
		}
		if _, ok := Lookup(r.specs, n); !ok {
			if _, serving := Lookup(ServingSpecs("x", "x", ServingFromNext), n); serving && !r.serving {
				return nil, field.Errorf("pki: %q is a certificate of an extension server's directory, and %s holds none (no tls.crt): give {Dir} the directory konnect certs apiservice or konnect certs webhook wrote (its pki subdirectory holds tls.crt)", n, r.dir)
			}
			return nil, fmt.Errorf("pki: unknown certificate %q (want %s or one of %s)", n, All, strings.Join(Names(r.specs), ", "))
		}
		sel[n] = true
	}
	if len(sel) == 0 && len(r.external) == 0 {
		return nil, fmt.Errorf("pki: no certificates found in %s", r.dir)
	}
	return sel, nil
}

// load reads every selected certificate and key and the CAs that sign them. Every problem is reported at
// once, and then nothing is renewed.
func (r *renewal) load(sel map[string]bool) error {
	var problems []error
	load := func(s *Spec) *loaded {
		l, err := loadPair(s, r.dir)
		if err != nil {
			problems = append(problems, err)
		}
		return l
	}
	for _, s := range r.specs {
		if s.IsCA && (sel[s.Name] || slices.ContainsFunc(r.specs, func(l *Spec) bool { return sel[l.Name] && l.CA == s.Name })) {
			if leaf := formerlySigned(r.specs, s, r.dir, sel); leaf != nil && !exists(s.CertFile(r.dir)) {
				former, _ := Lookup(r.specs, leaf.FormerCA)
				problems = append(problems, fmt.Errorf("%s is signed by %s, as earlier releases signed it, and %s does not exist yet: run konnect init first, which moves it to its CA",
					leaf.CertFile(r.dir), former.BaseName+".crt", s.CertFile(r.dir)))
				continue
			}
			if ca := load(s); ca != nil {
				r.cas[s.Name] = ca
			}
		}
	}
	for _, s := range r.specs {
		if !sel[s.Name] {
			continue
		}
		if s.IsCA {
			if ca := r.cas[s.Name]; ca != nil {
				r.todo = append(r.todo, ca)
			}
			continue
		}
		if l := load(s); l != nil {
			r.todo = append(r.todo, l)
		}
	}
	// A leaf's lifetime is cut to its CA's: re-signed by an expired CA that this run does not renew first,
	// it would be expired as soon as it is written.
	now := r.cfg.now()
	for _, l := range r.todo {
		if ca := r.cas[l.spec.CA]; !l.spec.IsCA && ca != nil && !sel[ca.spec.Name] && !now.Before(ca.cert.NotAfter) {
			problems = append(problems, fmt.Errorf("%s: its CA %s expired on %s, so it cannot be renewed before the CA is: run konnect certs renew %s first, or name both",
				l.spec.CertFile(r.dir), ca.spec.CertFile(r.dir), ca.cert.NotAfter.UTC().Format(time.RFC3339), ca.spec.Name))
		}
	}
	// The same refusal as init: renewing leaves under a front-proxy CA that is the cluster CA would
	// entrench the set-up that locks kubelets and users out.
	check := &engine{dir: r.dir, specs: r.specs, cfg: &r.cfg, authorities: map[string]*authority{}}
	check.checkDistinctCAs()
	problems = append(problems, check.problems...)
	if len(problems) > 0 {
		return fmt.Errorf("pki: nothing renewed: %w", errors.Join(problems...))
	}
	return nil
}

// notAfter is the expiry of the certificate in file, or zero when it cannot be read.
func notAfter(file string) time.Time {
	if c, _, err := readCert(file); err == nil {
		return c.NotAfter
	}
	return time.Time{}
}

// formerlySigned returns a selected leaf of ca that names a FormerCA, or nil.
func formerlySigned(specs []*Spec, ca *Spec, dir string, sel map[string]bool) *Spec {
	for _, l := range specs {
		if sel[l.Name] && l.CA == ca.Name && l.FormerCA != "" && exists(l.CertFile(dir)) {
			return l
		}
	}
	return nil
}

// loadPair reads a certificate and its key, and checks that they belong together and, for a CA, that it
// may sign (the check init applies).
func loadPair(s *Spec, dir string) (*loaded, error) {
	if err := checkTrusted(dir, s.CertFile(dir), s.KeyFile(dir)); err != nil {
		return nil, err
	}
	cert, _, err := readCert(s.CertFile(dir))
	if err != nil {
		return nil, err
	}
	if s.IsCA {
		if err := checkSigningCA(s.CertFile(dir), cert); err != nil {
			return nil, err
		}
	}
	if !exists(s.KeyFile(dir)) {
		what := "it cannot be re-signed"
		if s.IsCA {
			what = "the CA is external: konnect cannot sign with it, renew with whoever holds its key"
		}
		return nil, fmt.Errorf("%s: key %s is missing, so %s", s.CertFile(dir), s.KeyFile(dir), what)
	}
	key, _, err := readKey(s.KeyFile(dir))
	if err != nil {
		return nil, err
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%s does not match %s (for a leaf, `konnect init --force` re-signs the key)", s.KeyFile(dir), s.CertFile(dir))
	}
	return &loaded{s, cert, key}, nil
}

// resign signs and writes every certificate to renew, CAs first, so that leaves are signed by the renewed CA
// certificate.
func (r *renewal) resign() ([]Result, error) {
	now := r.cfg.now()
	var results []Result
	for _, l := range r.todo {
		s := l.spec
		res := Result{Name: s.Name, CertFile: s.CertFile(r.dir), KeyFile: s.KeyFile(r.dir), Action: Renewed, DryRun: r.cfg.DryRun}
		var cert *x509.Certificate
		var err error
		if s.IsCA {
			old := l.cert
			// Same subject, byte for byte, and key identifier as before, so that certificates it signed
			// still chain to it: chain building compares a leaf's issuer with the CA's subject as encoded,
			// and a CA made by another tool may encode the same name differently (UTF8String, not
			// PrintableString).
			cert, err = signCert(s, l.key.Public(), AltNames{}, nil, l.key, now, r.cfg.CAValidity, func(t *x509.Certificate) {
				t.Subject, t.RawSubject = old.Subject, old.RawSubject
				t.SubjectKeyId = old.SubjectKeyId
			})
		} else {
			ca := r.cas[s.CA]
			an := AltNames{DNSNames: l.cert.DNSNames, IPs: l.cert.IPAddresses}
			var keep []func(*x509.Certificate)
			if r.serving { // the table's subject is a placeholder: the extension server's is the old one
				old := l.cert
				keep = append(keep, func(t *x509.Certificate) { t.Subject = old.Subject })
			}
			cert, err = signCert(s, l.key.Public(), an, ca.cert, ca.key, now, r.cfg.CertValidity, keep...)
		}
		if err != nil {
			return results, fmt.Errorf("pki: renew %s: %w", s.Name, err)
		}
		res.NotAfter = cert.NotAfter
		if !s.IsCA && cert.NotAfter.Before(now.Add(r.cfg.CertValidity-clockSkew)) {
			res.Reason = "validity cut to the CA's expiry"
		}
		if !r.cfg.DryRun {
			if _, err := WriteFile(res.CertFile, encodeCert(cert), CertMode, DirMode); err != nil {
				return results, fmt.Errorf("pki: renew %s: %w", s.Name, err)
			}
			if s.IsCA {
				r.cas[s.Name].cert = cert
			}
		}
		results = append(results, res)
		if s.Name == KonnectivityServerClient {
			r.clientNotAfter = cert.NotAfter
		}
		// The kubeconfig embeds ca.crt as well as the client pair: a renewed CA left out of it would stop
		// the Konnectivity server from trusting kube-apiserver once the old CA certificate expires.
		r.kubeconfigStale = r.kubeconfigStale || s.Name == KonnectivityServerClient || s.Name == CA
	}
	return results, nil
}

// kubeconfigDryRun is what a dry run reports for the kubeconfig that a real run would update.
func (r *renewal) kubeconfigDryRun() []Result {
	if !exists(r.cfg.KubeconfigPath()) {
		return nil
	}
	notAfter := r.clientNotAfter
	if notAfter.IsZero() {
		client, _ := Lookup(r.specs, KonnectivityServerClient)
		if c, _, err := readCert(client.CertFile(r.dir)); err == nil {
			notAfter = c.NotAfter
		}
	}
	return []Result{{Name: "kubeconfig", CertFile: r.cfg.KubeconfigPath(), Action: Updated, DryRun: true, NotAfter: notAfter}}
}

// refreshKubeconfig rewrites an existing kubeconfig's embedded certificates, keeping its server URL.
func refreshKubeconfig(cfg Config) (Result, bool, error) {
	data, err := smallfile.Read(cfg.KubeconfigPath())
	if os.IsNotExist(err) {
		return Result{}, false, nil
	}
	if err != nil {
		return Result{}, false, fmt.Errorf("pki: %w", err)
	}
	server, err := kubeconfigServer(data)
	if err != nil {
		return Result{}, false, fmt.Errorf("pki: %s: %w", cfg.KubeconfigPath(), err)
	}
	r, err := EnsureKubeconfig(cfg, server)
	return r, err == nil, err
}
