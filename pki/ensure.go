package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/smallfile"
)

// Action says what happened to a certificate.
type Action string

const (
	Created Action = "created"
	Kept    Action = "kept"
	Renewed Action = "renewed"
	Updated Action = "updated" // a derived file (kubeconfig) rewritten to match the certificates
)

// Result reports on one certificate (or the kubeconfig).
type Result struct {
	Name     string `json:"name"`
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile,omitempty"`
	Action   Action `json:"action"`
	// DryRun marks an action that was planned but not carried out.
	DryRun bool `json:"dryRun,omitempty"`
	// CA is set for a CA certificate.
	CA bool `json:"ca,omitempty"`
	// External is set for a CA whose key is not on this node, and for leaves it signs.
	External bool `json:"external,omitempty"`
	// Reason says why a certificate was created or renewed.
	Reason string `json:"reason,omitempty"`
	// Forced marks a file rewritten only because Config.Force was set.
	Forced bool `json:"forced,omitempty"`
	// Backup is where the content a forced rewrite replaced was kept (Backup), or empty.
	Backup   string    `json:"backup,omitempty"`
	NotAfter time.Time `json:"notAfter,omitzero"`
}

func (r Result) String() string {
	verb := string(r.Action)
	if r.DryRun {
		verb = "would be " + verb
	}
	s := fmt.Sprintf("%-28s %-18s %s", r.Name, verb, r.CertFile)
	if r.External {
		s += " (external CA)"
	}
	if r.Reason != "" {
		s += ": " + r.Reason
	}
	return s
}

// clockSkew backdates NotBefore so that nodes whose clocks lag a little accept new certificates.
const clockSkew = 5 * time.Minute

// Ensure creates the certificates named (all that cfg calls for when none are named) and the CAs they
// need, keeps and checks those that exist, and renews a failing leaf only when cfg.Force is set. A name
// given explicitly is processed even when cfg does not call for it. Every problem is found before
// anything is written: either the error lists them all and nothing is written, or the planned files are
// written (should a write itself fail midway, every file is still whole and no certificate lacks its key).
func Ensure(cfg Config, names ...string) ([]Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	// The refusal checkServingDir makes the other way round: there, ca.crt is an extension server's
	// serving CA, which must not become the cluster CA.
	if IsServingDir(cfg.PKIDir()) {
		return nil, fmt.Errorf("pki: %s holds an extension server's certificates (tls.crt, as konnect certs apiservice and konnect certs webhook write them), so its ca.crt is that server's serving CA, not a cluster CA; give the control plane a directory of its own", cfg.PKIDir())
	}
	specs := Specs()
	sel, err := selectSpecs(specs, &cfg, names)
	if err != nil {
		return nil, err
	}
	e := &engine{dir: cfg.PKIDir(), specs: specs, cfg: &cfg, now: cfg.now(), authorities: map[string]*authority{}}
	return e.run(sel)
}

// selectSpecs resolves names (or the enabled specs) plus the CAs they need.
func selectSpecs(specs []*Spec, cfg *Config, names []string) (map[string]bool, error) {
	sel := map[string]bool{}
	if len(names) == 0 {
		for _, s := range specs {
			if s.IsEnabled(cfg) {
				sel[s.Name] = true
			}
		}
	}
	for _, n := range names {
		if _, ok := Lookup(specs, n); !ok {
			return nil, fmt.Errorf("pki: unknown certificate %q (want one of %s)", n, strings.Join(Names(specs), ", "))
		}
		sel[n] = true
	}
	for changed := true; changed; {
		changed = false
		for _, s := range specs {
			if sel[s.Name] && s.CA != "" && !sel[s.CA] {
				sel[s.CA] = true
				changed = true
			}
		}
	}
	return sel, nil
}

// authority is a CA as found on disk or about to be created.
type authority struct {
	spec *Spec
	cert *x509.Certificate // nil while the CA is still to be created
	key  crypto.Signer     // nil for an external CA
}

// pending reports whether the CA is still to be created: it has signed nothing yet.
func (a *authority) pending() bool { return a.cert == nil }

func (a *authority) certFile(dir string) string { return a.spec.CertFile(dir) }

// step is one planned write.
type step struct {
	spec     *Spec
	result   *Result
	key      crypto.Signer // key to reuse; nil means generate one
	altNames AltNames
	cert     *x509.Certificate // already signed at planning time; nil means sign when applying
	retire   *x509.Certificate // the certificate on disk, whose pair is kept in RetiredSubdir before the new one is written
	backup   bool              // renewed only with Force: the files it replaces are kept beside them first (Backup)
}

