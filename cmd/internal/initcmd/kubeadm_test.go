package initcmd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"sigs.k8s.io/yaml"
)

// kubeadmAPIServer is kube-apiserver.yaml as kubeadm 1.36 writes it (the flags that matter here).
const kubeadmAPIServer = `apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint: 198.18.4.11:6443
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
    - --proxy-client-cert-file=/etc/kubernetes/pki/front-proxy-client.crt
    - --proxy-client-key-file=/etc/kubernetes/pki/front-proxy-client.key
    - --requestheader-allowed-names=front-proxy-client
    - --requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt
    - --requestheader-extra-headers-prefix=X-Remote-Extra-
    - --requestheader-group-headers=X-Remote-Group
    - --requestheader-username-headers=X-Remote-User
    image: registry.k8s.io/kube-apiserver:v1.36.1
    name: kube-apiserver
    volumeMounts:
    - mountPath: /etc/kubernetes/pki
      name: k8s-certs
      readOnly: true
  hostNetwork: true
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki
      type: DirectoryOrCreate
    name: k8s-certs
`

const kubeadmClusterConfiguration = `apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.36.1
controlPlaneEndpoint: 198.18.4.1:6443
apiServer: {}
`

func withFakeKubeadm(t *testing.T) *fake.Clientset {
	t.Helper()
	client := fake.NewClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: kubeapiserver.KubeadmConfigName, Namespace: kubeapiserver.KubeadmConfigNamespace},
		Data:       map[string]string{kubeapiserver.KubeadmConfigKey: kubeadmClusterConfiguration},
	})
	old := newKubeadmClient
	newKubeadmClient = func(string) (kubernetes.Interface, error) { return client, nil }
	t.Cleanup(func() { newKubeadmClient = old })
	return client
}

