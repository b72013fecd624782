package pki

import (
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Names of the extension API server specs.
const (
	APIServiceCA      = "apiservice-ca"
	APIServiceServing = "apiservice-serving"
)

// APIServiceSpecs is the table for an extension API server reached as Service name in namespace: a
// serving CA (its certificate becomes the APIService's caBundle) and a serving certificate for the
// Service's DNS names, in files ca.{crt,key} and tls.{crt,key}, the key names of a kubernetes.io/tls Secret.
func APIServiceSpecs(name, namespace string) []*Spec {
	svc := name + "." + namespace + ".svc"
	return []*Spec{
		{
			Name: APIServiceCA, BaseName: "ca", IsCA: true, CommonName: svc + "-ca",
			Description: "CA that signs the extension API server's serving certificate (the APIService caBundle)",
		},
		{
			Name: APIServiceServing, BaseName: "tls", CA: APIServiceCA, CommonName: svc,
			Usages:      []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			Description: "serving certificate of the extension API server (CN and SAN " + svc + ", SAN " + svc + ".cluster.local)",
			AltNames: func(*Config) AltNames {
				return AltNames{DNSNames: []string{svc, svc + ".cluster.local"}}
			},
		},
	}
}

// ValidateService checks a Service name and namespace.
func ValidateService(name, namespace string) error {
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		return fmt.Errorf("service name %q: %s", name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	return nil
}

// ServingBundle is what an extension API server's Secret and APIService carry.
type ServingBundle struct {
	CA   []byte // PEM, the APIService caBundle
	Cert []byte // PEM, tls.crt
	Key  []byte // PEM, tls.key
}

// EnsureAPIService creates or checks, directly in cfg.Dir (no pki subdirectory), the serving CA and the
// serving certificate of the extension API server name.namespace, with the same rules as Ensure. The
// bundle is empty on a dry run that would create files.
func EnsureAPIService(cfg Config, name, namespace string) ([]Result, ServingBundle, error) {
	cfg = cfg.withDefaults()
	if err := ValidateService(name, namespace); err != nil {
		return nil, ServingBundle{}, fmt.Errorf("pki: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, ServingBundle{}, fmt.Errorf("pki: %w", err)
	}
	specs := APIServiceSpecs(name, namespace)
	sel := map[string]bool{APIServiceCA: true, APIServiceServing: true}
	e := &engine{dir: cfg.Dir, specs: specs, cfg: &cfg, now: cfg.now(), authorities: map[string]*authority{}}
	res, err := e.run(sel)
	if err != nil {
		return res, ServingBundle{}, err
	}
	if cfg.DryRun && !exists(specs[1].CertFile(cfg.Dir)) {
		return res, ServingBundle{}, nil
	}
	var b ServingBundle
	for _, f := range []struct {
		dst  *[]byte
		path string
	}{{&b.CA, specs[0].CertFile(cfg.Dir)}, {&b.Cert, specs[1].CertFile(cfg.Dir)}, {&b.Key, specs[1].KeyFile(cfg.Dir)}} {
		if *f.dst, err = os.ReadFile(f.path); err != nil {
			return res, ServingBundle{}, fmt.Errorf("pki: %w", err)
		}
	}
	return res, b, nil
}
