package kubeapiserver

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/safepath"
	corev1 "k8s.io/api/core/v1"
)

// kubeadmPatch is what konnect init applies to a kubeadm control plane with the default layout.
func kubeadmPatch(t *testing.T, edit func(*APIServerFlags)) ManifestPatch {
	t.Helper()
	in := testFlags()
	in.EnableAggregatorRouting = true
	if edit != nil {
		edit(&in)
	}
	flags, err := in.Flags()
	if err != nil {
		t.Fatal(err)
	}
	return ManifestPatch{Flags: flags, UDSDir: SelectorConfig{}.UDSDir()}
}

func readTestdata(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/kube-apiserver.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func apiserverOf(t *testing.T, pod *corev1.Pod) *corev1.Container {
	t.Helper()
	c, err := apiserverContainer(pod)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func volumeByName(pod *corev1.Pod, name string) *corev1.Volume {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			return &pod.Spec.Volumes[i]
		}
	}
	return nil
}

func mountByName(c *corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func TestPatchKubeadmManifest(t *testing.T) {
	orig := readTestdata(t)
	before, err := DecodePod(orig, "testdata")
	if err != nil {
		t.Fatal(err)
	}
	out, res, err := PatchManifest(orig, "testdata/kube-apiserver.yaml", kubeadmPatch(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed {
		t.Fatal("PatchManifest reported no change on a fresh kubeadm manifest")
	}
	after, err := DecodePod(out, "patched")
	if err != nil {
		t.Fatalf("the patched manifest does not decode strictly: %v\n%s", err, out)
	}
	cmdBefore, cmdAfter := apiserverOf(t, before).Command, apiserverOf(t, after).Command

	// kubeadm already sets the request-header and proxy-client flags: they keep their place and value.
	if !slices.Equal(cmdAfter[:len(cmdBefore)], cmdBefore) {
		t.Errorf("existing arguments changed or moved:\nbefore %q\nafter  %q", cmdBefore, cmdAfter[:len(cmdBefore)])
	}
	wantAppended := []string{
		"--requestheader-uid-headers=X-Remote-Uid",
		"--egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml",
		"--enable-aggregator-routing=true",
	}
	if got := cmdAfter[len(cmdBefore):]; !slices.Equal(got, wantAppended) {
		t.Errorf("appended flags = %q, want %q", got, wantAppended)
	}
	for _, f := range kubeadmPatch(t, nil).Flags {
		if n := len(lookupFlag(apiserverOf(t, after), f.Name)); n != 1 {
			t.Errorf("--%s appears %d times, want once", f.Name, n)
		}
	}

	c := apiserverOf(t, after)
	uds := volumeByName(after, "konnectivity-uds")
	if uds == nil || uds.HostPath == nil || uds.HostPath.Path != "/etc/kubernetes/konnectivity-server" ||
		uds.HostPath.Type == nil || *uds.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("socket volume = %+v", uds)
	}
	if m := mountByName(c, "konnectivity-uds"); m == nil || m.MountPath != "/etc/kubernetes/konnectivity-server" || !m.ReadOnly {
		t.Errorf("socket mount = %+v, want read-only at the host path", m)
	}
	cfg := volumeByName(after, "egress-selector-config")
	if cfg == nil || cfg.HostPath == nil || cfg.HostPath.Path != "/etc/kubernetes/egress-selector-configuration.yaml" ||
		cfg.HostPath.Type == nil || *cfg.HostPath.Type != corev1.HostPathFile {
		t.Errorf("egress config volume = %+v", cfg)
	}
	if m := mountByName(c, "egress-selector-config"); m == nil || m.MountPath != "/etc/kubernetes/egress-selector-configuration.yaml" || !m.ReadOnly {
		t.Errorf("egress config mount = %+v, want read-only at the host path", m)
	}
	// /etc/kubernetes/pki is kubeadm's k8s-certs volume already.
	if v := volumeByName(after, "konnect-pki"); v != nil {
		t.Errorf("added %+v although k8s-certs covers /etc/kubernetes/pki", v)
	}
	if got, want := len(after.Spec.Volumes), len(before.Spec.Volumes)+2; got != want {
		t.Errorf("%d volumes, want %d", got, want)
	}
	// konnect's record of what it changed, for konnect reset (TestPatchRecordsWhatItChanged).
	if after.Annotations[PodRecordAnnotation] == "" {
		t.Errorf("no %s annotation", PodRecordAnnotation)
	}
	delete(after.Annotations, PodRecordAnnotation)
	// Nothing else in the pod moved.
	after.Spec.Containers[0].Command, before.Spec.Containers[0].Command = nil, nil
	after.Spec.Containers[0].VolumeMounts = after.Spec.Containers[0].VolumeMounts[:len(before.Spec.Containers[0].VolumeMounts)]
	after.Spec.Volumes = after.Spec.Volumes[:len(before.Spec.Volumes)]
	if !reflect.DeepEqual(before, after) {
		t.Errorf("the patch changed more than flags, volumes and mounts")
	}

	// Patching the result again changes nothing, not even formatting.
	again, res, err := PatchManifest(out, "patched", kubeadmPatch(t, nil))
	if err != nil || res.Changed || !bytes.Equal(again, out) {
		t.Fatalf("second patch: changed=%v err=%v", res.Changed, err)
	}
}

func TestPatchManifestFileBackupAndNoOp(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "manifests")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kube-apiserver.yaml")
	orig := readTestdata(t)
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 21, 12, 30, 5, 0, time.UTC)
	p := kubeadmPatch(t, nil)
	p.Now = func() time.Time { return now }

	res, err := PatchManifestFile(path, p)
	if err != nil {
		t.Fatal(err)
	}
	wantBackup := filepath.Join(dir, ".kube-apiserver.yaml.konnect-backup-20261121T123005Z")
	if !res.Changed || res.Backup != wantBackup {
		t.Fatalf("result = %+v, want changed with backup %s", res, wantBackup)
	}
	if b, err := os.ReadFile(res.Backup); err != nil || !bytes.Equal(b, orig) {
		t.Fatalf("backup does not hold the original manifest (err %v)", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("manifest mode = %v, want the original 0600", st.Mode().Perm())
	}
	// kubelet reads every file in its manifest directory whose name does not start with a dot: only the
	// manifest itself may be visible to it.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "kube-apiserver.yaml" && !strings.HasPrefix(e.Name(), ".") {
			t.Errorf("kubelet would run %s as a static pod", e.Name())
		}
	}
	patched, _ := os.ReadFile(path)

	// Second run, a minute later: no backup, no byte or mtime change.
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	res, err = PatchManifestFile(path, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed || res.Backup != "" {
		t.Fatalf("second run = %+v, want a no-op", res)
	}
	st, _ = os.Stat(path)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, patched) || !st.ModTime().Equal(old) {
		t.Errorf("second run touched the manifest (mtime %v)", st.ModTime())
	}
	if entries2, _ := os.ReadDir(dir); len(entries2) != len(entries) {
		t.Errorf("second run left %d files, want %d", len(entries2), len(entries))
	}

	// A changed input (another egress selector configuration) patches again, with a second backup next to
	// the first.
	p2 := kubeadmPatch(t, func(f *APIServerFlags) { f.EgressSelectorConfigFile = "/etc/kubernetes/egress-2.yaml" })
	p2.Now = p.Now
	p2.BackupDir = filepath.Join(t.TempDir(), "backups")
	res, err = PatchManifestFile(path, p2)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed || filepath.Dir(res.Backup) != p2.BackupDir || filepath.Base(res.Backup) != "kube-apiserver.yaml.konnect-backup-20261121T123105Z" {
		t.Fatalf("third run = %+v", res)
	}
	pod, err := decodeFile(t, path)
	if err != nil {
		t.Fatal(err)
	}
	if got := lookupFlag(apiserverOf(t, pod), "egress-selector-config-file"); !slices.Equal(got, []string{"/etc/kubernetes/egress-2.yaml"}) {
		t.Errorf("egress-selector-config-file = %q", got)
	}
}

