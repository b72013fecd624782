package manifests

import (
	"encoding/base64"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki/field"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

func wardle(t *testing.T) APIService {
	t.Helper()
	ca, _ := testPEM(t, "api.wardle.svc-ca")
	cert, key := testPEM(t, "api.wardle.svc")
	return APIService{Service: "api", Namespace: "wardle", Group: "wardle.example.com", Versions: []string{"v1alpha1"}, CACert: ca, Cert: cert, Key: key}
}

func TestAPIServiceManifests(t *testing.T) {
	in := wardle(t)
	files, err := in.Render()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	if want := []string{"secret.yaml", "apiservice.yaml", "auth-delegator.yaml", "authentication-reader.yaml", "kustomization.yaml"}; !slices.Equal(names, want) {
		t.Fatalf("files %q, want %q", names, want)
	}
	if !slices.Equal(names, APIServiceFiles) {
		t.Fatalf("Render writes %q, APIServiceFiles names %q", names, APIServiceFiles)
	}
	checkKustomization(t, files)
	if n, ran := kustomize(t, files); ran && n != 4 {
		t.Errorf("kubectl kustomize emitted %d objects, want 4", n)
	}

	sf := byName(t, files, "secret.yaml")
	if sf.Mode != 0o600 {
		t.Errorf("secret.yaml mode %v, want 0600: it holds the private key", sf.Mode)
	}
	secret := decode(t, sf).(*corev1.Secret)
	if secret.Name != "api-tls" || secret.Namespace != "wardle" || secret.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret %s/%s type %s", secret.Namespace, secret.Name, secret.Type)
	}
	for k, want := range map[string][]byte{"tls.crt": in.Cert, "tls.key": in.Key, "ca.crt": in.CACert} {
		if string(secret.Data[k]) != string(want) {
			t.Errorf("Secret data %s does not round-trip", k)
		}
	}
	if len(secret.Data) != 3 || len(secret.StringData) != 0 {
		t.Errorf("Secret has keys %v", reflect.ValueOf(secret.Data).MapKeys())
	}

	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "api", Namespace: "wardle"}}
	crb := decode(t, byName(t, files, "auth-delegator.yaml")).(*rbacv1.ClusterRoleBinding)
	if crb.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:auth-delegator"}) || !slices.Equal(crb.Subjects, subject) {
		t.Errorf("auth-delegator binding %+v", crb)
	}
	rb := decode(t, byName(t, files, "authentication-reader.yaml")).(*rbacv1.RoleBinding)
	if rb.Namespace != "kube-system" || rb.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "extension-apiserver-authentication-reader"}) ||
		!slices.Equal(rb.Subjects, subject) {
		t.Errorf("authentication-reader binding %+v", rb)
	}
	if crb.Name == rb.Name && rb.Namespace == "" {
		t.Error("binding names collide")
	}

	// The APIService is not in client-go's scheme: check it field by field as generic YAML, so that a
	// field the local struct spells wrong shows up as an unexpected key.
	var api map[string]any
	if err := yaml.UnmarshalStrict(byName(t, files, "apiservice.yaml").Data, &api); err != nil {
		t.Fatal(err)
	}
	if api["apiVersion"] != "apiregistration.k8s.io/v1" || api["kind"] != "APIService" {
		t.Errorf("apiVersion %v kind %v", api["apiVersion"], api["kind"])
	}
	meta := api["metadata"].(map[string]any)
	if meta["name"] != "v1alpha1.wardle.example.com" || meta["namespace"] != nil {
		t.Errorf("metadata %v: want cluster-scoped v1alpha1.wardle.example.com", meta)
	}
	spec := api["spec"].(map[string]any)
	var keys []string
	for k := range spec {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"caBundle", "group", "groupPriorityMinimum", "service", "version", "versionPriority"}; !slices.Equal(keys, want) {
		t.Errorf("spec keys %q, want %q (never insecureSkipTLSVerify)", keys, want)
	}
	caBundle, err := base64.StdEncoding.DecodeString(spec["caBundle"].(string))
	if err != nil || string(caBundle) != string(in.CACert) {
		t.Errorf("caBundle is not the serving CA (err %v)", err)
	}
	if spec["group"] != "wardle.example.com" || spec["version"] != "v1alpha1" || spec["groupPriorityMinimum"] != float64(1000) || spec["versionPriority"] != float64(15) {
		t.Errorf("spec %v", spec)
	}
	if svc := spec["service"].(map[string]any); svc["name"] != "api" || svc["namespace"] != "wardle" || svc["port"] != float64(443) || len(svc) != 3 {
		t.Errorf("service %v", svc)
	}
}