type engine struct {
	dir         string
	specs       []*Spec
	cfg         *Config
	now         time.Time
	authorities map[string]*authority
	results     []*Result
	steps       []step
	problems    []error
}

func (e *engine) fail(format string, args ...any) {
	e.problems = append(e.problems, field.Errorf(format, args...))
}

func (e *engine) run(sel map[string]bool) ([]Result, error) {
	if err := checkTable(e.specs); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	var files []string
	for _, s := range e.specs {
		if sel[s.Name] {
			files = append(files, s.CertFile(e.dir), s.KeyFile(e.dir))
		}
	}
	if err := checkTrusted(e.dir, files...); err != nil {
		return nil, fmt.Errorf("pki: nothing written: %w", err)
	}
	for _, s := range e.specs {
		if sel[s.Name] && s.IsCA {
			e.planCA(s)
		}
	}
	e.checkDistinctCAs()
	for _, s := range e.specs {
		if sel[s.Name] && !s.IsCA {
			e.planLeaf(s)
		}
	}
	if len(e.problems) > 0 {
		return nil, fmt.Errorf("pki: nothing written: %w", errors.Join(e.problems...))
	}
	if e.cfg.DryRun {
		for _, st := range e.steps {
			st.result.DryRun = true
		}
		return e.flatten(), nil
	}
	// Also when nothing is to be written: a killed run's temporary files may hold keys.
	e.removeStaleTemps()
	if len(e.steps) > 0 {
		// Only the pki directory itself is private; its parent is shared with other readers.
		if err := os.MkdirAll(filepath.Dir(e.dir), 0o755); err != nil {
			return nil, fmt.Errorf("pki: create %s: %w", filepath.Dir(e.dir), err)
		}
	}
	reported := 0
	report := func(upTo int) {
		for ; e.cfg.Progress != nil && reported < upTo; reported++ {
			e.cfg.Progress(*e.results[reported])
		}
	}
	for _, st := range e.steps {
		if err := e.apply(st); err != nil {
			return e.flatten(), fmt.Errorf("pki: %w", err)
		}
		report(slices.Index(e.results, st.result) + 1)
	}
	report(len(e.results))
	return e.flatten(), nil
}

func (e *engine) flatten() []Result {
	out := make([]Result, len(e.results))
	for i, r := range e.results {
		out[i] = *r
	}
	return out
}

func (e *engine) newResult(s *Spec) *Result {
	r := &Result{Name: s.Name, CertFile: s.CertFile(e.dir), KeyFile: s.KeyFile(e.dir), CA: s.IsCA}
	e.results = append(e.results, r)
	return r
}

func (e *engine) planCA(s *Spec) {
	r := e.newResult(s)
	certFile, keyFile := s.CertFile(e.dir), s.KeyFile(e.dir)
	hasCert, hasKey := exists(certFile), exists(keyFile)
	a := &authority{spec: s}
	switch {
	case !hasCert && !hasKey:
		e.authorities[s.Name] = a
		r.Action = Created
		e.steps = append(e.steps, step{spec: s, result: r})
	case !hasCert && hasKey:
		// Keys are written before certificates, so this is what an interrupted creation leaves; it may also
		// be all that is left of a CA whose certificate was lost (kubeadm's, say). Either way the key is kept
		// and a new self-signed certificate is made for it, with the subject and key id that the certificates
		// it signed name as their issuer, so that they still verify; and a kill -9 during the first init
		// never blocks the next run.
		key, _, err := readKey(keyFile)
		if err != nil {
			e.fail("%s exists without %s and cannot be read (%v): restore %s, or remove %s to create a new CA",
				keyFile, certFile, err, certFile, keyFile)
			return
		}
		var asIssuer []func(*x509.Certificate)
		if leaf := signedBy(e.dir, key.Public()); leaf != nil {
			asIssuer = append(asIssuer, func(c *x509.Certificate) {
				c.RawSubject, c.SubjectKeyId = leaf.RawIssuer, leaf.AuthorityKeyId
			})
		}
		// Signed now rather than when written, so that the leaves it signed are checked against it and kept.
		cert, err := signCert(s, key.Public(), AltNames{}, nil, key, e.now, e.cfg.CAValidity, asIssuer...)
		if err != nil {
			e.fail("re-create %s for %s: %w", certFile, keyFile, err)
			return
		}
		a.cert, a.key = cert, key
		e.authorities[s.Name] = a
		r.Action = Created
		r.Reason = "certificate re-created for the existing " + keyFile
		e.steps = append(e.steps, step{spec: s, result: r, key: key, cert: cert})
	default:
		cert, _, err := readCert(certFile)
		if err != nil {
			e.fail("%w", err)
			return
		}
		a.cert = cert
		if err := checkSigningCA(certFile, cert); err != nil {
			e.fail("%w", err)
		}
		if e.now.After(cert.NotAfter) {
			// Dir is the directory above pki, for the control plane's certificates and an extension server's alike.
			e.fail("%s expired on %s; a CA is never replaced automatically: run `konnect certs renew %s {Dir} %s` to re-sign it with its key",
				certFile, cert.NotAfter.UTC().Format(time.RFC3339), s.Name, filepath.Dir(e.dir))
		}
		r.Action = Kept
		r.NotAfter = cert.NotAfter
		if !hasKey {
			r.External = true
			e.authorities[s.Name] = a
			return
		}
		key, _, err := readKey(keyFile)
		if err != nil {
			e.fail("%w", err)
			return
		}
		if !samePublicKey(cert.PublicKey, key.Public()) {
			e.fail("%s does not match %s: a CA is never overwritten; restore the matching pair", keyFile, certFile)
			return
		}
		a.key = key
		e.authorities[s.Name] = a
		r.Reason = OpenKeyNote(keyFile)
	}
}