func decodeFile(t *testing.T, path string) (*corev1.Pod, error) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return DecodePod(data, path)
}

func TestPatchManifestRefusesWhatIsNotAPod(t *testing.T) {
	tests := []struct {
		name string
		data string
		want string
	}{
		{"deployment", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n", "not a v1 Pod"},
		{"malformed yaml", "apiVersion: v1\nkind: Pod\nspec: [\n", "not a valid Pod manifest"},
		{"unknown field", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\nspec:\n  containerz: []\n", "containerz"},
		{"two documents", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: b\n", "2 YAML documents"},
		{"no kind", "metadata:\n  name: x\n", "not a valid Pod manifest"},
		{"no apiserver container", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\nspec:\n  containers:\n  - name: etcd\n    image: etcd\n    command: [etcd]\n", "no kube-apiserver container"},
		{"two apiserver containers", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\nspec:\n  containers:\n  - name: kube-apiserver\n    image: k\n    command: [kube-apiserver]\n  - name: kube-apiserver2\n    image: k\n    command: [kube-apiserver]\n", `containers "kube-apiserver", "kube-apiserver2" all run kube-apiserver (by name or command), so which one to patch is ambiguous`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
			if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := PatchManifestFile(path, kubeadmPatch(t, nil))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error = %v, want one naming %s and containing %q", err, path, tc.want)
			}
			if got, _ := os.ReadFile(path); string(got) != tc.data {
				t.Error("a refused manifest was modified")
			}
		})
	}
	if _, err := PatchManifestFile(filepath.Join(t.TempDir(), "missing.yaml"), kubeadmPatch(t, nil)); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: error = %v", err)
	}
}

func TestSetFlagForms(t *testing.T) {
	tests := []struct {
		name        string
		c           corev1.Container
		flag        Flag
		wantCommand []string
		wantArgs    []string
	}{
		{
			name:        "two-token form and a later duplicate in args",
			c:           corev1.Container{Command: []string{"/usr/local/bin/kube-apiserver"}, Args: []string{"--v=2", "--proxy-client-cert-file", "/old.crt", "--secure-port=6443", "--proxy-client-cert-file=/older.crt"}},
			flag:        Flag{"proxy-client-cert-file", "/new.crt"},
			wantCommand: []string{"/usr/local/bin/kube-apiserver"},
			wantArgs:    []string{"--v=2", "--proxy-client-cert-file=/new.crt", "--secure-port=6443"},
		},
		{
			name:     "appended to args when flags live there",
			c:        corev1.Container{Args: []string{"--v=2"}},
			flag:     Flag{"api-audiences", "a"},
			wantArgs: []string{"--v=2", "--api-audiences=a"},
		},
		{
			name:        "appended to command after the program",
			c:           corev1.Container{Command: []string{"kube-apiserver"}},
			flag:        Flag{"enable-aggregator-routing", "true"},
			wantCommand: []string{"kube-apiserver", "--enable-aggregator-routing=true"},
		},
		{
			name:        "a bare boolean never eats the next argument",
			c:           corev1.Container{Command: []string{"kube-apiserver", "--enable-aggregator-routing", "extra-positional"}},
			flag:        Flag{"enable-aggregator-routing", "true"},
			wantCommand: []string{"kube-apiserver", "--enable-aggregator-routing=true", "extra-positional"},
		},
		{
			name:        "a flag that shares a prefix is left alone",
			c:           corev1.Container{Command: []string{"kube-apiserver", "--requestheader-client-ca-file-extra=x"}},
			flag:        Flag{"requestheader-client-ca-file", "/ca"},
			wantCommand: []string{"kube-apiserver", "--requestheader-client-ca-file-extra=x", "--requestheader-client-ca-file=/ca"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			setFlag(&c, tc.flag)
			if !slices.Equal(c.Command, tc.wantCommand) || !slices.Equal(c.Args, tc.wantArgs) {
				t.Errorf("command %q args %q, want %q %q", c.Command, c.Args, tc.wantCommand, tc.wantArgs)
			}
		})
	}
}

// TestPatchPodRetiresAgentAudienceAndContainerChoice: an older konnect put the agents' audience into
// --api-audiences, which made their tokens credentials for kube-apiserver's API. The patch takes it out and
// keeps every other audience; a list left empty goes, so that kube-apiserver falls back to its issuers.
func TestPatchPodRetiresAgentAudienceAndContainerChoice(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "sidecar", Command: []string{"sleep"}},
		{Name: "apiserver", Command: []string{"/usr/local/bin/kube-apiserver", "--api-audiences=https://issuer,system:konnectivity-server,api", "--service-account-issuer=https://other"}},
	}}}
	p := ManifestPatch{Flags: []Flag{{"enable-aggregator-routing", "true"}}}
	changed, err := PatchPod(pod, p)
	if err != nil || !changed {
		t.Fatalf("PatchPod = %v, %v", changed, err)
	}
	if got := pod.Spec.Containers[1].Command[1]; got != "--api-audiences=https://issuer,api" {
		t.Errorf("the agents' audience is not retired, or others went with it: %s", got)
	}
	if len(pod.Spec.Containers[0].Command) != 1 {
		t.Errorf("sidecar changed: %q", pod.Spec.Containers[0].Command)
	}
	if changed, err := PatchPod(pod, p); err != nil || changed {
		t.Errorf("second PatchPod = %v, %v", changed, err)
	}

	only := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "kube-apiserver", Command: []string{"kube-apiserver", "--api-audiences", "system:konnectivity-server", "--v=2"}},
	}}}
	if _, err := PatchPod(only, p); err != nil {
		t.Fatal(err)
	}
	if got := only.Spec.Containers[0].Command; !slices.Equal(got, []string{"kube-apiserver", "--v=2", "--enable-aggregator-routing=true"}) {
		t.Errorf("an --api-audiences of the agents' audience alone stays: %q", got)
	}

	two := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Command: []string{"kube-apiserver"}}, {Name: "b", Command: []string{"/bin/kube-apiserver"}},
	}}}
	if _, err := PatchPod(two, p); err == nil || !strings.Contains(err.Error(), `containers "a", "b" all run kube-apiserver`) {
		t.Errorf("two candidate containers: error = %v", err)
	}
	// One named kube-apiserver does not win over another that runs it: patching the first would leave the
	// second, which may be the one serving, without the flags, and say nothing.
	named := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "kube-apiserver", Command: []string{"kube-apiserver"}}, {Name: "kube-apiserver2", Command: []string{"kube-apiserver"}},
	}}}
	before := named.DeepCopy()
	if _, err := PatchPod(named, p); err == nil || !strings.Contains(err.Error(), `containers "kube-apiserver", "kube-apiserver2" all run kube-apiserver`) || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("a container named kube-apiserver and another running it: error = %v", err)
	}
	if !reflect.DeepEqual(before, named) {
		t.Error("an ambiguous pod was changed")
	}
}

