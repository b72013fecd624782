package initcmd

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// Values that YAML reads as something else, or cuts short, when they are written into a document as they
// are: a mapping (": "), a comment (" #"), a sequence entry (leading "-"), flow collections, quotes,
// booleans of YAML 1.1 (yes, no, on, off, y, n), null, numbers (0755 is octal to YAML 1.1, 1e3 a float),
// anchors, aliases, tags, block scalars, directives, unicode and trailing spaces. Each flag gets those it
// accepts: a path any of them, an image those without white space, a name those that are DNS labels.
const (
	// hostileDir is a path under a temporary directory, one component per kind of trouble.
	hostileDir = "a: b/ #c/-d/{e} [f]/'g\" \"h'/yes no on off y n/null ~/0755 1e3 0x1F .inf/&i *j !k |l >m %n @o `p/ünï ☃ "
	// hostileImage is an image reference: no white space, so no ": " or " #".
	hostileImage = "-reg:5000/{x}/'y\"#z:yes"
)

// decodeStrict decodes one Kubernetes object with client-go's scheme, refusing unknown and duplicate fields.
func decodeStrict(t *testing.T, path string) runtime.Object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("%s does not decode: %v\n%s", path, err, data)
	}
	return obj
}

func decodeAs[T runtime.Object](t *testing.T, path string) T {
	t.Helper()
	obj := decodeStrict(t, path)
	typed, ok := obj.(T)
	if !ok {
		t.Fatalf("%s holds a %T", path, obj)
	}
	return typed
}

// hasAll fails t for each of want that got lacks.
func hasAll(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s lack %q:\n%q", what, w, got)
		}
	}
}

func hostPaths(vols []corev1.Volume) []string {
	var out []string
	for _, v := range vols {
		if v.HostPath != nil {
			out = append(out, v.HostPath.Path)
		}
	}
	return out
}

func mountPaths(mounts []corev1.VolumeMount) []string {
	var out []string
	for _, m := range mounts {
		out = append(out, m.MountPath)
	}
	return out
}

