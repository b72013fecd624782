package kubeapiserver

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

func podYAML(pod *corev1.Pod) string {
	b, _ := yaml.Marshal(pod)
	return string(b)
}

// PatchPod records what it changed with the values from before konnect, a later patch keeps the first value,
// and UnpatchPod puts back every flag and volume, without kubeadm's record: the front-proxy files konnect
// pointed elsewhere, the flag it added, and a volume of the user's that had one of konnect's names.
func TestPatchRecordsWhatItChanged(t *testing.T) {
	original, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	// The user's own socket directory volume, in the middle, under the name konnect uses for its own.
	c := apiserverOf(t, original)
	dirType := corev1.HostPathDirectoryOrCreate
	users := corev1.Volume{Name: udsVolume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/users-konnectivity", Type: &dirType}}}
	original.Spec.Volumes = append([]corev1.Volume{users}, original.Spec.Volumes...)
	c.VolumeMounts = append([]corev1.VolumeMount{{Name: udsVolume, MountPath: "/run/users-konnectivity"}}, c.VolumeMounts...)

	patch := func(dir string) ManifestPatch {
		p := kubeadmPatch(t, func(f *APIServerFlags) {
			f.RequestHeaderClientCAFile = dir + "/pki/front-proxy-ca.crt"
			f.ProxyClientCertFile = dir + "/pki/front-proxy-client.crt"
			f.ProxyClientKeyFile = dir + "/pki/front-proxy-client.key"
			f.EgressSelectorConfigFile = dir + "/egress-selector-configuration.yaml"
		})
		p.Optional = OptionalFlags
		p.Annotations = map[string]string{EgressConfigAnnotation: dir}
		return p
	}
	pod := original.DeepCopy()
	for _, dir := range []string{"/srv/konnect", "/srv/konnect2"} {
		if _, err := PatchPod(pod, patch(dir)); err != nil {
			t.Fatal(err)
		}
	}
	rec, ok, err := readPodRecord(pod)
	if err != nil || !ok {
		t.Fatalf("record %v, %v:\n%s", ok, err, podYAML(pod))
	}
	wantFlags := map[string]string{
		"requestheader-client-ca-file": "/etc/kubernetes/pki/front-proxy-ca.crt",
		"proxy-client-cert-file":       "/etc/kubernetes/pki/front-proxy-client.crt",
		"proxy-client-key-file":        "/etc/kubernetes/pki/front-proxy-client.key",
		"requestheader-uid-headers":    "",
		"egress-selector-config-file":  "",
	}
	for _, f := range rec.Flags {
		want, ok := wantFlags[f.Name]
		got := ""
		if f.Previous != nil {
			got = *f.Previous
		}
		if !ok || got != want {
			t.Errorf("recorded --%s with previous %q, want %v %q", f.Name, got, ok, want)
		}
		delete(wantFlags, f.Name)
	}
	for name := range wantFlags {
		t.Errorf("--%s not recorded", name)
	}
	for _, v := range rec.Volumes {
		switch {
		case v.Name == udsVolume && (v.Previous == nil || v.Previous.HostPath.Path != "/run/users-konnectivity"):
			t.Errorf("volume %s recorded with previous %+v, want the user's", v.Name, v.Previous)
		case v.Name != udsVolume && v.Previous != nil:
			t.Errorf("volume %s recorded with previous %+v, want none (konnect added it)", v.Name, v.Previous)
		}
	}

	changed, err := UnpatchPod(pod, KubeadmRecord{})
	if err != nil || !changed {
		t.Fatalf("changed %v err %v", changed, err)
	}
	if !equality.Semantic.DeepEqual(pod, original) {
		t.Errorf("after UnpatchPod:\n%s\nwant as before konnect:\n%s", podYAML(pod), podYAML(original))
	}
	if changed, err := UnpatchPod(pod, KubeadmRecord{}); changed || err != nil {
		t.Errorf("a second UnpatchPod: changed %v err %v", changed, err)
	}
}

// A pod konnect never patched (Konnectivity set up by hand, with the volume names of the Kubernetes
// documentation that konnect uses too) is left as it is: its egress selector flag and its volumes are the user's.
func TestUnpatchPodLeavesAPodKonnectNeverPatched(t *testing.T) {
	pod, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	c := apiserverOf(t, pod)
	c.Command = append(c.Command, "--egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml")
	for _, v := range []struct {
		name, path string
		t          corev1.HostPathType
	}{{egressConfigVolume, "/etc/kubernetes/egress-selector-configuration.yaml", corev1.HostPathFileOrCreate}, {udsVolume, "/etc/kubernetes/konnectivity-server", corev1.HostPathDirectoryOrCreate}} {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: v.name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: v.path, Type: &v.t}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v.name, MountPath: v.path})
	}
	before := pod.DeepCopy()
	changed, err := UnpatchPod(pod, KubeadmRecord{})
	if err != nil || changed {
		t.Fatalf("changed %v err %v:\n%s", changed, err, podYAML(pod))
	}
	if !equality.Semantic.DeepEqual(pod, before) {
		t.Errorf("UnpatchPod changed a pod konnect never patched:\n%s", podYAML(pod))
	}
}