// A kube-apiserver that already serves another front proxy keeps its name and headers: the patch adds
// konnect's entries to the lists instead of replacing them, and a second patch changes nothing.
func TestPatchPodKeepsOtherFrontProxies(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-apiserver", Command: []string{"kube-apiserver",
		"--requestheader-allowed-names=auth-proxy",
		"--requestheader-username-headers=X-Forwarded-User,X-Remote-User",
		"--requestheader-group-headers=X-Forwarded-Groups",
	}}}}}
	p := ManifestPatch{Flags: []Flag{
		{"requestheader-allowed-names", "front-proxy-client"},
		{"requestheader-username-headers", "X-Remote-User"},
		{"requestheader-group-headers", "X-Remote-Group"},
		{"requestheader-extra-headers-prefix", "X-Remote-Extra-"},
	}}
	if _, err := PatchPod(pod, p); err != nil {
		t.Fatal(err)
	}
	want := []string{"kube-apiserver",
		"--requestheader-allowed-names=auth-proxy,front-proxy-client",
		"--requestheader-username-headers=X-Forwarded-User,X-Remote-User",
		"--requestheader-group-headers=X-Forwarded-Groups,X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
	}
	if got := pod.Spec.Containers[0].Command; !slices.Equal(got, want) {
		t.Errorf("command:\n got  %q\n want %q", got, want)
	}
	if changed, err := PatchPod(pod, p); err != nil || changed {
		t.Errorf("second PatchPod = %v, %v", changed, err)
	}
}

