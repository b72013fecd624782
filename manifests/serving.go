package manifests

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/konnect-dev/konnect/pki"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// ServingSecretFile is the file name of an extension server's serving Secret, in the directories that
// `konnect certs apiservice` and `konnect certs webhook` write.
const ServingSecretFile = "secret.yaml"

// ServingCerts are the PEM files an extension server's Secret carries.
type ServingCerts struct {
	CA, Cert, Key []byte
}

// ServingSecretName is the Secret of the extension server behind Service name.
func ServingSecretName(service string) string { return service + "-tls" }

func servingLabels(service string) map[string]string {
	return commonLabels(map[string]string{"app.kubernetes.io/name": service})
}

// servingSecret is the kubernetes.io/tls Secret an extension server mounts: tls.crt and tls.key, and
// ca.crt holding the caBundle.
func servingSecret(name, namespace string, labels map[string]string, c ServingCerts) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       c.Cert,
			corev1.TLSPrivateKeyKey: c.Key,
			"ca.crt":                c.CA,
		},
	}
}

// RenderServingSecret renders the Secret of the extension server behind ref (mode 0600: it holds the key).
func RenderServingSecret(ref ServiceRef, c ServingCerts) (File, error) {
	for _, f := range []struct {
		what  string
		data  []byte
		block string
	}{{"CA certificate", c.CA, "CERTIFICATE"}, {"serving certificate", c.Cert, "CERTIFICATE"}, {"serving key", c.Key, "PRIVATE KEY"}} {
		if !pki.HasPEMBlock(f.data, f.block) {
			return File{}, fmt.Errorf("%s: no PEM %s block", f.what, f.block)
		}
	}
	files, err := renderAll([]namedObject{{name: ServingSecretFile, secret: true,
		obj: servingSecret(ServingSecretName(ref.Name), ref.Namespace, servingLabels(ref.Name), c)}})
	if err != nil {
		return File{}, err
	}
	return files[0], nil
}

// Kustomization renders the kustomization.yaml of an extension server's directory: the resources that
// existing, the directory's kustomization.yaml from an earlier run (nil for none), lists, followed by those of
// files it lacks. So konnect certs apiservice and konnect certs webhook can share a directory, and a rerun
// with fewer manifests drops none. A kustomization.yaml with more in it than konnect writes (other fields,
// resources that are not files of the directory) is someone else's, and is refused rather than replaced.
func Kustomization(existing []byte, files []File) (File, error) {
	var names []string
	if existing != nil {
		var k map[string]any
		if err := yaml.Unmarshal(existing, &k); err != nil {
			return File{}, err
		}
		for key, v := range k {
			switch key {
			case "apiVersion", "kind":
			case "resources":
				list, ok := v.([]any)
				if !ok && v != nil {
					return File{}, fmt.Errorf("resources is not a list")
				}
				for _, r := range list {
					name, ok := r.(string)
					if !ok || name == "" || name != filepath.Base(name) || name == "." || name == ".." {
						return File{}, fmt.Errorf("resource %v is not a file of the directory, so konnect did not write it; konnect would replace this kustomization.yaml: give konnect a directory of its own", r)
					}
					names = append(names, name)
				}
			default:
				return File{}, fmt.Errorf("field %q is not one konnect writes, and konnect would replace this kustomization.yaml: give konnect a directory of its own", key)
			}
		}
	}
	for _, f := range files {
		if !slices.Contains(names, f.Name) {
			names = append(names, f.Name)
		}
	}
	return kustomization(names)
}
