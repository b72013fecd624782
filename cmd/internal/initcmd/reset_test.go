package initcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
)

// upstreamAPIServer is kube-apiserver.yaml set up for Konnectivity by hand, as the Kubernetes documentation
// ("Set up Konnectivity service") shows: its own egress selector flag, and volumes with the names konnect uses.
const upstreamAPIServer = `apiVersion: v1
kind: Pod
metadata:
  labels:
    component: kube-apiserver
    tier: control-plane
  name: kube-apiserver
  namespace: kube-system
spec:
  containers:
  - command:
    - kube-apiserver
    - --advertise-address=198.18.4.11
    - --client-ca-file=/etc/kubernetes/pki/ca.crt
    - --egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml
    image: registry.k8s.io/kube-apiserver:v1.36.1
    name: kube-apiserver
    volumeMounts:
    - mountPath: /etc/kubernetes/pki
      name: k8s-certs
      readOnly: true
    - mountPath: /etc/kubernetes/egress-selector-configuration.yaml
      name: egress-selector-config
      readOnly: true
    - mountPath: /etc/kubernetes/konnectivity-server
      name: konnectivity-uds
  hostNetwork: true
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki
      type: DirectoryOrCreate
    name: k8s-certs
  - hostPath:
      path: /etc/kubernetes/egress-selector-configuration.yaml
      type: FileOrCreate
    name: egress-selector-config
  - hostPath:
      path: /etc/kubernetes/konnectivity-server
      type: DirectoryOrCreate
    name: konnectivity-uds
`

// upstreamServer is the Konnectivity server's static pod from the same documentation: upstream proxy-server,
// which konnect did not write.
const upstreamServer = `apiVersion: v1
kind: Pod
metadata:
  name: konnectivity-server
  namespace: kube-system
spec:
  priorityClassName: system-cluster-critical
  hostNetwork: true
  containers:
  - name: konnectivity-server-container
    image: registry.k8s.io/kas-network-proxy/proxy-server:v0.36.0
    command: ["/proxy-server"]
    args:
    - --uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket
    - --delete-existing-uds-file
    - --cluster-cert=/etc/kubernetes/pki/apiserver.crt
    - --cluster-key=/etc/kubernetes/pki/apiserver.key
    - --mode=grpc
    - --server-port=0
    - --agent-port=8132
    - --kubeconfig=/etc/kubernetes/konnectivity-server.conf
    - --authentication-audience=system:konnectivity-server
`

// resetResult runs `konnect reset ARGS` in-process and returns its output and error.
func resetResult(args ...string) (string, error) {
	root := &cobra.Command{Use: "konnect", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(NewResetCommand())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"reset"}, args...))
	err := root.Execute()
	return out.String(), err
}

// shortTempDir is a temporary directory with a name short enough for the unix socket init puts under it.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A Konnectivity set-up that konnect never made survives konnect reset: the user's egress selector flag and its
// volumes stay in kube-apiserver.yaml, and the upstream server's static pod stays in DIR/manifests, with a line
// that says why.
func TestResetKeepsAKonnectivitySetUpNotKonnects(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "r")
	server := filepath.Join(dir, ManifestsSubdir, "konnectivity-server.yaml")
	writeFile(t, server, upstreamServer)
	manifest := filepath.Join(t.TempDir(), "m2", "kube-apiserver.yaml")
	writeFile(t, manifest, upstreamAPIServer)

	for _, dry := range []bool{true, false} {
		args := []string{"--dir", dir, "--apiserver-manifest", manifest}
		verb := "[kept] "
		if dry {
			args, verb = append(args, "--dry-run"), "[would be kept] "
		}
		out, err := resetResult(args...)
		if err != nil {
			t.Fatalf("konnect reset %v: %v\n%s", args, err, out)
		}
		if !strings.Contains(out, verb+manifest+"\n") {
			t.Errorf("konnect reset %v: no %q in:\n%s", args, verb+manifest, out)
		}
		if want := verb + server + " (not written by konnect"; !strings.Contains(out, want) {
			t.Errorf("konnect reset %v: no %q in:\n%s", args, want, out)
		}
		if strings.Contains(out, "removed") {
			t.Errorf("konnect reset %v removed something:\n%s", args, out)
		}
		if got := readFile(t, manifest); got != upstreamAPIServer {
			t.Errorf("konnect reset %v changed kube-apiserver.yaml:\n%s", args, got)
		}
		if got := readFile(t, server); got != upstreamServer {
			t.Errorf("konnect reset %v changed the server's static pod:\n%s", args, got)
		}
	}
	if backups, _ := filepath.Glob(filepath.Join(filepath.Dir(manifest), ".*")); len(backups) > 0 {
		t.Errorf("backups of an unchanged manifest: %v", backups)
	}
}