// TestPatchPodTakesOutOptionalFlagsItAdded: a flag konnect sets only on request (--enable-aggregator-routing)
// is taken out by a later patch that no longer asks for it, where konnect added it, and stays where the
// manifest had it before.
func TestPatchPodTakesOutOptionalFlagsItAdded(t *testing.T) {
	on := ManifestPatch{Flags: []Flag{{"enable-aggregator-routing", "true"}}, Optional: OptionalFlags}
	off := ManifestPatch{Optional: OptionalFlags}
	for _, tc := range []struct {
		name         string
		given, after []string // the command before the patches, and after on, on, off
	}{
		{"added by konnect", []string{"kube-apiserver"}, []string{"kube-apiserver"}},
		{"the user's", []string{"kube-apiserver", "--enable-aggregator-routing"}, []string{"kube-apiserver", "--enable-aggregator-routing=true"}},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-apiserver", Command: slices.Clone(tc.given)}}}}
		for i, p := range []ManifestPatch{on, on, off} {
			changed, err := PatchPod(pod, p)
			if err != nil {
				t.Fatal(err)
			}
			if i == 1 && changed {
				t.Errorf("%s: the same patch again changed the pod", tc.name)
			}
			if i < 2 && !slices.Contains(pod.Spec.Containers[0].Command, "--enable-aggregator-routing=true") {
				t.Fatalf("%s: patch %d: %q", tc.name, i, pod.Spec.Containers[0].Command)
			}
		}
		if got := pod.Spec.Containers[0].Command; !slices.Equal(got, tc.after) || pod.Annotations[AddedFlagsAnnotation] != "" {
			t.Errorf("%s: after the flag was no longer asked for: %q, annotations %v", tc.name, got, pod.Annotations)
		}
	}
}