// checkSigningCA refuses a certificate in a CA's place that may not sign others: what it signed would not
// verify (openssl: "key usage does not include certificate signing"). Init and renew both call it, so that
// renew never signs with a CA that init rejects.
func checkSigningCA(certFile string, cert *x509.Certificate) error {
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("%s is not a CA certificate (basic constraints CA:TRUE and key usage certSign are required)", certFile)
	}
	return nil
}

// OpenKeyNote says so when a kept key can be read by others than its owner: konnect writes keys 0600, and
// changes no existing file to fix another's, but the user should know. It returns "" for a key that only
// its owner can read, or that cannot be stat'ed. konnect server logs it for its keys at start.
func OpenKeyNote(keyFile string) string {
	if fi, err := os.Stat(keyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return fmt.Sprintf("WARNING: the key is mode %04o, readable by others: chmod 600 %s", fi.Mode().Perm(), keyFile)
	}
	return ""
}

// checkDistinctCAs refuses CAs that share a key, in the plan or on disk. The same CA in
// --client-ca-file and --requestheader-client-ca-file makes kube-apiserver check ordinary client
// certificates against --requestheader-allowed-names first, which locks kubelets and users out.
func (e *engine) checkDistinctCAs() {
	type found struct {
		spec *Spec
		cert *x509.Certificate
	}
	var cas []found
	for _, s := range e.specs {
		if !s.IsCA {
			continue
		}
		if a, ok := e.authorities[s.Name]; ok {
			if a.cert != nil {
				cas = append(cas, found{s, a.cert})
			}
			continue
		}
		if c, _, err := readCert(s.CertFile(e.dir)); err == nil {
			cas = append(cas, found{s, c})
		}
	}
	for i := range cas {
		for j := i + 1; j < len(cas); j++ {
			a, b := cas[i], cas[j]
			if samePublicKey(a.cert.PublicKey, b.cert.PublicKey) {
				what := "the same key as"
				if slices.Equal(a.cert.Raw, b.cert.Raw) {
					what = "the same certificate as"
				}
				e.fail("%s is %s %s: the %s and %s CAs must be distinct, otherwise kube-apiserver checks ordinary client certificates against --requestheader-allowed-names and kubelets, controllers and users can no longer authenticate",
					b.spec.CertFile(e.dir), what, a.spec.CertFile(e.dir), b.spec.Name, a.spec.Name)
			}
		}
	}
}

