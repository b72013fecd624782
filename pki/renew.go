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
)

// All is the name that renews every leaf.
const All = "all"

// Renew re-signs existing certificates with their CA, keeping each key (and so its algorithm), the SANs
// of the existing certificate and the subject. A CA is renewed only when named explicitly: it is
// re-signed with its own key and subject, so that every certificate it issued stays valid. "all" means
// every leaf present on disk. The Konnectivity server's kubeconfig, which embeds both, follows a renewed
// konnectivity-server-client certificate or cluster CA. Either every problem is reported and nothing is
// written, or every certificate is renewed.
func Renew(cfg Config, names ...string) ([]Result, error) {
	cfg = cfg.withDefaults()
	dir := cfg.PKIDir()
	specs := Specs()
	if err := checkTable(specs); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("pki: name a certificate to renew, or %q (one of %s)", All, strings.Join(Names(specs), ", "))
	}
	sel := map[string]bool{}
	for _, n := range names {
		if n == All {
			for _, s := range specs {
				if !s.IsCA && exists(s.CertFile(dir)) {
					sel[s.Name] = true
				}
			}
			continue
		}
		if _, ok := Lookup(specs, n); !ok {
			return nil, fmt.Errorf("pki: unknown certificate %q (want %s or one of %s)", n, All, strings.Join(Names(specs), ", "))
		}
		sel[n] = true
	}
	if len(sel) == 0 {
		return nil, fmt.Errorf("pki: no certificates found in %s", dir)
	}

	type loaded struct {
		spec *Spec
		cert *x509.Certificate
		key  crypto.Signer
	}
	var problems []error
	load := func(s *Spec) *loaded {
		cert, _, err := readCert(s.CertFile(dir))
		if err != nil {
			problems = append(problems, err)
			return nil
		}
		if !exists(s.KeyFile(dir)) {
			what := "it cannot be re-signed"
			if s.IsCA {
				what = "the CA is external: konnect cannot sign with it, renew with whoever holds its key"
			}
			problems = append(problems, fmt.Errorf("%s: key %s is missing, so %s", s.CertFile(dir), s.KeyFile(dir), what))
			return nil
		}
		key, _, err := readKey(s.KeyFile(dir))
		if err != nil {
			problems = append(problems, err)
			return nil
		}
		if !samePublicKey(cert.PublicKey, key.Public()) {
			problems = append(problems, fmt.Errorf("%s does not match %s (for a leaf, `konnect init --force` issues a new pair)", s.KeyFile(dir), s.CertFile(dir)))
			return nil
		}
		return &loaded{s, cert, key}
	}

	cas := map[string]*loaded{}
	var todo []*loaded
	for _, s := range specs {
		if s.IsCA && (sel[s.Name] || slices.ContainsFunc(specs, func(l *Spec) bool { return sel[l.Name] && l.CA == s.Name })) {
			if ca := load(s); ca != nil {
				cas[s.Name] = ca
			}
		}
	}
	for _, s := range specs {
		if !sel[s.Name] {
			continue
		}
		if s.IsCA {
			if ca := cas[s.Name]; ca != nil {
				todo = append(todo, ca)
			}
			continue
		}
		if l := load(s); l != nil {
			todo = append(todo, l)
		}
	}
	// The same refusal as init: renewing leaves under a front-proxy CA that is the cluster CA would
	// entrench the set-up that locks kubelets and users out.
	check := &engine{dir: dir, specs: specs, cfg: &cfg, authorities: map[string]*authority{}}
	check.checkDistinctCAs()
	problems = append(problems, check.problems...)
	if len(problems) > 0 {
		return nil, fmt.Errorf("pki: nothing renewed: %w", errors.Join(problems...))
	}

	now := cfg.now()
	var results []Result
	var kubeconfigStale bool
	var clientNotAfter time.Time
	for _, l := range todo {
		s := l.spec
		r := Result{Name: s.Name, CertFile: s.CertFile(dir), KeyFile: s.KeyFile(dir), Action: Renewed, DryRun: cfg.DryRun}
		var cert *x509.Certificate
		var err error
		if s.IsCA {
			old := l.cert
			// Same subject and key identifier as before, so that certificates it signed still chain to it.
			cert, err = signCert(s, l.key.Public(), AltNames{}, nil, l.key, now, cfg.CAValidity, func(t *x509.Certificate) {
				t.Subject = old.Subject
				t.SubjectKeyId = old.SubjectKeyId
			})
		} else {
			ca := cas[s.CA]
			an := AltNames{DNSNames: l.cert.DNSNames, IPs: l.cert.IPAddresses}
			cert, err = signCert(s, l.key.Public(), an, ca.cert, ca.key, now, cfg.CertValidity)
		}
		if err != nil {
			return results, fmt.Errorf("pki: renew %s: %w", s.Name, err)
		}
		r.NotAfter = cert.NotAfter
		if !cfg.DryRun {
			if _, err := WriteFile(r.CertFile, encodeCert(cert), CertMode, DirMode); err != nil {
				return results, fmt.Errorf("pki: renew %s: %w", s.Name, err)
			}
			if s.IsCA {
				cas[s.Name].cert = cert
			}
		}
		results = append(results, r)
		if s.Name == KonnectivityServerClient {
			clientNotAfter = cert.NotAfter
		}
		// The kubeconfig embeds ca.crt as well as the client pair: a renewed CA left out of it would stop
		// the Konnectivity server from trusting kube-apiserver once the old CA certificate expires.
		kubeconfigStale = kubeconfigStale || s.Name == KonnectivityServerClient || s.Name == CA
	}
	if !kubeconfigStale {
		return results, nil
	}
	if cfg.DryRun {
		if exists(cfg.KubeconfigPath()) {
			if clientNotAfter.IsZero() {
				client, _ := Lookup(specs, KonnectivityServerClient)
				if c, _, err := readCert(client.CertFile(dir)); err == nil {
					clientNotAfter = c.NotAfter
				}
			}
			results = append(results, Result{Name: "kubeconfig", CertFile: cfg.KubeconfigPath(), Action: Updated, DryRun: true, NotAfter: clientNotAfter})
		}
		return results, nil
	}
	if kr, ok, err := refreshKubeconfig(cfg); err != nil {
		return results, err
	} else if ok {
		results = append(results, kr)
	}
	return results, nil
}

// refreshKubeconfig rewrites an existing kubeconfig's embedded certificates, keeping its server URL.
func refreshKubeconfig(cfg Config) (Result, bool, error) {
	data, err := os.ReadFile(cfg.KubeconfigPath())
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