// TestPatchPodNamesReplacedOptionalFlags: an optional flag that the patch turns on where the manifest had
// another value is among the replaced flags, as the other flags are; one the manifest had with the same value
// (also written otherwise) is not.
func TestPatchPodNamesReplacedOptionalFlags(t *testing.T) {
	on := ManifestPatch{Flags: []Flag{{"enable-aggregator-routing", "true"}}, Optional: OptionalFlags}
	for _, tc := range []struct {
		given []string
		want  []FlagChange
	}{
		{[]string{"--enable-aggregator-routing=false"}, []FlagChange{{"enable-aggregator-routing", "false", "true"}}},
		{[]string{"--enable-aggregator-routing=true", "--enable-aggregator-routing=0"}, []FlagChange{{"enable-aggregator-routing", "0", "true"}}},
		{[]string{"--enable-aggregator-routing"}, nil},
		{[]string{"--enable-aggregator-routing=1"}, nil},
		{nil, nil},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-apiserver",
			Command: append([]string{"kube-apiserver"}, tc.given...)}}}}
		_, replaced, err := patchPod(pod, on)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(replaced, tc.want) {
			t.Errorf("%q: replaced %v, want %v", tc.given, replaced, tc.want)
		}
	}
}

// An empty --requestheader-allowed-names admits every client certificate of the request-header CA, konnect's
// front-proxy-client among them: the patch leaves it empty instead of narrowing it to konnect's name.
func TestPatchPodKeepsEmptyAllowedNames(t *testing.T) {
	for _, given := range [][]string{{"--requestheader-allowed-names="}, {"--requestheader-allowed-names", ""}} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-apiserver",
			Command: append([]string{"kube-apiserver"}, given...)}}}}
		if _, err := PatchPod(pod, ManifestPatch{Flags: []Flag{{"requestheader-allowed-names", "front-proxy-client"}}}); err != nil {
			t.Fatal(err)
		}
		if got := pod.Spec.Containers[0].Command; !slices.Equal(got, append([]string{"kube-apiserver"}, given...)) {
			t.Errorf("%q became %q", given, got)
		}
	}
	absent := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-apiserver", Command: []string{"kube-apiserver"}}}}}
	if _, err := PatchPod(absent, ManifestPatch{Flags: []Flag{{"requestheader-allowed-names", "front-proxy-client"}}}); err != nil {
		t.Fatal(err)
	}
	if got := absent.Spec.Containers[0].Command; !slices.Equal(got, []string{"kube-apiserver", "--requestheader-allowed-names=front-proxy-client"}) {
		t.Errorf("without the flag: %q", got)
	}
}