func (e *engine) planLeaf(s *Spec) {
	r := e.newResult(s)
	certFile, keyFile := s.CertFile(e.dir), s.KeyFile(e.dir)
	ca := e.authorities[s.CA]
	if ca == nil { // the CA failed to load; its problem is already reported
		return
	}
	want := s.altNames(e.cfg)
	hasCert, hasKey := exists(certFile), exists(keyFile)
	external := !ca.pending() && ca.key == nil
	r.External = external

	if !hasCert {
		if external {
			e.fail("%s is missing and %s has no key next to it (external CA), so konnect cannot sign it: issue %s with your CA (%s) and place it at %s and %s",
				certFile, ca.certFile(e.dir), s.Name, describe(s, want), certFile, keyFile)
			return
		}
		r.Action = Created
		if hasKey {
			// Only an interrupted run leaves a leaf key without its certificate; nothing can use it.
			r.Reason = "replaced " + keyFile + " left without a certificate"
		}
		e.steps = append(e.steps, step{spec: s, result: r, altNames: want})
		return
	}

	cert, _, certErr := readCert(certFile)
	var key crypto.Signer
	var keyErr error
	if hasKey {
		key, _, keyErr = readKey(keyFile)
	} else {
		keyErr = fmt.Errorf("key %s is missing", keyFile)
	}
	var problems []string
	switch {
	case certErr != nil:
		problems = append(problems, certErr.Error())
	case keyErr != nil:
		problems = append(problems, keyErr.Error())
	default:
		problems = checkLeaf(s, cert, key, ca, want, e.now)
	}
	if len(problems) == 0 {
		r.Action = Kept
		r.NotAfter = cert.NotAfter
		r.Reason = OpenKeyNote(keyFile)
		return
	}
	detail := strings.Join(problems, "; ")
	if former := e.formerIssuer(s, cert); former != "" && keyErr == nil && len(problems) == 1 {
		// Signed by the CA of an earlier release and sound otherwise: moved to its CA without --force, with
		// a new key. With the old one, anyone who later reads the key could pair it with the old certificate,
		// which is no secret, and log in wherever the former CA is trusted until that certificate expires.
		r.Action = Renewed
		r.Reason = fmt.Sprintf("moved from %s to %s.crt with a new key; the old pair, still accepted where %s is trusted until %s, is kept in %s",
			former, ca.spec.BaseName, former, cert.NotAfter.UTC().Format(time.RFC3339), filepath.Join(e.dir, RetiredSubdir))
		e.steps = append(e.steps, step{spec: s, result: r, altNames: want, retire: cert})
		return
	}
	if external {
		e.fail("%s: %s (signed by the external CA %s, which konnect cannot use to renew it)", certFile, detail, ca.certFile(e.dir))
		return
	}
	if !e.cfg.Force {
		e.fail("%s: %s (run with {Force} to renew it)", certFile, detail)
		return
	}
	// Re-sign the existing key when it is sound, also when the certificate is for another key: one atomic
	// write, and a key that parses is never replaced.
	reuse := key
	if keyErr != nil {
		reuse = nil
	}
	r.Action = Renewed
	r.Reason = detail
	e.steps = append(e.steps, step{spec: s, result: r, key: reuse, altNames: want, backup: true})
}

// formerIssuer is the file of the spec's FormerCA when that CA signed cert, or empty.
func (e *engine) formerIssuer(s *Spec, cert *x509.Certificate) string {
	if s.FormerCA == "" || cert == nil {
		return ""
	}
	former, ok := Lookup(e.specs, s.FormerCA)
	if !ok {
		return ""
	}
	formerCert, _, err := readCert(former.CertFile(e.dir))
	if err != nil || cert.CheckSignatureFrom(formerCert) != nil {
		return ""
	}
	return former.BaseName + ".crt"
}

// signedBy returns a certificate in dir that the key of pub signed, or nil: the first by file name, since the
// leaves of one CA all name the same issuer.
func signedBy(dir string, pub crypto.PublicKey) *x509.Certificate {
	files, _ := filepath.Glob(filepath.Join(dir, "*.crt"))
	signer := &x509.Certificate{PublicKey: pub}
	for _, f := range files {
		c, _, err := readCert(f)
		if err == nil && signer.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature) == nil {
			return c
		}
	}
	return nil
}