// A pod patched by a konnect that kept no PodRecord, with front-proxy files outside kubeadm's directory: the
// flags still read through konnect-pki, so UnpatchPod refuses, naming the flag and file, and changes nothing.
func TestUnpatchPodRefusesVolumeAFlagStillReads(t *testing.T) {
	pod, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	p := kubeadmPatch(t, func(f *APIServerFlags) {
		f.ProxyClientCertFile = "/srv/konnect/pki/front-proxy-client.crt"
		f.ProxyClientKeyFile = "/srv/konnect/pki/front-proxy-client.key"
	})
	p.Annotations = map[string]string{EgressConfigAnnotation: "abc"}
	if _, err := PatchPod(pod, p); err != nil {
		t.Fatal(err)
	}
	delete(pod.Annotations, PodRecordAnnotation)
	before := pod.DeepCopy()
	_, err = UnpatchPod(pod, KubeadmRecord{})
	if err == nil {
		t.Fatalf("UnpatchPod succeeded:\n%s", podYAML(pod))
	}
	for _, want := range []string{`"konnect-pki"`, "--proxy-client-cert-file", "/srv/konnect/pki/front-proxy-client.crt"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if !equality.Semantic.DeepEqual(pod, before) {
		t.Errorf("UnpatchPod changed the pod although it refused")
	}
}

// After kubeadm wrote the manifest anew (konnect's flags and volumes, no annotations), a patch that moves the
// socket directory records konnect's own earlier volume as the pod's; kubeadm's record, which names the volume as
// konnect's, wins, so UnpatchPod removes it rather than putting konnect's old one back.
func TestUnpatchPodKubeadmRecordWinsOverPodRecord(t *testing.T) {
	p := kubeadmPatch(t, nil)
	p.Optional = OptionalFlags
	before, after := patchedPair(t, p)
	_, rec, _, err := RecordInClusterConfiguration(clusterConfiguration, KubeadmRecord{}, before, after, managedNames(p))
	if err != nil {
		t.Fatal(err)
	}
	pod := after.DeepCopy()
	pod.Annotations = before.DeepCopy().Annotations
	p.UDSDir = "/run/konnectivity-moved"
	if _, err := PatchPod(pod, p); err != nil {
		t.Fatal(err)
	}
	if r, ok, _ := readPodRecord(pod); !ok || !r.restores(udsVolume) {
		t.Fatalf("the second patch did not record konnect's earlier %s as the pod's:\n%s", udsVolume, podYAML(pod))
	}
	if _, err := UnpatchPod(pod, rec); err != nil {
		t.Fatal(err)
	}
	if v := volumeByName(pod, udsVolume); v != nil {
		t.Errorf("volume %+v is back after reset", v)
	}
	if !equality.Semantic.DeepEqual(pod, before) {
		t.Errorf("after UnpatchPod:\n%s\nwant kubeadm's:\n%s", podYAML(pod), podYAML(before))
	}
}

// A pod patched by a konnect that kept no PodRecord (before the annotation existed), then by this one: the
// socket mount that the older konnect made read-write changes, and the record must call konnect-named volumes
// konnect's, and the flags the older konnect set Unknown, not the pod's own. UnpatchPod then refuses while a
// flag reads through a volume it removes, and once the user has put the flags back, it leaves the pod as it
// was before either konnect, rather than putting back the older konnect's socket mount.
func TestPatchAfterAnUnrecordedKonnect(t *testing.T) {
	original, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	p := kubeadmPatch(t, func(f *APIServerFlags) {
		f.RequestHeaderClientCAFile = "/srv/konnect/pki/front-proxy-ca.crt"
		f.ProxyClientCertFile = "/srv/konnect/pki/front-proxy-client.crt"
		f.ProxyClientKeyFile = "/srv/konnect/pki/front-proxy-client.key"
		f.EgressSelectorConfigFile = "/srv/konnect/egress-selector-configuration.yaml"
	})
	p.Optional = OptionalFlags
	p.Annotations = map[string]string{EgressConfigAnnotation: "abc"}
	p.UDSDir = "/srv/konnect/konnectivity-server"

	// As the older konnect left it: no record, the socket directory mounted read-write, no UID header flag.
	pod := original.DeepCopy()
	if _, err := PatchPod(pod, p); err != nil {
		t.Fatal(err)
	}
	delete(pod.Annotations, PodRecordAnnotation)
	c := apiserverOf(t, pod)
	mountByName(c, udsVolume).ReadOnly = false
	editFlag(c, uidHeadersFlag, false, "")

	if _, err := PatchPod(pod, p); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := readPodRecord(pod)
	if err != nil || !ok {
		t.Fatalf("record %v, %v", ok, err)
	}
	for _, v := range rec.Volumes {
		if v.Previous != nil || v.PreviousMount != nil {
			t.Errorf("volume %s recorded with the older konnect's as the pod's own: %+v", v.Name, v)
		}
	}
	for _, f := range rec.Flags {
		switch f.Name {
		case "proxy-client-cert-file", "proxy-client-key-file", "requestheader-client-ca-file":
			if !f.Unknown {
				t.Errorf("--%s, set by the older konnect, recorded as %+v, want unknown", f.Name, f)
			}
		case uidHeadersFlag, egressSelectorFlag:
			if f.Unknown || f.Previous != nil {
				t.Errorf("--%s, which the pod did not have before konnect, recorded as %+v", f.Name, f)
			}
		}
	}

	before := pod.DeepCopy()
	if _, err := UnpatchPod(pod, KubeadmRecord{}); err == nil || !strings.Contains(err.Error(), "/srv/konnect/pki/front-proxy") {
		t.Fatalf("UnpatchPod with the older konnect's front-proxy flags: %v", err)
	}
	if !equality.Semantic.DeepEqual(pod, before) {
		t.Fatal("UnpatchPod changed the pod although it refused")
	}
	// The user puts the flags back, as the error asks.
	c = apiserverOf(t, pod)
	oc := apiserverOf(t, original)
	for _, name := range []string{"proxy-client-cert-file", "proxy-client-key-file", "requestheader-client-ca-file"} {
		setFlag(c, Flag{name, *flagValue(oc, name)})
	}
	if _, err := UnpatchPod(pod, KubeadmRecord{}); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(pod, original) {
		t.Errorf("after reset:\n%s\nwant the pod from before konnect:\n%s", podYAML(pod), podYAML(original))
	}
}

// aggregatorRouting returns the --enable-aggregator-routing tokens of pod's kube-apiserver command.
func aggregatorRouting(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	var out []string
	for _, tok := range apiserverOf(t, pod).Command {
		if tok == "--"+aggregatorRoutingFlag || strings.HasPrefix(tok, "--"+aggregatorRoutingFlag+"=") {
			out = append(out, tok)
		}
	}
	return out
}

// optionalFlagCases are manifests' --enable-aggregator-routing before konnect, and what reset, or a patch that no
// longer asks for the flag, leaves: a value the patch replaced comes back in the form the manifest had it, a flag
// the patch added goes, and one that already held the value stays, as the patch wrote it.
var optionalFlagCases = []struct {
	name        string
	given, back []string
}{
	{"false", []string{"--enable-aggregator-routing=false"}, []string{"--enable-aggregator-routing=false"}},
	{"0", []string{"--enable-aggregator-routing=0"}, []string{"--enable-aggregator-routing=0"}},
	{"absent", nil, nil},
	{"true", []string{"--enable-aggregator-routing=true"}, []string{"--enable-aggregator-routing=true"}},
	{"bare", []string{"--enable-aggregator-routing"}, []string{"--enable-aggregator-routing=true"}},
}

// withCommandTail returns the testdata pod with tail appended to the kube-apiserver command.
func withCommandTail(t *testing.T, tail []string) *corev1.Pod {
	t.Helper()
	pod, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	c := apiserverOf(t, pod)
	c.Command = append(c.Command, tail...)
	return pod
}

// An optional flag that the patch turned on in place of another value is recorded with that value: UnpatchPod
// puts it back, and so does a later patch that no longer asks for the flag, after which a patch that asks again
// records it again.
func TestOptionalFlagGetsItsValueBack(t *testing.T) {
	on, off := routingPatches(t)
	on.Annotations = map[string]string{EgressConfigAnnotation: "abc"}
	off.Annotations = on.Annotations
	for _, tc := range optionalFlagCases {
		want := withCommandTail(t, tc.back)
		unpatch := func(step string, pod *corev1.Pod) {
			t.Helper()
			pod = pod.DeepCopy()
			if _, err := UnpatchPod(pod, KubeadmRecord{}); err != nil {
				t.Fatalf("%s: %s: %v", tc.name, step, err)
			}
			if got := aggregatorRouting(t, pod); !slices.Equal(got, tc.back) {
				t.Errorf("%s: reset after %s: %q, want %q", tc.name, step, got, tc.back)
			} else if !equality.Semantic.DeepEqual(pod, want) {
				t.Errorf("%s: reset after %s:\n%s\nwant:\n%s", tc.name, step, podYAML(pod), podYAML(want))
			}
		}
		pod := withCommandTail(t, tc.given)
		for i, step := range []string{"init", "init again"} {
			changed, err := PatchPod(pod, on)
			if err != nil {
				t.Fatal(err)
			}
			if i == 1 && changed {
				t.Errorf("%s: the same patch again changed the pod", tc.name)
			}
			if got := aggregatorRouting(t, pod); !slices.Equal(got, []string{"--enable-aggregator-routing=true"}) {
				t.Fatalf("%s: %s: %q", tc.name, step, got)
			}
		}
		unpatch("init", pod)

		if _, err := PatchPod(pod, off); err != nil {
			t.Fatal(err)
		}
		if got := aggregatorRouting(t, pod); !slices.Equal(got, tc.back) {
			t.Errorf("%s: init without the flag left %q, want %q", tc.name, got, tc.back)
		}
		unpatch("init without the flag", pod)

		if _, err := PatchPod(pod, on); err != nil {
			t.Fatal(err)
		}
		if got := aggregatorRouting(t, pod); !slices.Equal(got, []string{"--enable-aggregator-routing=true"}) {
			t.Fatalf("%s: init with the flag again: %q", tc.name, got)
		}
		unpatch("init with the flag again", pod)
	}
}

// A pod that the previous konnect patched from --enable-aggregator-routing=false has a record without the flag,
// whose value before konnect is lost: UnpatchPod still puts everything else back and leaves the flag on, and so
// does a patch that no longer asks for it.
func TestOptionalFlagRecordOfThePreviousKonnect(t *testing.T) {
	on, off := routingPatches(t)
	pod := withCommandTail(t, []string{"--enable-aggregator-routing=false"})
	if _, err := PatchPod(pod, on); err != nil {
		t.Fatal(err)
	}
	rec, _, err := readPodRecord(pod)
	if err != nil || !rec.flag(aggregatorRoutingFlag) {
		t.Fatalf("record %+v, %v", rec, err)
	}
	rec.Flags = slices.DeleteFunc(rec.Flags, func(f RecordedFlag) bool { return f.Name == aggregatorRoutingFlag })
	if err := writePodRecord(pod, rec); err != nil {
		t.Fatal(err)
	}
	want := withCommandTail(t, []string{"--enable-aggregator-routing=true"})
	for _, p := range []*ManifestPatch{nil, &off} {
		pod := pod.DeepCopy()
		if p != nil {
			if _, err := PatchPod(pod, *p); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := UnpatchPod(pod, KubeadmRecord{}); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(pod, want) {
			t.Errorf("after reset:\n%s\nwant:\n%s", podYAML(pod), podYAML(want))
		}
	}
}