// With --dir outside /etc/kubernetes, nothing kubeadm mounts covers the certificates: their directory is
// mounted, and moving it later moves the mount instead of adding one.
func TestPatchPodMountsUncoveredDirectories(t *testing.T) {
	pod, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	patchFor := func(dir string) ManifestPatch {
		flags, err := APIServerFlags{
			RequestHeaderClientCAFile: dir + "/pki/front-proxy-ca.crt",
			ProxyClientCertFile:       dir + "/pki/front-proxy-client.crt",
			ProxyClientKeyFile:        dir + "/pki/front-proxy-client.key",
			EgressSelectorConfigFile:  dir + "/egress-selector-configuration.yaml",
		}.Flags()
		if err != nil {
			t.Fatal(err)
		}
		return ManifestPatch{Flags: flags, UDSDir: dir + "/konnectivity-server"}
	}
	countVolumes := len(pod.Spec.Volumes)
	if changed, err := PatchPod(pod, patchFor("/var/lib/konnect")); err != nil || !changed {
		t.Fatalf("PatchPod = %v, %v", changed, err)
	}
	c := apiserverOf(t, pod)
	if v := volumeByName(pod, "konnect-pki"); v == nil || v.HostPath.Path != "/var/lib/konnect/pki" || *v.HostPath.Type != corev1.HostPathDirectory {
		t.Fatalf("pki volume = %+v", v)
	}
	if m := mountByName(c, "konnect-pki"); m == nil || m.MountPath != "/var/lib/konnect/pki" || !m.ReadOnly {
		t.Fatalf("pki mount = %+v", m)
	}
	if len(pod.Spec.Volumes) != countVolumes+3 {
		t.Fatalf("%d volumes, want %d", len(pod.Spec.Volumes), countVolumes+3)
	}
	if changed, err := PatchPod(pod, patchFor("/var/lib/konnect")); err != nil || changed {
		t.Fatalf("rerun = %v, %v", changed, err)
	}
	if changed, err := PatchPod(pod, patchFor("/srv/konnect")); err != nil || !changed {
		t.Fatalf("moved dir = %v, %v", changed, err)
	}
	if len(pod.Spec.Volumes) != countVolumes+3 || volumeByName(pod, "konnect-pki").HostPath.Path != "/srv/konnect/pki" ||
		volumeByName(pod, "konnectivity-uds").HostPath.Path != "/srv/konnect/konnectivity-server" {
		t.Fatalf("moving the directory did not move the mounts: %+v", pod.Spec.Volumes)
	}
	// Back to the kubeadm layout: k8s-certs covers the certificates again, so konnect's own mount goes.
	if changed, err := PatchPod(pod, kubeadmPatch(t, nil)); err != nil || !changed {
		t.Fatalf("back to kubeadm layout = %v, %v", changed, err)
	}
	if volumeByName(pod, "konnect-pki") != nil || mountByName(apiserverOf(t, pod), "konnect-pki") != nil {
		t.Error("konnect-pki kept although k8s-certs covers the certificates")
	}
}

func TestPatchPodTCPTransport(t *testing.T) {
	pod, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := PatchPod(pod, kubeadmPatch(t, nil)); err != nil {
		t.Fatal(err)
	}
	sel := SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:8090",
		CABundle: "/etc/kubernetes/pki/ca.crt", ClientCert: "/opt/egress/client.crt", ClientKey: "/opt/egress/client.key"}
	p := kubeadmPatch(t, nil)
	p.UDSDir, p.Files = sel.UDSDir(), sel.Files()
	if changed, err := PatchPod(pod, p); err != nil || !changed {
		t.Fatalf("PatchPod = %v, %v", changed, err)
	}
	if volumeByName(pod, "konnectivity-uds") != nil || mountByName(apiserverOf(t, pod), "konnectivity-uds") != nil {
		t.Error("socket mount kept with a TCP transport")
	}
	if v := volumeByName(pod, "konnect-pki"); v == nil || v.HostPath.Path != "/opt/egress" {
		t.Errorf("TLS file directory not mounted: %+v", v)
	}
}

