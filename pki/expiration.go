package pki

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/konnect-dev/konnect/pki/smallfile"
)

// Expiration describes one certificate on disk. It carries no key material.
type Expiration struct {
	Name     string    `json:"name"`
	File     string    `json:"file"`
	NotAfter time.Time `json:"expires"`
	// ResidualSeconds is negative once the certificate has expired.
	ResidualSeconds int64  `json:"residualSeconds"`
	Residual        string `json:"residual"`
	CA              bool   `json:"ca"`
	// External is set when the issuing CA's key is not on this node, so konnect cannot renew it.
	External bool   `json:"external"`
	Issuer   string `json:"issuer"`
	// Error is why the certificate could not be read; the times are zero then.
	Error string `json:"error,omitempty"`
}

// CheckExpiration reports every certificate of the table found in DIR/pki, and the client certificate
// embedded in DIR/konnectivity-server.conf. Missing certificates are left out. An unreadable one is listed
// with its Error beside the others, so that one corrupt file hides none of them, and the error returned
// with the list names every such file.
// In an extension server's directory (see IsServingDir) the table is ServingSpecs in the rotation phase
// reached, and nothing is written.
func CheckExpiration(cfg Config) ([]Expiration, error) {
	cfg = cfg.withDefaults()
	now := cfg.now()
	dir := cfg.PKIDir()
	specs := Specs()
	serving := IsServingDir(dir)
	if serving {
		phase, err := servingRotationPhase(dir, false)
		if err != nil {
			return nil, err
		}
		specs = ServingSpecs("x", "x", phase) // names and files only
	}
	var out []Expiration
	var problems []error
	unreadable := func(name, file string, ca bool, err error) {
		out = append(out, Expiration{Name: name, File: file, CA: ca, Error: err.Error()})
		problems = append(problems, err)
	}
	for _, s := range specs {
		certFile := s.CertFile(dir)
		if !exists(certFile) {
			continue
		}
		cert, _, err := readCert(certFile)
		if err != nil {
			unreadable(s.Name, certFile, s.IsCA, err)
			continue
		}
		e := expiration(s.Name, certFile, cert.NotAfter, now)
		e.CA = s.IsCA
		e.Issuer = cert.Issuer.CommonName
		signer := s
		if !s.IsCA {
			signer, _ = Lookup(specs, s.CA)
			// Not moved to its CA yet (konnect init does that): still the former CA's.
			if s.FormerCA != "" && !exists(signer.CertFile(dir)) {
				signer, _ = Lookup(specs, s.FormerCA)
			}
		}
		e.External = !exists(signer.KeyFile(dir))
		out = append(out, e)
	}
	if !serving { // no kubeconfig beside an extension server's certificates
		if e, err := kubeconfigExpiration(cfg, specs, now); err != nil {
			unreadable(KubeconfigFile, cfg.KubeconfigPath(), false, err)
		} else if e != nil {
			out = append(out, *e)
		}
	}
	if len(problems) > 0 {
		return out, fmt.Errorf("pki: %w", errors.Join(problems...))
	}
	return out, nil
}

// kubeconfigExpiration describes the client certificate embedded in DIR/konnectivity-server.conf, or
// returns nil when there is no such file.
func kubeconfigExpiration(cfg Config, specs []*Spec, now time.Time) (*Expiration, error) {
	path := cfg.KubeconfigPath()
	data, err := smallfile.Read(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	certPEM, err := kubeconfigClientCert(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cert, err := ParseCertificatePEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: embedded client certificate: %w", path, err)
	}
	e := expiration(KubeconfigFile, path, cert.NotAfter, now)
	e.Issuer = cert.Issuer.CommonName
	caSpec, _ := Lookup(specs, CA)
	e.External = !exists(caSpec.KeyFile(cfg.PKIDir()))
	return &e, nil
}

func expiration(name, file string, notAfter, now time.Time) Expiration {
	d := notAfter.Sub(now)
	return Expiration{Name: name, File: file, NotAfter: notAfter.UTC(), ResidualSeconds: int64(d / time.Second), Residual: HumanDuration(d)}
}

// HumanDuration prints a residual lifetime the way kubeadm does: 9y, 364d, 23h, 59m, or "expired".
func HumanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "expired"
	case d >= 365*24*time.Hour:
		return fmt.Sprintf("%dy", d/(365*24*time.Hour))
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d >= time.Hour:
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return fmt.Sprintf("%dm", d/time.Minute)
}
