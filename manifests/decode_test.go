package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// decode decodes one rendered file strictly with the client-go scheme: an unknown or duplicated field, or
// a kind client-go does not know, fails the test.
func decode(t *testing.T, f File) runtime.Object {
	t.Helper()
	obj, _, err := strict.Decode(f.Data, nil, nil)
	if err != nil {
		t.Fatalf("%s does not decode strictly: %v\n%s", f.Name, err, f.Data)
	}
	return obj
}

func byName(t *testing.T, files []File, name string) File {
	t.Helper()
	for _, f := range files {
		if f.Name == name {
			return f
		}
	}
	t.Fatalf("no file %s among %d rendered files", name, len(files))
	return File{}
}

// checkKustomization checks that kustomization.yaml lists exactly the other files, in order.
func checkKustomization(t *testing.T, files []File) {
	t.Helper()
	k := byName(t, files, "kustomization.yaml")
	var got struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(k.Data, &got); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if got.APIVersion != "kustomize.config.k8s.io/v1beta1" || got.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml is %s %s", got.APIVersion, got.Kind)
	}
	var want []string
	for _, f := range files {
		if f.Name != "kustomization.yaml" {
			want = append(want, f.Name)
		}
	}
	if strings.Join(got.Resources, " ") != strings.Join(want, " ") {
		t.Errorf("kustomization resources = %q, want %q", got.Resources, want)
	}
}

// kustomize runs the real `kubectl kustomize` over files written to a directory, as `kubectl apply -k`
// would, and returns the number of objects it emitted; ran is false when kubectl is not installed. It
// does not skip the test, so that the typed checks after it still run without kubectl.
func kustomize(t *testing.T, files []File) (objects int, ran bool) {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("kubectl not installed: kubectl kustomize not checked")
		return 0, false
	}
	dir := t.TempDir()
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.Name), f.Data, f.Mode); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	return strings.Count("\n"+string(out), "\n---\n") + 1, true
}