// checkLeaf lists what is wrong with an existing leaf; empty means it is kept.
func checkLeaf(s *Spec, cert *x509.Certificate, key crypto.Signer, ca *authority, want AltNames, now time.Time) []string {
	var p []string
	if !samePublicKey(cert.PublicKey, key.Public()) {
		p = append(p, "the key does not match the certificate")
	}
	switch {
	case ca.pending():
		p = append(p, fmt.Sprintf("not signed by %s, which is being created", ca.spec.BaseName+".crt"))
	case cert.CheckSignatureFrom(ca.cert) != nil || !slices.Equal(cert.RawIssuer, ca.cert.RawSubject):
		p = append(p, fmt.Sprintf("not signed by %s (issuer %q)", ca.spec.BaseName+".crt", cert.Issuer.String()))
	}
	if now.After(cert.NotAfter) {
		p = append(p, "expired on "+cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(cert.NotBefore) {
		p = append(p, "not valid before "+cert.NotBefore.UTC().Format(time.RFC3339))
	}
	if cert.IsCA {
		p = append(p, "is a CA certificate, want a leaf")
	}
	// A client certificate's CN and O are its user name and groups in kube-apiserver (O=system:masters
	// would bypass RBAC), so they must be exact. A serving certificate is identified by its SANs, and one
	// issued by an external CA may carry any subject.
	if slices.Contains(s.Usages, x509.ExtKeyUsageClientAuth) {
		if cert.Subject.CommonName != s.CommonName {
			p = append(p, fmt.Sprintf("subject CN is %q, want %q", cert.Subject.CommonName, s.CommonName))
		}
		if !sameStrings(cert.Subject.Organization, s.Organization) {
			p = append(p, fmt.Sprintf("subject O is %q, want %q", cert.Subject.Organization, s.Organization))
		}
	}
	// No extendedKeyUsage extension means no restriction (RFC 5280), which is what the openssl recipe in
	// the Kubernetes documentation produces; Go and kube-apiserver accept such certificates.
	unrestricted := len(cert.ExtKeyUsage) == 0 && len(cert.UnknownExtKeyUsage) == 0 || slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageAny)
	for _, u := range s.Usages {
		if !unrestricted && !slices.Contains(cert.ExtKeyUsage, u) {
			p = append(p, "extended key usage lacks "+usageName(u))
		}
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		p = append(p, "key usage lacks digitalSignature")
	}
	if missing := missingAltNames(cert, want); len(missing) > 0 {
		p = append(p, "SANs lack "+strings.Join(missing, ", "))
	}
	return p
}

func missingAltNames(cert *x509.Certificate, want AltNames) []string {
	var missing []string
	for _, d := range want.DNSNames {
		if !slices.ContainsFunc(cert.DNSNames, func(h string) bool { return strings.EqualFold(h, d) }) {
			missing = append(missing, d)
		}
	}
	for _, ip := range want.IPs {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			missing = append(missing, ip.String())
		}
	}
	return missing
}

