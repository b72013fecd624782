package pki

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/konnect-dev/konnect/pki/smallfile"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Names of the extension server specs: the serving CA of an aggregated API server or webhook, the CA that
// replaces it during a rotation, and the serving certificate.
const (
	APIServiceCA      = "apiservice-ca"
	APIServiceNextCA  = "apiservice-ca-next"
	APIServiceServing = "apiservice-serving"
)

// ServingSpecs is the table for an extension server (aggregated API server, admission or conversion
// webhook) reached as Service name in namespace: a serving CA (its certificate becomes the caBundle) and
// a serving certificate for the Service's DNS names, in files ca.{crt,key} and tls.{crt,key}, the key
// names of a kubernetes.io/tls Secret. During a CA rotation the table also holds ca-next.{crt,key}, and
// from step 2 on the serving certificate is issued by it.
func ServingSpecs(name, namespace string, phase RotationPhase) []*Spec {
	svc := name + "." + namespace + ".svc"
	specs := []*Spec{{
		Name: APIServiceCA, BaseName: "ca", IsCA: true, CommonName: svc + "-ca",
		Description: "CA that signs the extension server's serving certificate (the caBundle)",
	}}
	issuer := APIServiceCA
	if phase != NotRotating {
		specs = append(specs, &Spec{
			Name: APIServiceNextCA, BaseName: "ca-next", IsCA: true, CommonName: svc + "-ca",
			Description: "CA that replaces " + APIServiceCA + " (konnect certs rotate-ca)",
		})
	}
	if phase == ServingFromNext {
		issuer = APIServiceNextCA
	}
	return append(specs, &Spec{
		Name: APIServiceServing, BaseName: "tls", CA: issuer, CommonName: svc,
		Usages:      []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		Description: "serving certificate of the extension server (CN and SAN " + svc + ", SAN " + svc + ".cluster.local)",
		AltNames: func(*Config) AltNames {
			return AltNames{DNSNames: []string{svc, svc + ".cluster.local"}}
		},
	})
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

// controlPlaneFiles are files that only a control plane's certificate directory holds (kubeadm's, or konnect
// init's): a ca.crt beside them is the cluster CA.
var controlPlaneFiles = []string{"front-proxy-ca.crt", "sa.key", "apiserver.crt", "konnectivity-server.crt"}

// checkServingDir refuses a control plane's certificate directory as an extension server's: its CA would be
// taken for the serving CA, and rotating that would replace the cluster CA (kubelets, admin credentials
// and kube-apiserver's own serving certificate would stop verifying).
func checkServingDir(dir string) error {
	for _, f := range controlPlaneFiles {
		if exists(filepath.Join(dir, f)) {
			return fmt.Errorf("pki: %s holds a control plane's certificates (%s), so its ca.crt is the cluster CA, not an extension server's; give the extension server a directory of its own", dir, f)
		}
	}
	return nil
}

// IsServingDir reports whether dir holds an extension server's serving files, as konnect certs apiservice
// and konnect certs webhook write them (tls.{crt,key}, or a rotation's ca-next.{crt,key}), and none of a
// control plane's: its ca.crt is then the serving CA, and its certificates are those of ServingSpecs.
func IsServingDir(dir string) bool {
	if checkServingDir(dir) != nil {
		return false
	}
	for _, s := range ServingSpecs("x", "x", ServingFromNext) {
		if !s.IsCA || s.Name == APIServiceNextCA {
			if exists(s.CertFile(dir)) || exists(s.KeyFile(dir)) {
				return true
			}
		}
	}
	return false
}

// ServingBundle is what an extension server's Secret and caBundles carry.
type ServingBundle struct {
	CA   []byte // PEM, the caBundle: one CA, or the old and the new one during a rotation
	Cert []byte // PEM, tls.crt
	Key  []byte // PEM, tls.key
}

// EnsureServing creates or checks, directly in cfg.Dir (no pki subdirectory), the serving CA and the
// serving certificate of the extension server name.namespace, with the same rules as Ensure. In the middle
// of a CA rotation it checks the files of the phase reached and never starts or advances the rotation.
// The bundle is empty on a dry run that would create files.
func EnsureServing(cfg Config, name, namespace string) ([]Result, ServingBundle, error) {
	cfg = cfg.withDefaults()
	if err := ValidateService(name, namespace); err != nil {
		return nil, ServingBundle{}, fmt.Errorf("pki: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, ServingBundle{}, fmt.Errorf("pki: %w", err)
	}
	if err := checkServingDir(cfg.Dir); err != nil {
		return nil, ServingBundle{}, err
	}
	phase, err := servingPhaseFor(cfg)
	if err != nil {
		return nil, ServingBundle{}, err
	}
	specs := ServingSpecs(name, namespace, phase)
	e := &engine{dir: cfg.Dir, specs: specs, cfg: &cfg, now: cfg.now(), authorities: map[string]*authority{}}
	res, err := e.run(selectAll(specs))
	if err != nil {
		return res, ServingBundle{}, err
	}
	if cfg.DryRun && !exists(specs[len(specs)-1].CertFile(cfg.Dir)) {
		return res, ServingBundle{}, nil
	}
	b, err := readServingBundle(cfg.Dir, phase)
	return res, b, err
}

func selectAll(specs []*Spec) map[string]bool {
	sel := map[string]bool{}
	for _, s := range specs {
		sel[s.Name] = true
	}
	return sel
}

// ReadServingBundle reads what the Secret and the caBundles of the extension server whose files are in dir
// carry, in the rotation phase reached.
func ReadServingBundle(dir string) (ServingBundle, error) {
	phase, err := ServingRotationPhase(dir)
	if err != nil {
		return ServingBundle{}, err
	}
	return readServingBundle(dir, phase)
}

// readServingBundle reads the caBundle of phase and the serving pair from dir.
func readServingBundle(dir string, phase RotationPhase) (ServingBundle, error) {
	specs := ServingSpecs("x", "x", phase) // file names only
	var cas [][]byte
	var b ServingBundle
	for _, s := range specs {
		data, err := smallfile.Read(s.CertFile(dir))
		if err != nil {
			return ServingBundle{}, fmt.Errorf("pki: %w", err)
		}
		if s.IsCA {
			cas = append(cas, data)
			continue
		}
		b.Cert = data
		if b.Key, err = smallfile.Read(s.KeyFile(dir)); err != nil {
			return ServingBundle{}, fmt.Errorf("pki: %w", err)
		}
	}
	b.CA = bytes.Join(cas, nil)
	return b, nil
}
