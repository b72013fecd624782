package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// initManifests runs konnect init into a fresh directory with extra flags and returns the server's static pod
// and the agents' DaemonSet it wrote.
func initManifests(t *testing.T, extra ...string) (*corev1.Pod, *appsv1.DaemonSet) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "k")
	args := append([]string{"init", "--dir", dir, "--control-plane-address", "127.0.0.1", "--apiserver-url", "https://127.0.0.1:6443",
		"--key-algorithm", "ecdsa-p256"}, extra...)
	if _, _, err := konnect(t, args...); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	var ds appsv1.DaemonSet
	for path, obj := range map[string]any{
		filepath.Join(dir, "manifests", "konnectivity-server.yaml"):         &pod,
		filepath.Join(dir, "konnectivity-agent", "konnectivity-agent.yaml"): &ds,
	} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	return &pod, &ds
}

// konnect init --image puts a pushed image into both manifests (README.md, "The container image").
func TestInitImageNamesTheManifests(t *testing.T) {
	const image = "registry.example.com/konnect:v1"
	pod, ds := initManifests(t, "--image", image)
	for what, spec := range map[string]corev1.PodSpec{"static pod": pod.Spec, "DaemonSet": ds.Spec.Template.Spec} {
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			if c.Image != image {
				t.Errorf("%s container %s runs %q, want %s", what, c.Name, c.Image, image)
			}
		}
	}
}

// The manifests run on nodes of any architecture: they name the image by tag, which `make image-multiarch`
// gives to one image index for linux/amd64 and linux/arm64, and nothing in them selects an architecture.
func TestManifestsArePlatformNeutral(t *testing.T) {
	pod, ds := initManifests(t, "--agent-auth", "mtls")
	for what, spec := range map[string]corev1.PodSpec{"static pod": pod.Spec, "DaemonSet": ds.Spec.Template.Spec} {
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			if strings.Contains(c.Image, "@") {
				t.Errorf("%s container %s pins %s by digest, which names one platform's manifest or the index", what, c.Name, c.Image)
			}
		}
		for k := range spec.NodeSelector {
			if strings.Contains(k, "arch") {
				t.Errorf("%s selects nodes by %s", what, k)
			}
		}
		if a := spec.Affinity; a != nil && a.NodeAffinity != nil {
			b, _ := json.Marshal(a.NodeAffinity)
			if strings.Contains(string(b), "arch") {
				t.Errorf("%s has a node affinity on the architecture: %s", what, b)
			}
		}
	}
}