// kubeconfigServerOf is the server of the current context of the kubeconfig data, as client-go loads it.
func kubeconfigServerOf(t *testing.T, data []byte) string {
	t.Helper()
	kc, err := clientcmd.Load(data)
	if err != nil {
		t.Fatalf("kubeconfig does not load: %v\n%s", err, data)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.Clusters[ctx.Cluster] == nil {
		t.Fatalf("kubeconfig has no cluster for its current context:\n%s", data)
	}
	return kc.Clusters[ctx.Cluster].Server
}

// TestHostileInputSurvivesYAML: values that mean something to YAML, given to every flag of init and certs
// that reaches a manifest, come back exactly as given when each file konnect wrote is parsed into the
// Kubernetes types (the static pods, the DaemonSet, the ConfigMaps and Secrets, the RBAC, the APIServices,
// the EgressSelectorConfiguration, kubeadm's ClusterConfiguration and the kubeconfigs), by the decoders
// kubelet, kubectl and kube-apiserver use.
func TestHostileInputSurvivesYAML(t *testing.T) {
	// The socket's path is bounded (107 bytes), so it lives under a short directory of its own.
	short, err := os.MkdirTemp("", "ky")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(short) })
	uds := filepath.Join(short, "on: #x -y", "{z} 'q\" 0755 ü", "s: 1e3 ")
	// Agents watch Leases at the URL: any host but a loopback one. The path may hold what YAML minds.
	const apiserverURL = "https://yes:6443/a: b/'c\" {d}/-e/0755 1e3 ünï "

	t.Run("init, unix socket, server Leases, kubeadm", func(t *testing.T) {
		client := withFakeKubeadm(t)
		dir := filepath.Join(t.TempDir(), hostileDir)
		manifest := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
		if err := os.WriteFile(manifest, []byte(kubeadmAPIServer), 0o600); err != nil {
			t.Fatal(err)
		}
		mustRun(t, "init", "--dir", dir, "--control-plane-address", "yes", "--apiserver-url", apiserverURL,
			"--image", hostileImage, "--uds-name", uds, "--server-leases", "--kubeadm", "--apiserver-manifest", manifest,
			"--key-algorithm", "ecdsa-p256")
		pki := func(f string) string { return filepath.Join(dir, "pki", f) }
		kubeconfig := filepath.Join(dir, "konnectivity-server.conf")
		egress := filepath.Join(dir, EgressConfigFile)

		pod := decodeAs[*corev1.Pod](t, filepath.Join(dir, ManifestsSubdir, manifests.ServerPodFile))
		c := pod.Spec.Containers[0]
		if c.Image != hostileImage {
			t.Errorf("server image %q, want %q", c.Image, hostileImage)
		}
		hasAll(t, "the server's args", c.Args, "--uds-name="+uds, "--cluster-cert="+pki("konnectivity-server.crt"),
			"--cluster-key="+pki("konnectivity-server.key"), "--kubeconfig="+kubeconfig)
		hasAll(t, "the server's host paths", hostPaths(pod.Spec.Volumes), filepath.Dir(uds), pki("konnectivity-server.crt"), kubeconfig)
		hasAll(t, "the server's mounts", mountPaths(c.VolumeMounts), filepath.Dir(uds), pki("konnectivity-server.key"), kubeconfig)

		agentDir := filepath.Join(dir, manifests.AgentBundleDir)
		ds := decodeAs[*appsv1.DaemonSet](t, filepath.Join(agentDir, "konnectivity-agent.yaml"))
		if ac := ds.Spec.Template.Spec.Containers[0]; ac.Image != hostileImage {
			t.Errorf("agent image %q, want %q", ac.Image, hostileImage)
		} else {
			hasAll(t, "the agent's args", ac.Args, "--proxy-server-host=yes")
		}
		cm := decodeAs[*corev1.ConfigMap](t, filepath.Join(agentDir, manifests.AgentKubeconfigConfigMap+".yaml"))
		if got := kubeconfigServerOf(t, []byte(cm.Data["kubeconfig"])); got != apiserverURL {
			t.Errorf("the agents' kubeconfig has server %q, want %q", got, apiserverURL)
		}

		data, err := os.ReadFile(kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		if got := kubeconfigServerOf(t, data); got != apiserverURL {
			t.Errorf("the server's kubeconfig has server %q, want %q", got, apiserverURL)
		}

		// kube-apiserver's own loader.
		sel, err := egressselector.ReadEgressSelectorConfiguration(egress)
		if err != nil {
			t.Fatal(err)
		}
		if tr := sel.EgressSelections[0].Connection.Transport; tr.UDS == nil || tr.UDS.UDSName != uds {
			t.Errorf("egress selector transport %+v, want the unix socket %q", tr, uds)
		}

		apiserver := decodeAs[*corev1.Pod](t, manifest)
		hasAll(t, "kube-apiserver's command", apiserver.Spec.Containers[0].Command, "--egress-selector-config-file="+egress,
			"--requestheader-client-ca-file="+pki("front-proxy-ca.crt"), "--proxy-client-key-file="+pki("front-proxy-client.key"))
		hasAll(t, "kube-apiserver's host paths", hostPaths(apiserver.Spec.Volumes), filepath.Dir(uds), egress)

		var cc struct {
			APIServer struct {
				ExtraArgs    []struct{ Name, Value string } `json:"extraArgs"`
				ExtraVolumes []struct {
					Name, HostPath, MountPath, PathType string
					ReadOnly                            bool
				} `json:"extraVolumes"`
			} `json:"apiServer"`
		}
		if err := yaml.Unmarshal([]byte(kubeadmConfigMap(t, client).Data[kubeapiserver.KubeadmConfigKey]), &cc); err != nil {
			t.Fatal(err)
		}
		var args, vols []string
		for _, a := range cc.APIServer.ExtraArgs {
			args = append(args, a.Name+"="+a.Value)
		}
		for _, v := range cc.APIServer.ExtraVolumes {
			vols = append(vols, v.HostPath, v.MountPath)
		}
		hasAll(t, "the ClusterConfiguration's extraArgs", args, "egress-selector-config-file="+egress, "proxy-client-cert-file="+pki("front-proxy-client.crt"))
		hasAll(t, "the ClusterConfiguration's extraVolumes", vols, filepath.Dir(uds), egress)

		flags, err := os.ReadFile(filepath.Join(dir, FlagsFile))
		if err != nil {
			t.Fatal(err)
		}
		hasAll(t, "the lines of "+FlagsFile, strings.Split(string(flags), "\n"), "--egress-selector-config-file="+egress)
	})

	t.Run("init, TCP frontend, agent certificates", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), hostileDir)
		mustRun(t, "init", "--dir", dir, "--control-plane-address", "on", "--apiserver-url", apiserverURL,
			"--transport", "tcp", "--mode", "http-connect", "--agent-auth", "mtls", "--key-algorithm", "ecdsa-p256")
		pki := func(f string) string { return filepath.Join(dir, "pki", f) }
		pod := decodeAs[*corev1.Pod](t, filepath.Join(dir, ManifestsSubdir, manifests.ServerPodFile))
		hasAll(t, "the server's args", pod.Spec.Containers[0].Args, "--server-cert="+pki("konnectivity-frontend.crt"),
			"--server-ca-cert="+pki("ca.crt"), "--cluster-ca-cert="+pki("konnectivity-agent-ca.crt"))
		hasAll(t, "the server's host paths", hostPaths(pod.Spec.Volumes), pki("konnectivity-frontend.key"), pki("konnectivity-agent-ca.crt"))
		sel, err := egressselector.ReadEgressSelectorConfiguration(filepath.Join(dir, EgressConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		tcp := sel.EgressSelections[0].Connection.Transport.TCP
		if tcp == nil || tcp.TLSConfig == nil || tcp.TLSConfig.CABundle != pki("ca.crt") || tcp.TLSConfig.ClientCert != pki("apiserver-egress-client.crt") ||
			tcp.TLSConfig.ClientKey != pki("apiserver-egress-client.key") {
			t.Errorf("egress selector TCP transport %+v, want the files under %q", tcp.TLSConfig, dir)
		}
		ds := decodeAs[*appsv1.DaemonSet](t, filepath.Join(dir, manifests.AgentBundleDir, "konnectivity-agent.yaml"))
		hasAll(t, "the agent's args", ds.Spec.Template.Spec.Containers[0].Args, "--proxy-server-host=on")
		decodeAs[*corev1.Secret](t, filepath.Join(dir, manifests.AgentBundleDir, manifests.AgentTLSSecret+".yaml"))
	})

	// The manifests phase again, with each image and agents' address: a DNS name may be a YAML word or number.
	t.Run("images and addresses", func(t *testing.T) {
		// Short, for the socket's path under it.
		dir := filepath.Join(short, "phase")
		mustRun(t, initArgs(dir, "--key-algorithm", "ecdsa-p256")...)
		for _, c := range []struct{ image, address string }{
			{"yes", "no"}, {"0755", "off"}, {"1e3", "1e3"}, {"-", "null"}, {"{a}", "true"}, {"[b]", "y"},
			{"'c'", "0x1f"}, {`"d"`, "n"}, {"#e", "on"}, {"~", "yes.no"}, {"&f", "inf"}, {"*g", "nan"},
			{"!h", "b1"}, {"|i", "e1"}, {">j", "x"}, {"%k", "o"}, {"@l", "l"}, {"`m", "m"}, {"ünï☃", "z"},
			{"registry.example:5000/konnect:v1", "198.18.0.1"}, {"konnect@sha256:0123", "2001:db8::1"},
		} {
			mustRun(t, "init", "phase", "manifests", "--dir", dir, "--image", c.image, "--control-plane-address", c.address)
			pod := decodeAs[*corev1.Pod](t, filepath.Join(dir, ManifestsSubdir, manifests.ServerPodFile))
			if got := pod.Spec.Containers[0].Image; got != c.image {
				t.Errorf("server image %q, want %q", got, c.image)
			}
			ac := decodeAs[*appsv1.DaemonSet](t, filepath.Join(dir, manifests.AgentBundleDir, "konnectivity-agent.yaml")).Spec.Template.Spec.Containers[0]
			if ac.Image != c.image {
				t.Errorf("agent image %q, want %q", ac.Image, c.image)
			}
			hasAll(t, "the agent's args", ac.Args, "--proxy-server-host="+c.address)
		}
	})

	t.Run("certs apiservice", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), hostileDir)
		mustRun(t, "certs", "apiservice", "--service", "on", "--namespace", "yes", "--group", "null", "--version", "no",
			"--version", "off", "--service-account", "0755", "--out", out, "--key-algorithm", "ecdsa-p256")
		secret := decodeAs[*corev1.Secret](t, filepath.Join(out, manifests.ServingSecretFile))
		if secret.Name != "on-tls" || secret.Namespace != "yes" {
			t.Errorf("Secret %s/%s, want yes/on-tls", secret.Namespace, secret.Name)
		}
		data, err := os.ReadFile(filepath.Join(out, manifests.APIServiceFile))
		if err != nil {
			t.Fatal(err)
		}
		docs, err := manifests.SplitDocuments(data)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, d := range docs {
			var as struct {
				APIVersion, Kind string
				Metadata         struct {
					Name   string
					Labels map[string]string
				}
				Spec struct {
					Service struct {
						Namespace, Name string
						Port            int32
					}
					Group, Version       string
					CABundle             []byte
					GroupPriorityMinimum int32
					VersionPriority      int32
				}
			}
			if err := yaml.UnmarshalStrict(d.Body, &as); err != nil {
				t.Fatalf("APIService: %v\n%s", err, d.Body)
			}
			if as.Spec.Group != "null" || as.Spec.Service.Namespace != "yes" || as.Spec.Service.Name != "on" {
				t.Errorf("APIService %s: group %q, service %s/%s", as.Metadata.Name, as.Spec.Group, as.Spec.Service.Namespace, as.Spec.Service.Name)
			}
			names = append(names, as.Metadata.Name+" "+as.Spec.Version)
		}
		if want := []string{"no.null no", "off.null off"}; !slices.Equal(names, want) {
			t.Errorf("APIServices %q, want %q", names, want)
		}
		crb := decodeAs[*rbacv1.ClusterRoleBinding](t, filepath.Join(out, "auth-delegator.yaml"))
		rb := decodeAs[*rbacv1.RoleBinding](t, filepath.Join(out, "authentication-reader.yaml"))
		for _, s := range [][]rbacv1.Subject{crb.Subjects, rb.Subjects} {
			if len(s) != 1 || s[0].Name != "0755" || s[0].Namespace != "yes" {
				t.Errorf("subjects %+v, want the ServiceAccount yes/0755", s)
			}
		}
		if crb.Name != "yes:0755:system:auth-delegator" {
			t.Errorf("ClusterRoleBinding %q", crb.Name)
		}
	})

	t.Run("certs webhook", func(t *testing.T) {
		hooks := filepath.Join(t.TempDir(), "hooks.yaml")
		in := strings.NewReplacer("name: hook,", "name: 'no',", "namespace: pizza,", "namespace: 'on',").Replace(testWebhooks)
		if err := os.WriteFile(hooks, []byte(in), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), hostileDir)
		mustRun(t, "certs", "webhook", "--service", "no", "--namespace", "on", "--out", out, "--key-algorithm", "ecdsa-p256", hooks)
		secret := decodeAs[*corev1.Secret](t, filepath.Join(out, manifests.ServingSecretFile))
		if secret.Name != "no-tls" || secret.Namespace != "on" {
			t.Errorf("Secret %s/%s, want on/no-tls", secret.Namespace, secret.Name)
		}
		vwc := decodeAs[*admissionv1.ValidatingWebhookConfiguration](t, filepath.Join(out, "hooks.yaml"))
		if svc := vwc.Webhooks[0].ClientConfig.Service; svc == nil || svc.Name != "no" || svc.Namespace != "on" || len(vwc.Webhooks[0].ClientConfig.CABundle) == 0 {
			t.Errorf("webhook %+v, want the Service on/no with a caBundle", vwc.Webhooks[0].ClientConfig)
		}
	})
}