func kubeadmConfigMap(t *testing.T, client kubernetes.Interface) *corev1.ConfigMap {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(kubeapiserver.KubeadmConfigNamespace).Get(context.Background(), kubeapiserver.KubeadmConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

func runReset(t *testing.T, args ...string) string {
	t.Helper()
	root := &cobra.Command{Use: "konnect", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(NewResetCommand())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"reset"}, args...))
	if err := root.Execute(); err != nil {
		t.Fatalf("konnect reset %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// konnect init --kubeadm records its change in the kubeadm-config ClusterConfiguration, a second run changes
// nothing, and konnect reset --kubeadm puts the manifest and the ClusterConfiguration back and removes the
// server's static pod.
func TestInitKubeadmAndReset(t *testing.T) {
	client := withFakeKubeadm(t)
	dir, manifest, kubeadmPod := kubeadmNode(t, "")
	args := initArgs(dir, "--kubeadm", "--apiserver-manifest", manifest, "--enable-aggregator-routing")
	out := mustRun(t, args...)
	if !strings.Contains(out, "[updated] ConfigMap kube-system/kubeadm-config") || !strings.Contains(out, "[updated] "+manifest) {
		t.Fatalf("konnect init --kubeadm:\n%s", out)
	}
	cm := kubeadmConfigMap(t, client)
	cc := cm.Data[kubeapiserver.KubeadmConfigKey]
	for _, want := range []string{"egress-selector-config-file", "requestheader-uid-headers", "enable-aggregator-routing", "konnectivity-uds", "egress-selector-config"} {
		if !strings.Contains(cc, want) {
			t.Errorf("ClusterConfiguration lacks %s:\n%s", want, cc)
		}
	}
	// kubeadm's own requestheader and proxy-client flags are konnect's already: nothing to record.
	for _, not := range []string{"requestheader-allowed-names", "proxy-client-cert-file", "konnect-pki"} {
		if strings.Contains(cc, not) {
			t.Errorf("ClusterConfiguration records %s, which kubeadm sets itself:\n%s", not, cc)
		}
	}
	if cm.Annotations[kubeapiserver.KubeadmRecordAnnotation] == "" {
		t.Fatalf("no record annotation")
	}
	if out := mustRun(t, args...); !strings.Contains(out, "[kept] ConfigMap kube-system/kubeadm-config") || !strings.Contains(out, "[kept] "+manifest) {
		t.Fatalf("second run:\n%s", out)
	}

	// kubeadm writes the manifest anew from the ClusterConfiguration (upgrade, or a join of this node): konnect's
	// flags and volumes are there, its annotations are not. init leaves it alone, sparing kube-apiserver a
	// restart, unless the egress selector configuration changes.
	kubeadmRewrites(t, manifest)
	if out := mustRun(t, args...); !strings.Contains(out, "[kept] "+manifest) {
		t.Fatalf("init on the manifest kubeadm wrote anew:\n%s", out)
	}
	if out := mustRun(t, append(args, "--mode", "http-connect")...); !strings.Contains(out, "[updated] "+manifest) {
		t.Fatalf("init with a new egress selector configuration:\n%s", out)
	}
	if data, _ := os.ReadFile(manifest); !strings.Contains(string(data), kubeapiserver.EgressConfigAnnotation) {
		t.Fatalf("the new configuration did not annotate kube-apiserver, which would not restart:\n%s", data)
	}

	out = runReset(t, "--kubeadm", "--dir", dir, "--apiserver-manifest", manifest)
	for _, want := range []string{"[updated] ConfigMap kube-system/kubeadm-config", "[updated] " + manifest, "[removed] " + filepath.Join(dir, "manifests", "konnectivity-server.yaml")} {
		if !strings.Contains(out, want) {
			t.Errorf("konnect reset --kubeadm: no %q in:\n%s", want, out)
		}
	}
	cm = kubeadmConfigMap(t, client)
	if got := cm.Data[kubeapiserver.KubeadmConfigKey]; strings.Contains(got, "extraArgs") || strings.Contains(got, "extraVolumes") {
		t.Errorf("ClusterConfiguration after reset:\n%s", got)
	}
	got, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := kubeapiserver.DecodePod(got, "after")
	b, _ := kubeapiserver.DecodePod([]byte(kubeadmPod), "kubeadm")
	if !equality.Semantic.DeepEqual(a, b) {
		t.Errorf("kube-apiserver.yaml after reset:\n%s\nwant kubeadm's:\n%s", got, kubeadmPod)
	}
	// On the next node the ClusterConfiguration is already back; the record still puts its manifest back.
	if out := runReset(t, "--kubeadm", "--dir", dir, "--apiserver-manifest", manifest); !strings.Contains(out, "[kept] ConfigMap") || !strings.Contains(out, "[kept] "+manifest) {
		t.Errorf("second reset:\n%s", out)
	}
}

// After kubeadm wrote kube-apiserver.yaml anew from a ClusterConfiguration with konnect's
// --enable-aggregator-routing (an upgrade, or a control-plane join), konnect init --kubeadm without the option
// puts back what kubeadm had without konnect, in the manifest and in the ClusterConfiguration: the user's
// =false, or no flag at all.
func TestKubeadmRoutingOff(t *testing.T) {
	for _, tc := range []struct{ name, given string }{{"false", "    - --enable-aggregator-routing=false\n"}, {"absent", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			client := withFakeKubeadm(t)
			dir, manifest, kubeadmPod := kubeadmNode(t, tc.given)
			args := initArgs(dir, "--kubeadm", "--apiserver-manifest", manifest)
			mustRun(t, append(args, "--enable-aggregator-routing")...)

			if rewritten := kubeadmRewrites(t, manifest); !strings.Contains(string(rewritten), "--enable-aggregator-routing=true") {
				t.Fatalf("init --enable-aggregator-routing:\n%s", rewritten)
			}

			out := mustRun(t, args...)
			data, err := os.ReadFile(manifest)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, "enable-aggregator-routing") {
					got += line + "\n"
				}
			}
			if got != tc.given {
				t.Errorf("kube-apiserver.yaml has %q, want %q:\n%s", got, tc.given, out)
			}
			cm := kubeadmConfigMap(t, client)
			if cc := cm.Data[kubeapiserver.KubeadmConfigKey]; strings.Contains(cc, "enable-aggregator-routing") {
				t.Errorf("ClusterConfiguration:\n%s", cc)
			}
			rec, err := kubeapiserver.ParseKubeadmRecord(cm.Annotations[kubeapiserver.KubeadmRecordAnnotation])
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range rec.ExtraArgs {
				if a.Name == "enable-aggregator-routing" {
					t.Errorf("record %s", rec)
				}
			}

			// konnect reset --kubeadm gives back kubeadm's manifest.
			runReset(t, "--kubeadm", "--dir", dir, "--apiserver-manifest", manifest)
			data, err = os.ReadFile(manifest)
			if err != nil {
				t.Fatal(err)
			}
			a, _ := kubeapiserver.DecodePod(data, "after")
			b, _ := kubeapiserver.DecodePod([]byte(kubeadmPod), "kubeadm")
			if !equality.Semantic.DeepEqual(a, b) {
				t.Errorf("kube-apiserver.yaml after reset:\n%s\nwant kubeadm's:\n%s", data, kubeadmPod)
			}
		})
	}
}