// konnect init --dir D patches kube-apiserver.yaml to use D's front-proxy files; konnect reset --dir D without
// --kubeadm puts every flag it changed back, not only the ones it added: kube-apiserver.yaml holds again what it
// held before init.
func TestResetRestoresFlagsInitChangedWithoutKubeadm(t *testing.T) {
	dir := filepath.Join(shortTempDir(t), "d")
	m := t.TempDir()
	manifest := filepath.Join(m, "kube-apiserver.yaml")
	original := strings.ReplaceAll(kubeadmAPIServer, "/etc/kubernetes", m)
	writeFile(t, manifest, original)

	mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...)
	patched := readFile(t, manifest)
	for _, want := range []string{"--proxy-client-cert-file=" + filepath.Join(dir, "pki"), "--requestheader-uid-headers", "konnect-pki"} {
		if !strings.Contains(patched, want) {
			t.Fatalf("init did not patch %s as this test expects: no %q in:\n%s", manifest, want, patched)
		}
	}

	out := runReset(t, "--dir", dir, "--apiserver-manifest", manifest)
	if !strings.Contains(out, "[updated] "+manifest) || !strings.Contains(out, "[removed] "+filepath.Join(dir, ManifestsSubdir, "konnectivity-server.yaml")) {
		t.Errorf("konnect reset:\n%s", out)
	}
	got := readFile(t, manifest)
	a, err := kubeapiserver.DecodePod([]byte(got), "after reset")
	if err != nil {
		t.Fatal(err)
	}
	b, err := kubeapiserver.DecodePod([]byte(original), "original")
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(a, b) {
		t.Errorf("kube-apiserver.yaml after reset:\n%s\nwant it as before init:\n%s", got, original)
	}
	if strings.Contains(got, dir) {
		t.Errorf("kube-apiserver.yaml still names %s:\n%s", dir, got)
	}
}

// A manifest that a konnect without PodRecordAnnotation patched carries no earlier values of the flags. reset
// then refuses to take away the volume those flags still read from, naming the flag, the file and the manifest,
// and changes nothing, rather than leave a kube-apiserver that cannot start.
func TestResetRefusesHalfStateWithoutRecord(t *testing.T) {
	dir := filepath.Join(shortTempDir(t), "d")
	m := t.TempDir()
	manifest := filepath.Join(m, "kube-apiserver.yaml")
	writeFile(t, manifest, strings.ReplaceAll(kubeadmAPIServer, "/etc/kubernetes", m))
	mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...)

	pod, err := kubeapiserver.DecodePod([]byte(readFile(t, manifest)), manifest)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Annotations[kubeapiserver.PodRecordAnnotation] == "" {
		t.Fatalf("init wrote no %s", kubeapiserver.PodRecordAnnotation)
	}
	delete(pod.Annotations, kubeapiserver.PodRecordAnnotation)
	old, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, manifest, string(old))

	for _, args := range [][]string{{"--dry-run"}, nil} {
		out, err := resetResult(append(args, "--dir", dir, "--apiserver-manifest", manifest)...)
		if err == nil {
			t.Fatalf("konnect reset %v on a manifest without record succeeded:\n%s", args, out)
		}
		msg := err.Error()
		for _, want := range []string{manifest, "--proxy-client-cert-file", filepath.Join(dir, "pki", "front-proxy-client.crt"), `"konnect-pki"`} {
			if !strings.Contains(msg, want) {
				t.Errorf("konnect reset %v: error %q does not name %s", args, msg, want)
			}
		}
		if got := readFile(t, manifest); got != string(old) {
			t.Errorf("konnect reset %v changed the manifest although it refused:\n%s", args, got)
		}
	}
}
