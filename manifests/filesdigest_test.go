package manifests

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// TestPodMountedFiles: the files read back from a rendered pod are the files the Server mounts, in the same
// order, in every set-up, so that a digest renew computes from the pod is the one init computes from its flags.
func TestPodMountedFiles(t *testing.T) {
	base := Server{Image: Image("v1.0.0"), Mode: "grpc", UDSName: "/run/k/k.sock",
		ClusterCert: "/p/konnectivity-server.crt", ClusterKey: "/p/konnectivity-server.key", Kubeconfig: "/k/konnectivity-server.conf"}
	tcp := base
	tcp.Mode, tcp.UDSName = "http-connect", ""
	tcp.ServerCert, tcp.ServerKey, tcp.ServerCACert = "/p/konnectivity-frontend.crt", "/p/konnectivity-frontend.key", "/p/ca.crt"
	mtls := base
	mtls.Kubeconfig, mtls.AgentClientCA = "", "/p/konnectivity-agent-ca.crt"
	// One file for two flags: the pod mounts it once.
	shared := tcp
	shared.AgentClientCA = "/p/ca.crt"
	shared.Kubeconfig = ""
	for name, s := range map[string]Server{"uds": base, "tcp": tcp, "mtls": mtls, "shared": shared} {
		pod, err := s.Pod()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, want := PodMountedFiles(pod), s.MountedFiles(); !slices.Equal(got, want) || len(got) == 0 {
			t.Errorf("%s: files of the pod %q, of the server %q", name, got, want)
		}
	}
	// A volume an operator added, and a path they changed.
	pod, err := base.Pod()
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/extra"}}})
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == "kubeconfig" {
			pod.Spec.Volumes[i].HostPath.Path = "/elsewhere/server.conf"
		}
	}
	if got, want := PodMountedFiles(pod), []string{base.ClusterCert, base.ClusterKey, "/elsewhere/server.conf"}; !slices.Equal(got, want) {
		t.Errorf("edited pod: files %q, want %q", got, want)
	}
}

// TestFilesDigest: names and contents count, and a missing file counts as empty.
func TestFilesDigest(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	digest := func(files ...string) string {
		t.Helper()
		d, err := FilesDigest(files)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	missing := digest(a, b)
	if err := os.WriteFile(a, []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	one := digest(a, b)
	if err := os.WriteFile(a, []byte("2"), 0o600); err != nil {
		t.Fatal(err)
	}
	two := digest(a, b)
	if err := os.WriteFile(a, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if missing == one || one == two || digest(a, b) != missing || digest(b, a) == missing || len(missing) != 64 {
		t.Errorf("digests: missing %s, one %s, two %s", missing, one, two)
	}
	if err := os.Mkdir(b, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := FilesDigest([]string{b}); err == nil {
		t.Error("a directory has a digest")
	}
}

// TestSetFilesDigest: only the annotation changes. In a pod as Render writes it, or as an operator edited it,
// every other byte stays; a pod without the annotation gets it and keeps its comments; the same digest
// changes nothing; a JSON pod stays JSON; a comment that looks like the annotation is not taken for it.
func TestSetFilesDigest(t *testing.T) {
	s := Server{Image: Image("v1.0.0"), Mode: "grpc", UDSName: "/run/k/k.sock",
		ClusterCert: "/p/konnectivity-server.crt", ClusterKey: "/p/konnectivity-server.key", Kubeconfig: "/k/konnectivity-server.conf",
		FilesDigest: strings.Repeat("a", 64)}
	f, err := s.Render()
	if err != nil {
		t.Fatal(err)
	}
	rendered := string(f.Data)
	newDigest := strings.Repeat("0123456789abcdef", 4)
	edited := strings.Replace(rendered, "    - --health-port=8134\n", "    # raised while debugging\n    - --health-port=8134\n    - -v=4\n", 1)
	if edited == rendered {
		t.Fatal("no --health-port line to edit")
	}
	noAnnotation := strings.Replace(rendered, "  annotations:\n    "+FilesDigestAnnotation+": "+strings.Repeat("a", 64)+"\n", "", 1)
	noAnnotation = "# the operator's notes\n" + noAnnotation
	if noAnnotation == "# the operator's notes\n"+rendered {
		t.Fatal("no annotation to take out")
	}
	lookalike := strings.Replace(rendered, "  labels:\n", "  # was "+FilesDigestAnnotation+": "+strings.Repeat("b", 64)+"\n  labels:\n", 1)
	quoted := strings.Replace(rendered, strings.Repeat("a", 64), `"`+strings.Repeat("a", 64)+`"`, 1)
	jsonPod, err := sigsyaml.YAMLToJSON([]byte(rendered))
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name, in string
		// onlyValue: the output is in with the old value replaced, byte for byte.
		onlyValue bool
		keep      []string
	}{
		{name: "rendered", in: rendered, onlyValue: true},
		{name: "edited", in: edited, onlyValue: true, keep: []string{"# raised while debugging", "- -v=4"}},
		{name: "quoted", in: quoted, onlyValue: true},
		{name: "crlf", in: strings.ReplaceAll(rendered, "\n", "\r\n"), onlyValue: true},
		{name: "without the annotation", in: noAnnotation, keep: []string{"# the operator's notes\n"}},
		{name: "lookalike comment", in: lookalike, keep: []string{"# was " + FilesDigestAnnotation + ": " + strings.Repeat("b", 64)}},
		{name: "json", in: string(jsonPod), keep: []string{`{`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, changed, err := SetFilesDigest([]byte(c.in), "pod.yaml", newDigest)
			if err != nil || !changed {
				t.Fatalf("changed %v, %v", changed, err)
			}
			var before, after corev1.Pod
			if err := sigsyaml.Unmarshal([]byte(c.in), &before); err != nil {
				t.Fatal(err)
			}
			if err := sigsyaml.Unmarshal(out, &after); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if got := after.Annotations[FilesDigestAnnotation]; got != newDigest {
				t.Errorf("annotation %q\n%s", got, out)
			}
			after.Annotations[FilesDigestAnnotation] = before.Annotations[FilesDigestAnnotation]
			if before.Annotations == nil && len(after.Annotations) == 1 && after.Annotations[FilesDigestAnnotation] == "" {
				after.Annotations = nil
			}
			if before.String() != after.String() {
				t.Errorf("more than the annotation changed:\nbefore %s\nafter  %s", before.String(), after.String())
			}
			if c.onlyValue {
				old := before.Annotations[FilesDigestAnnotation]
				if want := strings.Replace(c.in, old, newDigest, 1); string(out) != want {
					t.Errorf("not only the value changed:\n%s", out)
				}
			}
			for _, k := range c.keep {
				if !strings.Contains(string(out), k) {
					t.Errorf("lost %q:\n%s", k, out)
				}
			}
			again, changed, err := SetFilesDigest(out, "pod.yaml", newDigest)
			if err != nil || changed || string(again) != string(out) {
				t.Errorf("the same digest again: changed %v, %v", changed, err)
			}
		})
	}
	if _, _, err := SetFilesDigest([]byte("kind: Pod\nmetadata: [\n"), "pod.yaml", newDigest); err == nil || !strings.Contains(err.Error(), "pod.yaml") {
		t.Errorf("broken manifest: %v", err)
	}
}