// After konnect init --kubeadm released --enable-aggregator-routing, the user turns it on in the
// ClusterConfiguration themselves, and kubeadm writes kube-apiserver.yaml from it: konnect init --kubeadm without
// the option, and konnect reset --kubeadm, leave the user's value, though it is the one konnect had recorded.
func TestKubeadmRoutingTakenByTheUser(t *testing.T) {
	client := withFakeKubeadm(t)
	dir, manifest, _ := kubeadmNode(t, "")
	args := initArgs(dir, "--kubeadm", "--apiserver-manifest", manifest)
	mustRun(t, append(args, "--enable-aggregator-routing")...)
	// The manifest as kubeadm writes it from a ClusterConfiguration with konnect's extraArgs and the flag on.
	rewritten := kubeadmRewrites(t, manifest)
	if !strings.Contains(string(rewritten), "--enable-aggregator-routing=true") {
		t.Fatalf("init --enable-aggregator-routing:\n%s", rewritten)
	}

	mustRun(t, args...) // released
	cm := kubeadmConfigMap(t, client)
	cc, released := cm.Data[kubeapiserver.KubeadmConfigKey], cm.Annotations[kubeapiserver.KubeadmRecordAnnotation]
	users := strings.Replace(cc, "  extraArgs:\n", "  extraArgs:\n  - name: enable-aggregator-routing\n    value: \"true\"\n", 1)
	if users == cc || !strings.Contains(released, `"released"`) {
		t.Fatalf("record %s:\n%s", released, cc)
	}
	cm.Data[kubeapiserver.KubeadmConfigKey] = users
	if _, err := client.CoreV1().ConfigMaps(cm.Namespace).Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, rewritten, 0o600); err != nil {
		t.Fatal(err)
	}
	routing := func(step string) {
		t.Helper()
		data, err := os.ReadFile(manifest)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "--enable-aggregator-routing=true") {
			t.Errorf("%s took the user's --enable-aggregator-routing=true out:\n%s", step, data)
		}
		if cc := kubeadmConfigMap(t, client).Data[kubeapiserver.KubeadmConfigKey]; !strings.Contains(cc, "enable-aggregator-routing") {
			t.Errorf("%s took the user's enable-aggregator-routing out of the ClusterConfiguration:\n%s", step, cc)
		}
	}
	mustRun(t, args...)
	routing("init --kubeadm")
	if rec := kubeadmConfigMap(t, client).Annotations[kubeapiserver.KubeadmRecordAnnotation]; strings.Contains(rec, "enable-aggregator-routing") {
		t.Errorf("record %s still holds the user's flag", rec)
	}

	// reset on a node whose manifest kubeadm wrote from the user's ClusterConfiguration, the record as the
	// released run left it (before this node's init forgot the flag).
	cm = kubeadmConfigMap(t, client)
	cm.Annotations[kubeapiserver.KubeadmRecordAnnotation] = released
	if _, err := client.CoreV1().ConfigMaps(cm.Namespace).Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, rewritten, 0o600); err != nil {
		t.Fatal(err)
	}
	runReset(t, "--kubeadm", "--dir", dir, "--apiserver-manifest", manifest)
	routing("reset --kubeadm")
}

