package manifests

import (
	"fmt"
	"slices"
	"strings"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/field"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// APIService is the input of an extension API server's manifests: a kubernetes.io/tls Secret with its
// serving certificate, the APIService that registers it with the aggregator, and the RBAC every
// extension API server needs to authenticate and authorize the requests kube-apiserver forwards.
type APIService struct {
	// Service and Namespace name the Service in front of the extension API server.
	Service, Namespace string
	// Group is the API group it serves, and Versions its versions: one APIService each, all with the same
	// caBundle, since one server serves them all.
	Group    string
	Versions []string

	// CACert is the PEM of the CA that signed the serving certificate: the APIService's caBundle.
	CACert []byte
	// Cert and Key are the PEM serving certificate and key, for the Secret.
	Cert, Key []byte

	// SecretName names the Secret; empty means Service + "-tls".
	SecretName string
	// ServiceAccount is the extension API server's ServiceAccount in Namespace; empty means Service.
	ServiceAccount string
	// Port is the Service port; zero means 443.
	Port int32
	// GroupPriorityMinimum and VersionPriority order the group and version in discovery; zero means 1000
	// and 15, the values the Kubernetes sample-apiserver registers with.
	GroupPriorityMinimum, VersionPriority int32
}

// APIServiceFile is the file of Render that holds the APIServices.
const APIServiceFile = "apiservice.yaml"

// The files of Render that hold the extension server's RBAC.
const (
	authDelegatorFile = "auth-delegator.yaml"
	authReaderFile    = "authentication-reader.yaml"
)

// APIServiceFiles are the names of the files Render writes. A directory that `certs webhook` shares with
// `certs apiservice` keeps these names for the APIService's files, so a webhook manifest may not take one.
var APIServiceFiles = []string{ServingSecretFile, APIServiceFile, authDelegatorFile, authReaderFile, "kustomization.yaml"}

// apiService mirrors the fields of apiregistration.k8s.io/v1 APIService that konnect renders; the real
// type lives in k8s.io/kube-aggregator, whose dependencies are far larger than these few lines.
type apiService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              apiServiceSpec `json:"spec"`
}

type apiServiceSpec struct {
	Service               *serviceReference `json:"service,omitempty"`
	Group                 string            `json:"group,omitempty"`
	Version               string            `json:"version,omitempty"`
	InsecureSkipTLSVerify bool              `json:"insecureSkipTLSVerify,omitempty"`
	CABundle              []byte            `json:"caBundle,omitempty"`
	GroupPriorityMinimum  int32             `json:"groupPriorityMinimum"`
	VersionPriority       int32             `json:"versionPriority"`
}

type serviceReference struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Port      *int32 `json:"port,omitempty"`
}

func (a APIService) withDefaults() APIService {
	if a.SecretName == "" {
		a.SecretName = ServingSecretName(a.Service)
	}
	if a.ServiceAccount == "" {
		a.ServiceAccount = a.Service
	}
	if a.Port == 0 {
		a.Port = 443
	}
	if a.GroupPriorityMinimum == 0 {
		a.GroupPriorityMinimum = 1000
	}
	if a.VersionPriority == 0 {
		a.VersionPriority = 15
	}
	return a
}

// Names are the APIServices' object names, VERSION.GROUP, as the aggregator requires.
func (a APIService) Names() []string {
	var names []string
	for _, v := range a.Versions {
		names = append(names, v+"."+a.Group)
	}
	return names
}