// TestAPIServiceVersions: a server that serves two versions gets an APIService for each in one file, with
// the same caBundle, and kubectl kustomize sees both.
func TestAPIServiceVersions(t *testing.T) {
	in := wardle(t)
	in.Versions = []string{"v1alpha1", "v1beta1"}
	files, err := in.Render()
	if err != nil {
		t.Fatal(err)
	}
	if n, ran := kustomize(t, files); ran && n != 5 {
		t.Errorf("kubectl kustomize emitted %d objects, want 5", n)
	}
	docs := strings.Split(string(byName(t, files, "apiservice.yaml").Data), "---\n")
	if len(docs) != 2 {
		t.Fatalf("apiservice.yaml holds %d documents, want 2", len(docs))
	}
	for i, want := range []string{"v1alpha1", "v1beta1"} {
		var api struct {
			Metadata struct{ Name string }
			Spec     struct {
				Version  string
				CABundle []byte
			}
		}
		if err := yaml.Unmarshal([]byte(docs[i]), &api); err != nil {
			t.Fatal(err)
		}
		if api.Metadata.Name != want+".wardle.example.com" || api.Spec.Version != want || string(api.Spec.CABundle) != string(in.CACert) {
			t.Errorf("document %d: %s, version %s, caBundle the serving CA: %v", i, api.Metadata.Name, api.Spec.Version, string(api.Spec.CABundle) == string(in.CACert))
		}
	}
}

func TestAPIServiceRefusesBadInput(t *testing.T) {
	tests := []struct {
		name string
		edit func(*APIService)
		want string
	}{
		{"service not a DNS label", func(a *APIService) { a.Service = "Api.Server" }, "Service"},
		{"namespace not a DNS label", func(a *APIService) { a.Namespace = "wardle_ns" }, "Namespace"},
		{"empty group", func(a *APIService) { a.Group = "" }, "Group"},
		{"version not a DNS label", func(a *APIService) { a.Versions = []string{"v1alpha1", "1.0"} }, "Versions"},
		{"no version", func(a *APIService) { a.Versions = nil }, "Versions"},
		{"version twice", func(a *APIService) { a.Versions = []string{"v1", "v1"} }, "Versions"},
		{"no caBundle", func(a *APIService) { a.CACert = nil }, "CA certificate"},
		{"key given as certificate", func(a *APIService) { a.Key = a.Cert }, "serving key"},
		{"certificate not PEM", func(a *APIService) { a.Cert = []byte("-----BEGIN garbage") }, "serving certificate"},
		{"group priority out of range", func(a *APIService) { a.GroupPriorityMinimum = 30000 }, "group priority"},
		{"version priority out of range", func(a *APIService) { a.VersionPriority = -1 }, "version priority"},
		{"port out of range", func(a *APIService) { a.Port = -443 }, "port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := wardle(t)
			tc.edit(&a)
			_, err := a.Render()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render() error = %v, want one containing %q", err, tc.want)
			}
			var fe *field.Error
			if slices.Contains([]string{"Service", "Namespace", "Group", "Versions"}, tc.want) && (!errors.As(err, &fe) || !slices.Equal(fe.Fields(), []string{tc.want})) {
				t.Fatalf("Render() error = %v, want a field error naming %s", err, tc.want)
			}
		})
	}
}