func TestPatchPodRefusesTakenMountPath(t *testing.T) {
	dirType := corev1.HostPathDirectory
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "kube-apiserver", Command: []string{"kube-apiserver"},
			VolumeMounts: []corev1.VolumeMount{{Name: "elsewhere", MountPath: "/etc/kubernetes/konnectivity-server"}}}},
		Volumes: []corev1.Volume{{Name: "elsewhere", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/other", Type: &dirType}}}},
	}}
	_, err := PatchPod(pod, ManifestPatch{UDSDir: "/etc/kubernetes/konnectivity-server"})
	if err == nil || !strings.Contains(err.Error(), `volume "elsewhere"`) {
		t.Fatalf("error = %v, want one naming the volume that holds the mount path", err)
	}
}

func TestPatchManifestFileThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real", "kube-apiserver.yaml")
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		t.Fatal(err)
	}
	// A leading document marker and comment are still one document.
	if err := os.WriteFile(target, append([]byte("---\n# written by hand\n"), readTestdata(t)...), 0o640); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "kube-apiserver.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	res, err := PatchManifestFile(link, kubeadmPatch(t, nil))
	if err != nil || !res.Changed {
		t.Fatalf("PatchManifestFile = %+v, %v", res, err)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink was replaced (err %v)", err)
	}
	if st, _ := os.Stat(target); st.Mode().Perm() != 0o640 {
		t.Errorf("target mode %v, want 0640 kept", st.Mode().Perm())
	}
	pod, err := decodeFile(t, target)
	if err != nil {
		t.Fatal(err)
	}
	if len(lookupFlag(apiserverOf(t, pod), "egress-selector-config-file")) != 1 {
		t.Error("the target was not patched")
	}
	if filepath.Dir(res.Backup) != filepath.Dir(target) {
		t.Errorf("backup %s is not next to the target", res.Backup)
	}
}

// TestPatchManifestFileRefusesForeignSymlink: a manifest that is another user's symlink is not written
// through, naming it, and the file it points to is left as it was.
func TestPatchManifestFileRefusesForeignSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making another user's symlink needs root")
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "real", "kube-apiserver.yaml")
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, readTestdata(t), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "kube-apiserver.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := PatchManifestFile(link, kubeadmPatch(t, nil)); !errors.Is(err, safepath.ErrShared) || !strings.Contains(err.Error(), link) {
		t.Fatalf("PatchManifestFile through another user's symlink: %v", err)
	}
	if data, _ := os.ReadFile(target); !bytes.Equal(data, readTestdata(t)) {
		t.Error("the symlink's target was patched")
	}
	if entries, _ := os.ReadDir(filepath.Dir(target)); len(entries) != 1 {
		t.Errorf("a backup was written: %v", entries)
	}
}

// TestPatchManifestFileRefusesForeignFile: a manifest that belongs to another user, or that others may
// write to, is not patched, naming it, and is left as it was: kubelet would run what they wrote.
func TestPatchManifestFileRefusesForeignFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making another user's file needs root")
	}
	for _, c := range []struct {
		name string
		set  func(path string) error
		want string
	}{
		{"owner", func(path string) error { return os.Chown(path, 65534, 65534) }, "belongs to uid 65534"},
		{"writable", func(path string) error { return os.Chmod(path, 0o666) }, "writable by everyone"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "kube-apiserver.yaml")
			if err := os.WriteFile(path, readTestdata(t), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := c.set(path); err != nil {
				t.Fatal(err)
			}
			_, err := PatchManifestFile(path, kubeadmPatch(t, nil))
			if !errors.Is(err, safepath.ErrShared) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("PatchManifestFile of a manifest that %s: %v", c.want, err)
			}
			if data, _ := os.ReadFile(path); !bytes.Equal(data, readTestdata(t)) {
				t.Error("the manifest was patched")
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("a backup was written: %v", entries)
			}
		})
	}
}