func sameStrings(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func usageName(u x509.ExtKeyUsage) string {
	switch u {
	case x509.ExtKeyUsageServerAuth:
		return "serverAuth"
	case x509.ExtKeyUsageClientAuth:
		return "clientAuth"
	}
	return fmt.Sprintf("usage %d", u)
}

// describe spells out what an external CA must issue.
func describe(s *Spec, an AltNames) string {
	parts := []string{"CN=" + s.CommonName}
	for _, o := range s.Organization {
		parts = append(parts, "O="+o)
	}
	for _, u := range s.Usages {
		parts = append(parts, usageName(u))
	}
	var sans []string
	sans = append(sans, an.DNSNames...)
	for _, ip := range an.IPs {
		sans = append(sans, ip.String())
	}
	if len(sans) > 0 {
		parts = append(parts, "SANs "+strings.Join(sans, ","))
	}
	return strings.Join(parts, ", ")
}

// removeStaleTemps deletes temporary files that a killed run left behind; they may hold key material.
func (e *engine) removeStaleTemps() {
	for _, s := range e.specs {
		RemoveStaleTemps(s.CertFile(e.dir))
		RemoveStaleTemps(s.KeyFile(e.dir))
	}
}

// apply carries out one step: key first, then certificate.
func (e *engine) apply(st step) error {
	s := st.spec
	if st.retire != nil {
		if err := retirePair(e.dir, s, st.retire); err != nil {
			return err
		}
	}
	key := st.key
	newKey := key == nil
	if newKey {
		var err error
		if key, err = generateKey(e.cfg.KeyAlgorithm); err != nil {
			return fmt.Errorf("generate key for %s: %w", s.Name, err)
		}
	}
	cert := st.cert
	var err error
	switch {
	case cert != nil:
	case s.IsCA:
		cert, err = signCert(s, key.Public(), AltNames{}, nil, key, e.now, e.cfg.CAValidity)
	default:
		ca := e.authorities[s.CA]
		cert, err = signCert(s, key.Public(), st.altNames, ca.cert, ca.key, e.now, e.cfg.CertValidity)
	}
	if err != nil {
		return fmt.Errorf("sign %s: %w", s.Name, err)
	}
	if st.backup {
		if err := e.backupReplaced(st, newKey); err != nil {
			return err
		}
	}
	if err := writePair(s.CertFile(e.dir), s.KeyFile(e.dir), cert, key, newKey); err != nil {
		return err
	}
	if s.IsCA {
		a := e.authorities[s.Name]
		a.cert, a.key = cert, key
	}
	st.result.NotAfter = cert.NotAfter
	if !s.IsCA && cert.NotAfter.Before(e.now.Add(e.cfg.CertValidity-clockSkew)) {
		st.result.Reason = strings.TrimPrefix(st.result.Reason+"; validity cut to the CA's expiry", "; ")
	}
	return nil
}

// backupReplaced keeps a copy of each file a forced renewal is about to replace (the certificate, and the
// key when a new one replaces it) beside it, as init keeps a file of someone else's that --force replaces:
// a key konnect cannot parse may still be someone's only copy of it, in a format konnect does not read. A
// file that cannot be read as a regular file (missing, a FIFO) holds nothing to keep, and nor does a
// certificate whose key is missing, which nothing can use.
func (e *engine) backupReplaced(st step, newKey bool) error {
	keyFile, certFile := st.spec.KeyFile(e.dir), st.spec.CertFile(e.dir)
	key, err := smallfile.Read(keyFile)
	if err != nil {
		return nil
	}
	var kept []string
	keep := func(path string, data []byte, mode fs.FileMode) error {
		backup, err := Backup(path, "", data, mode, e.now)
		if err == nil {
			kept = append(kept, backup)
		}
		return err
	}
	if newKey {
		if err := keep(keyFile, key, KeyMode); err != nil {
			return err
		}
	}
	if cert, err := smallfile.Read(certFile); err == nil {
		if err := keep(certFile, cert, CertMode); err != nil {
			return err
		}
	}
	st.result.Backup = strings.Join(kept, ", ")
	return nil
}

// retirePair hard-links the certificate and key of s into RetiredSubdir, under the certificate's serial
// number, so that replacing them loses no key.
func retirePair(dir string, s *Spec, cert *x509.Certificate) error {
	retired := filepath.Join(dir, RetiredSubdir)
	if err := os.MkdirAll(retired, DirMode); err != nil {
		return fmt.Errorf("keep the old %s: %w", s.Name, err)
	}
	base := s.BaseName + "-" + strings.ToLower(cert.SerialNumber.Text(16))
	for _, f := range []struct{ from, ext string }{{s.CertFile(dir), ".crt"}, {s.KeyFile(dir), ".key"}} {
		if err := os.Link(f.from, filepath.Join(retired, base+f.ext)); err != nil && !os.IsExist(err) {
			return fmt.Errorf("keep the old %s: %w", s.Name, err)
		}
	}
	return syncDir(retired)
}

// writePair writes the key (when new) before the certificate, so that a crash in between leaves a key
// without a certificate, which the next run recognises, never a certificate whose key is lost.
func writePair(certFile, keyFile string, cert *x509.Certificate, key crypto.Signer, writeKey bool) error {
	if writeKey {
		pemKey, err := encodeKey(key)
		if err != nil {
			return fmt.Errorf("encode %s: %w", keyFile, err)
		}
		if _, err := WriteFile(keyFile, pemKey, KeyMode, DirMode); err != nil {
			return err
		}
	}
	_, err := WriteFile(certFile, encodeCert(cert), CertMode, DirMode)
	return err
}

// signCert issues a certificate for pub. A nil issuer makes it self-signed. A leaf never outlives its CA.
// Modifiers adjust the template before signing.
func signCert(s *Spec, pub crypto.PublicKey, an AltNames, issuer *x509.Certificate, signer crypto.Signer, now time.Time, validity time.Duration, modifiers ...func(*x509.Certificate)) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	serial.Add(serial, big.NewInt(1))
	now = now.UTC().Truncate(time.Second)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: s.CommonName, Organization: s.Organization},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		BasicConstraintsValid: true,
		DNSNames:              an.DNSNames,
		IPAddresses:           an.IPs,
	}
	if s.IsCA {
		tmpl.IsCA = true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
		// The CAs here sign leaves only.
		tmpl.MaxPathLenZero = true
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		if _, ok := pub.(*rsa.PublicKey); ok {
			tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
		}
		tmpl.ExtKeyUsage = s.Usages
	}
	for _, m := range modifiers {
		m(tmpl)
	}
	parent := tmpl
	if issuer != nil {
		parent = issuer
		if tmpl.NotAfter.After(issuer.NotAfter) {
			tmpl.NotAfter = issuer.NotAfter
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}