// konnect init phase flags --kubeadm repairs kube-apiserver.yaml also while kube-apiserver, and so the kubeadm-config
// ConfigMap, cannot be reached: it says what it cannot do without the ConfigMap, and patches the manifest.
func TestFlagsPhaseKubeadmWithoutConfigMap(t *testing.T) {
	client := withFakeKubeadm(t)
	dir, manifest, kubeadmPod := kubeadmNode(t, "")
	mustRun(t, initArgs(dir, "--kubeadm", "--apiserver-manifest", manifest)...)
	// The manifest loses konnect's flags (put back from a backup), and kube-apiserver is down.
	if err := os.WriteFile(manifest, []byte(kubeadmPod), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"init", "phase", "flags"}, initArgs(dir, "--kubeadm", "--apiserver-manifest", manifest)[1:]...)
	// kube-apiserver answers, and refuses: the kubeconfig is the wrong one, which no retry mends.
	client.PrependReactor("get", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "kubeadm-config", errors.New("no"))
	})
	if out, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "--kubeadm-kubeconfig") {
		t.Fatalf("konnect %s with a forbidden kubeadm-config: %v, want an error naming --kubeadm-kubeconfig\n%s", strings.Join(args, " "), err, out)
	}
	if data, err := os.ReadFile(manifest); err != nil || string(data) != kubeadmPod {
		t.Fatalf("kube-apiserver.yaml changed although kubeadm-config was refused (%v):\n%s", err, data)
	}
	client.ReactionChain = client.ReactionChain[1:]
	client.PrependReactor("get", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("konnect %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if !strings.Contains(out, kubeadmConfigMapName) || !strings.Contains(out, "connection refused") || !strings.Contains(out, "--enable-aggregator-routing") {
		t.Errorf("no warning naming the ConfigMap, its error and what is skipped:\n%s", out)
	}
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "--egress-selector-config-file=") {
		t.Errorf("kube-apiserver.yaml not patched:\n%s\n%s", data, out)
	}
}

// kubeadmRewrites writes manifest as kubeadm writes it anew from a ClusterConfiguration with konnect's
// extraArgs (an upgrade, or a control-plane join): konnect's flags and volumes, none of its annotations. It
// returns what it wrote.
func kubeadmRewrites(t *testing.T, manifest string) []byte {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := kubeapiserver.DecodePod(data, manifest)
	if err != nil {
		t.Fatal(err)
	}
	delete(pod.Annotations, kubeapiserver.EgressConfigAnnotation)
	delete(pod.Annotations, kubeapiserver.AddedFlagsAnnotation)
	delete(pod.Annotations, kubeapiserver.PodRecordAnnotation)
	rewritten, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, rewritten, 0o600); err != nil {
		t.Fatal(err)
	}
	return rewritten
}

// kubeadmNode lays out a control-plane node as kubeadm does, under a temporary dir instead of /etc/kubernetes:
// kube-apiserver.yaml in dir/manifests, with flag lines extra (each "    - --FLAG\n") after its command's. It
// returns dir, the manifest's path and what it holds.
func kubeadmNode(t *testing.T, extra string) (dir, manifest, pod string) {
	t.Helper()
	dir = t.TempDir()
	manifest = filepath.Join(dir, "manifests", "kube-apiserver.yaml")
	if err := os.MkdirAll(filepath.Dir(manifest), 0o755); err != nil {
		t.Fatal(err)
	}
	pod = strings.ReplaceAll(kubeadmAPIServer, "/etc/kubernetes", dir)
	pod = strings.Replace(pod, "    image:", extra+"    image:", 1)
	if err := os.WriteFile(manifest, []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, manifest, pod
}