// A manifest set up by hand from the Kubernetes documentation may already mount the socket directory,
// under another name; and a configuration file inside a mounted directory needs no mount of its own.
func TestPatchPodReusesExistingMounts(t *testing.T) {
	pod, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	dirType := corev1.HostPathDirectoryOrCreate
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "konnectivity-sock", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: "/etc/kubernetes/konnectivity-server", Type: &dirType}}})
	c := apiserverOf(t, pod)
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "konnectivity-sock", MountPath: "/etc/kubernetes/konnectivity-server"})
	volumes := len(pod.Spec.Volumes)

	p := kubeadmPatch(t, func(f *APIServerFlags) {
		f.EgressSelectorConfigFile = "/etc/kubernetes/konnectivity-server/egress-selector-configuration.yaml"
	})
	if changed, err := PatchPod(pod, p); err != nil || !changed {
		t.Fatalf("PatchPod = %v, %v", changed, err)
	}
	if len(pod.Spec.Volumes) != volumes {
		t.Errorf("added %d volumes although existing mounts cover everything: %+v", len(pod.Spec.Volumes)-volumes, pod.Spec.Volumes[volumes:])
	}
}

// TestPatchPodUIDHeadersFollowTheImage: kube-apiserver before 1.33 refuses --requestheader-uid-headers and
// would not start, so the patch leaves it out for such an image, and takes out one an earlier run added;
// 1.32 takes it with the RemoteRequestHeaderUID feature gate, and then it stays.
func TestPatchPodUIDHeadersFollowTheImage(t *testing.T) {
	p := ManifestPatch{Flags: []Flag{{"requestheader-uid-headers", "X-Remote-Uid"}}}
	for _, tc := range []struct {
		image string
		want  bool
		gates []string
	}{
		{"registry.k8s.io/kube-apiserver:v1.31.4", false, nil},
		{"registry.k8s.io/kube-apiserver:v1.31.4", false, []string{"--feature-gates=RemoteRequestHeaderUID=true"}},
		{"registry.k8s.io/kube-apiserver:v1.32.0", false, nil},
		{"registry.k8s.io/kube-apiserver:v1.32.4", true, []string{"--feature-gates=AllAlpha=false,RemoteRequestHeaderUID=true"}},
		{"registry.k8s.io/kube-apiserver:v1.32.4", true, []string{"--feature-gates", "RemoteRequestHeaderUID=True"}},
		{"registry.k8s.io/kube-apiserver:v1.32.4", false, []string{"--feature-gates=RemoteRequestHeaderUID=true", "--feature-gates=RemoteRequestHeaderUID=false"}},
		{"registry.k8s.io/kube-apiserver:v1.33.0", true, nil},
		{"localhost:5000/kube-apiserver:v1.36.1@sha256:0123", true, nil},
		{"localhost:5000/kube-apiserver:v1.30.2@sha256:0123", false, nil},
		{"localhost:5000/kube-apiserver", true, nil},
		{"registry.example/kube-apiserver:custom-build", true, nil},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "kube-apiserver", Image: tc.image,
			Command: append([]string{"kube-apiserver", "--requestheader-uid-headers", "X-Remote-Uid", "--secure-port=6443"}, tc.gates...),
		}}}}
		if _, err := PatchPod(pod, p); err != nil {
			t.Fatalf("%s: %v", tc.image, err)
		}
		has := slices.Contains(pod.Spec.Containers[0].Command, "--requestheader-uid-headers=X-Remote-Uid")
		if has != tc.want || !slices.Contains(pod.Spec.Containers[0].Command, "--secure-port=6443") {
			t.Errorf("%s %v: command %q, want the uid-headers flag: %v", tc.image, tc.gates, pod.Spec.Containers[0].Command, tc.want)
		}
	}
}