// Validate checks a against the rules the aggregator and the core API apply to these objects.
func (a APIService) Validate() error {
	a = a.withDefaults()
	if errs := validation.IsDNS1035Label(a.Service); len(errs) > 0 {
		return field.Errorf("{Service} %q: %s", a.Service, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(a.Namespace); len(errs) > 0 {
		return field.Errorf("{Namespace} %q: %s", a.Namespace, strings.Join(errs, "; "))
	}
	// The core group has no APIService of this kind; extension servers always serve a named group.
	if errs := validation.IsDNS1123Subdomain(a.Group); len(errs) > 0 {
		return field.Errorf("{Group} %q: %s", a.Group, strings.Join(errs, "; "))
	}
	if len(a.Versions) == 0 {
		return field.Errorf("{Versions}: at least one version is required")
	}
	for i, v := range a.Versions {
		if errs := validation.IsDNS1035Label(v); len(errs) > 0 {
			return field.Errorf("{Versions} %q: %s", v, strings.Join(errs, "; "))
		}
		if slices.Contains(a.Versions[:i], v) {
			return field.Errorf("{Versions} %q: given twice", v)
		}
	}
	if errs := validation.IsDNS1123Subdomain(a.SecretName); len(errs) > 0 {
		return fmt.Errorf("secret name %q: %s", a.SecretName, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(a.ServiceAccount); len(errs) > 0 {
		return field.Errorf("{ServiceAccount} %q: %s", a.ServiceAccount, strings.Join(errs, "; "))
	}
	if a.Port < 1 || a.Port > 65535 {
		return fmt.Errorf("service port %d: must be between 1 and 65535", a.Port)
	}
	if a.GroupPriorityMinimum < 1 || a.GroupPriorityMinimum > 20000 {
		return fmt.Errorf("group priority minimum %d: must be between 1 and 20000", a.GroupPriorityMinimum)
	}
	if a.VersionPriority < 1 || a.VersionPriority > 1000 {
		return fmt.Errorf("version priority %d: must be between 1 and 1000", a.VersionPriority)
	}
	// Without a caBundle kube-apiserver would not trust the server; konnect never renders
	// insecureSkipTLSVerify instead.
	for _, f := range []struct {
		what  string
		data  []byte
		block string
	}{{"CA certificate", a.CACert, "CERTIFICATE"}, {"serving certificate", a.Cert, "CERTIFICATE"}, {"serving key", a.Key, "PRIVATE KEY"}} {
		if !pki.HasPEMBlock(f.data, f.block) {
			return fmt.Errorf("%s: no PEM %s block", f.what, f.block)
		}
	}
	return nil
}

// Render renders the Secret (0600: it holds the key), the APIServices (one file), a ClusterRoleBinding to
// system:auth-delegator (TokenReview and SubjectAccessReview) and a RoleBinding in kube-system to
// extension-apiserver-authentication-reader (the front-proxy CA and header names), plus a
// kustomization.yaml listing them.
func (a APIService) Render() ([]File, error) {
	if err := a.Validate(); err != nil {
		return nil, fmt.Errorf("apiservice: %w", err)
	}
	a = a.withDefaults()
	labels := servingLabels(a.Service)
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: a.ServiceAccount, Namespace: a.Namespace}}
	var apiServices []any
	for i, name := range a.Names() {
		apiServices = append(apiServices, &apiService{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apiregistration.k8s.io/v1", Kind: "APIService"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: apiServiceSpec{
				Service:              &serviceReference{Namespace: a.Namespace, Name: a.Service, Port: &a.Port},
				Group:                a.Group,
				Version:              a.Versions[i],
				CABundle:             a.CACert,
				GroupPriorityMinimum: a.GroupPriorityMinimum,
				VersionPriority:      a.VersionPriority,
			},
		})
	}
	return renderAll([]namedObject{
		{name: ServingSecretFile, secret: true, obj: servingSecret(a.SecretName, a.Namespace, labels, ServingCerts{CA: a.CACert, Cert: a.Cert, Key: a.Key})},
		{name: APIServiceFile, obj: documents(apiServices)},
		{name: authDelegatorFile, obj: &rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: a.Namespace + ":" + a.ServiceAccount + ":system:auth-delegator", Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
			Subjects:   subject,
		}},
		{name: authReaderFile, obj: &rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: a.Namespace + ":" + a.ServiceAccount + ":extension-apiserver-authentication-reader", Namespace: konnectivity.Namespace, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"},
			Subjects:   subject,
		}},
	})
}