// TestUnwritableInputRefused: a value that no manifest, flag line or path can carry (a line break, other
// control characters, white space in an image) is refused with an error naming its flag, before anything is
// written.
func TestUnwritableInputRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		args func(dir string) []string
		flag string
	}{
		{"line break in --image", func(dir string) []string { return initArgs(dir, "--image", "konnect:v1\nimage: evil") }, "--image"},
		{"trailing space in --image", func(dir string) []string { return initArgs(dir, "--image", "konnect:v1 ") }, "--image"},
		{"line break in --dir", func(dir string) []string { return initArgs(filepath.Join(dir, "a\nb")) }, "--dir"},
		{"carriage return in --dir", func(dir string) []string { return initArgs(filepath.Join(dir, "a\rb")) }, "--dir"},
		{"tab in --dir", func(dir string) []string { return initArgs(filepath.Join(dir, "a\tb")) }, "--dir"},
		{"line break in --uds-name", func(dir string) []string { return initArgs(dir, "--uds-name", filepath.Join(dir, "s\nock", "s")) }, "--uds-name"},
		{"line break in --control-plane-address", func(dir string) []string {
			return []string{"init", "--dir", dir, "--control-plane-address", "yes\nno", "--apiserver-url", "https://198.18.0.1:6443"}
		}, "--control-plane-address"},
		{"line break in --apiserver-url", func(dir string) []string {
			return []string{"init", "--dir", dir, "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443/\n"}
		}, "--apiserver-url"},
		{"line break in certs apiservice --out", func(dir string) []string {
			return []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "example.com", "--version", "v1", "--out", filepath.Join(dir, "o\nut")}
		}, "--out"},
		{"line break in certs webhook --out", func(dir string) []string {
			return []string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", filepath.Join(dir, "o\nut")}
		}, "--out"},
		{"line break in --service", func(dir string) []string {
			return []string{"certs", "webhook", "--service", "hook\nx", "--namespace", "pizza", "--out", filepath.Join(dir, "out")}
		}, "--service"},
		{"line break in --namespace", func(dir string) []string {
			return []string{"certs", "webhook", "--service", "hook", "--namespace", "pizza\n", "--out", filepath.Join(dir, "out")}
		}, "--namespace"},
		{"line break in --group", func(dir string) []string {
			return []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "example.com\n", "--version", "v1", "--out", filepath.Join(dir, "out")}
		}, "--group"},
		{"line break in --version", func(dir string) []string {
			return []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "example.com", "--version", "v1\nv2", "--out", filepath.Join(dir, "out")}
		}, "--version"},
		{"line break in --service-account", func(dir string) []string {
			return []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "example.com", "--version", "v1", "--service-account", "a\nb", "--out", filepath.Join(dir, "out")}
		}, "--service-account"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Short, so that the socket's default path under it is not what is refused.
			dir, err := os.MkdirTemp("", "ku")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			out, err := run(t, c.args(dir)...)
			if err == nil || !strings.Contains(err.Error(), c.flag) {
				t.Fatalf("err = %v, want one naming %s\n%s", err, c.flag, out)
			}
			if entries, _ := os.ReadDir(dir); len(entries) > 0 {
				t.Errorf("the refused run wrote %v", entries)
			}
		})
	}
}
