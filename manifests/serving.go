package manifests

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		if !containsPEM(f.data, f.block) {
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

// Kustomization renders a kustomization.yaml that lists files, in order.
func Kustomization(files []File) (File, error) { return kustomization(files) }
