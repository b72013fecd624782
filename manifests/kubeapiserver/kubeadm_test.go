package kubeapiserver

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// clusterConfiguration is what kubeadm 1.36 stores in kubeadm-config, with one extraArg of the user's.
const clusterConfiguration = `apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.36.1
controlPlaneEndpoint: 198.18.4.1:6443
apiServer:
  extraArgs:
  - name: audit-log-maxage
    value: "7"
controllerManager: {}
`

func patchedPair(t *testing.T, p ManifestPatch) (before, after *corev1.Pod) {
	t.Helper()
	before, err := DecodePod(readTestdata(t), "testdata")
	if err != nil {
		t.Fatal(err)
	}
	after = before.DeepCopy()
	if _, err := PatchPod(after, p); err != nil {
		t.Fatal(err)
	}
	return before, after
}

// managedNames are the flags p sets, as konnect init --kubeadm names them: an optional flag p does not set is
// not konnect's.
func managedNames(p ManifestPatch) []string {
	var out []string
	for _, f := range p.Flags {
		out = append(out, f.Name)
	}
	return out
}

type apiServerSection struct {
	APIServer struct {
		ExtraArgs    []struct{ Name, Value string } `json:"extraArgs"`
		ExtraVolumes []struct {
			Name, HostPath, MountPath, PathType string
			ReadOnly                            bool
		} `json:"extraVolumes"`
	} `json:"apiServer"`
}

func decodeSection(t *testing.T, cc string) apiServerSection {
	t.Helper()
	var s apiServerSection
	if err := yaml.Unmarshal([]byte(cc), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// konnect's change to kubeadm's kube-apiserver goes into the ClusterConfiguration: exactly the flags whose
// values it changed and its two volumes; the user's extraArgs stay; a second run changes nothing; removal puts
// the ClusterConfiguration back as it was.
func TestRecordInClusterConfiguration(t *testing.T) {
	p := kubeadmPatch(t, nil)
	p.Optional = OptionalFlags
	before, after := patchedPair(t, p)
	cc, rec, changed, err := RecordInClusterConfiguration(clusterConfiguration, KubeadmRecord{}, before, after, managedNames(p))
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	got := map[string]string{}
	for _, a := range decodeSection(t, cc).APIServer.ExtraArgs {
		got[a.Name] = a.Value
	}
	want := map[string]string{
		"audit-log-maxage":            "7",
		"egress-selector-config-file": "/etc/kubernetes/egress-selector-configuration.yaml",
		"requestheader-uid-headers":   "X-Remote-Uid",
		"enable-aggregator-routing":   "true",
	}
	// The testdata manifest is kubeadm's: its requestheader and proxy-client flags are konnect's already.
	if len(got) != len(want) {
		t.Errorf("extraArgs %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("extraArgs %s=%q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	vols := decodeSection(t, cc).APIServer.ExtraVolumes
	if len(vols) != 2 || vols[0].Name != udsVolume || vols[0].PathType != "DirectoryOrCreate" || !vols[0].ReadOnly ||
		vols[1].Name != egressConfigVolume || vols[1].PathType != "File" || !vols[1].ReadOnly ||
		vols[1].HostPath != "/etc/kubernetes/egress-selector-configuration.yaml" || vols[1].MountPath != vols[1].HostPath {
		t.Errorf("extraVolumes %+v", vols)
	}
	if len(rec.ExtraArgs) != 3 || len(rec.ExtraVolumes) != 2 {
		t.Errorf("record %s", rec)
	}
	for _, a := range rec.ExtraArgs {
		if a.Previous != nil || a.ManifestPrevious != nil {
			t.Errorf("record of %s has a previous value: %s", a.Name, rec)
		}
	}

	// Again, on the patched manifest (a second run, or a node that joined with these extraArgs): nothing changes.
	cc2, rec2, changed, err := RecordInClusterConfiguration(cc, rec, after, after, managedNames(p))
	if err != nil || changed || cc2 != cc || rec2.String() != rec.String() {
		t.Errorf("second run: changed %v, err %v, record %s -> %s", changed, err, rec, rec2)
	}

	back, changed, err := RemoveFromClusterConfiguration(cc, rec)
	if err != nil || !changed {
		t.Fatalf("remove: changed %v, err %v", changed, err)
	}
	if differ, _ := clusterConfigChanged(clusterConfiguration, back); differ {
		t.Errorf("after removal:\n%s\nwant the original:\n%s", back, clusterConfiguration)
	}
	done := rec
	done.Removed = true
	if again, changed, _ := RemoveFromClusterConfiguration(back, done); changed || again != back {
		t.Errorf("a removed record removed again changed the ClusterConfiguration")
	}
}

// A flag the user had in extraArgs keeps its value after removal; one konnect no longer sets goes out of the
// ClusterConfiguration and the record.
func TestRecordKeepsUsersValuesAndDropsWhatIsNoLongerSet(t *testing.T) {
	users := strings.Replace(clusterConfiguration, "  - name: audit-log-maxage\n", "  - name: requestheader-uid-headers\n    value: X-My-Uid\n  - name: audit-log-maxage\n", 1)
	p := kubeadmPatch(t, nil)
	p.Optional = OptionalFlags
	before, after := patchedPair(t, p)
	cc, rec, _, err := RecordInClusterConfiguration(users, KubeadmRecord{}, before, after, managedNames(p))
	if err != nil {
		t.Fatal(err)
	}
	uid := rec.arg("requestheader-uid-headers")
	if uid == nil || uid.Previous == nil || *uid.Previous != "X-My-Uid" || uid.Value != "X-Remote-Uid" {
		t.Fatalf("record %s", rec)
	}
	// Without --enable-aggregator-routing the next time.
	_, off := routingPatches(t)
	after2 := after.DeepCopy()
	if _, err := PatchPod(after2, off); err != nil {
		t.Fatal(err)
	}
	cc2, rec2, changed, err := RecordInClusterConfiguration(cc, rec, after, after2, managedNames(off))
	if err != nil || !changed || rec2.arg("enable-aggregator-routing") != nil || strings.Contains(cc2, "enable-aggregator-routing") {
		t.Fatalf("changed %v err %v record %s:\n%s", changed, err, rec2, cc2)
	}
	back, _, err := RemoveFromClusterConfiguration(cc2, rec2)
	if err != nil {
		t.Fatal(err)
	}
	if differ, _ := clusterConfigChanged(users, back); differ {
		t.Errorf("after removal:\n%s\nwant:\n%s", back, users)
	}
}

func TestRecordRefusesOldClusterConfiguration(t *testing.T) {
	p := kubeadmPatch(t, nil)
	before, after := patchedPair(t, p)
	old := strings.Replace(clusterConfiguration, "v1beta4", "v1beta3", 1)
	if _, _, _, err := RecordInClusterConfiguration(old, KubeadmRecord{}, before, after, managedNames(p)); err == nil || !strings.Contains(err.Error(), "v1beta3") {
		t.Fatalf("err %v, want one naming v1beta3", err)
	}
}

// UnpatchPod puts kubeadm's kube-apiserver back exactly as it was before konnect's patch, also after kubeadm wrote
// it anew from the recorded ClusterConfiguration (no annotations then).
func TestUnpatchPodRestoresKubeadmsManifest(t *testing.T) {
	p := kubeadmPatch(t, nil)
	p.Optional = OptionalFlags
	p.Annotations = map[string]string{EgressConfigAnnotation: "abc"}
	before, after := patchedPair(t, p)
	_, rec, _, err := RecordInClusterConfiguration(clusterConfiguration, KubeadmRecord{}, before, after, managedNames(p))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"patched", after.DeepCopy()},
		{"written anew by kubeadm", func() *corev1.Pod {
			pod := after.DeepCopy()
			pod.Annotations = before.DeepCopy().Annotations
			return pod
		}()},
	} {
		changed, err := UnpatchPod(tc.pod, rec)
		if err != nil || !changed {
			t.Fatalf("%s: changed %v err %v", tc.name, changed, err)
		}
		if len(tc.pod.Annotations) == 0 && len(before.Annotations) == 0 {
			tc.pod.Annotations = before.Annotations
		}
		if !equality.Semantic.DeepEqual(tc.pod, before) {
			a, _ := yaml.Marshal(tc.pod)
			b, _ := yaml.Marshal(before)
			t.Errorf("%s: after UnpatchPod:\n%s\nwant kubeadm's:\n%s", tc.name, a, b)
		}
		if changed, _ := UnpatchPod(tc.pod, rec); changed {
			t.Errorf("%s: a second UnpatchPod changed the pod", tc.name)
		}
	}
}

// Without a record (konnect reset without --kubeadm), UnpatchPod takes out what is konnect's alone: the egress
// selector flag, the flags it added on request, its volumes and annotations.
func TestUnpatchPodWithoutRecord(t *testing.T) {
	p := kubeadmPatch(t, nil)
	p.Optional = OptionalFlags
	p.Annotations = map[string]string{EgressConfigAnnotation: "abc"}
	before, after := patchedPair(t, p)
	changed, err := UnpatchPod(after, KubeadmRecord{})
	if err != nil || !changed {
		t.Fatalf("changed %v err %v", changed, err)
	}
	c := apiserverOf(t, after)
	for _, gone := range []string{"egress-selector-config-file", "enable-aggregator-routing"} {
		if v := lookupFlag(c, gone); len(v) > 0 || hasFlag(c, gone) {
			t.Errorf("--%s is still there: %v", gone, v)
		}
	}
	for _, v := range after.Spec.Volumes {
		if konnectVolume(v.Name) {
			t.Errorf("volume %s is still there", v.Name)
		}
	}
	if len(after.Annotations) != len(before.Annotations) {
		t.Errorf("annotations %v, want %v", after.Annotations, before.Annotations)
	}
	if len(c.VolumeMounts) != len(apiserverOf(t, before).VolumeMounts) {
		t.Errorf("volume mounts %v", c.VolumeMounts)
	}
}

// With kubeadm's record, an optional flag that the patch turned on in place of another value gets it back from
// UnpatchPod, also on a manifest kubeadm wrote anew, and one the manifest had on already is not recorded, so reset
// leaves it on. A later run that no longer asks for the flag takes it out of the ClusterConfiguration and the
// record, as it does a flag konnect added, and puts the manifest's value back also where kubeadm wrote the
// manifest anew with konnect's value, on this node or another.
func TestKubeadmRecordKeepsOptionalFlagsValue(t *testing.T) {
	on, off := routingPatches(t)
	for _, tc := range optionalFlagCases {
		before := withCommandTail(t, tc.given)
		want := withCommandTail(t, tc.back)
		after := before.DeepCopy()
		if _, err := PatchPod(after, on); err != nil {
			t.Fatal(err)
		}
		cc, rec, _, err := RecordInClusterConfiguration(clusterConfiguration, KubeadmRecord{}, before, after, managedNames(on))
		if err != nil {
			t.Fatal(err)
		}
		unpatch := func(step string, pod *corev1.Pod, rec KubeadmRecord) {
			t.Helper()
			pod = pod.DeepCopy()
			pod.Annotations = before.DeepCopy().Annotations // as kubeadm writes it anew
			if _, err := UnpatchPod(pod, rec); err != nil {
				t.Fatalf("%s: %s: %v", tc.name, step, err)
			}
			if got := aggregatorRouting(t, pod); !slices.Equal(got, tc.back) {
				t.Errorf("%s: reset after %s: %q, want %q (record %s)", tc.name, step, got, tc.back, rec)
			} else if !equality.Semantic.DeepEqual(pod, want) {
				t.Errorf("%s: reset after %s:\n%s\nwant:\n%s", tc.name, step, podYAML(pod), podYAML(want))
			}
		}
		unpatch("init", after, rec)

		after2 := after.DeepCopy()
		if _, err := PatchPod(after2, off); err != nil {
			t.Fatal(err)
		}
		cc2, rec2, _, err := RecordInClusterConfiguration(cc, rec, after, after2, managedNames(off))
		if err != nil {
			t.Fatal(err)
		}
		if rec2.arg(aggregatorRoutingFlag) != nil || strings.Contains(cc2, aggregatorRoutingFlag) {
			t.Errorf("%s: init without the flag: record %s:\n%s", tc.name, rec2, cc2)
		}
		unpatch("init without the flag", after2, rec2)

		// kubeadm wrote the manifest anew from cc (an upgrade, or a control-plane join): konnect's value is
		// there, its annotations are not. A run without the flag puts kubeadm's own value back, and so does the
		// run on another node whose manifest kubeadm wrote from cc, after the first run changed the record.
		rewritten := after.DeepCopy()
		rewritten.Annotations = before.DeepCopy().Annotations
		offKubeadm := off
		offKubeadm.Kubeadm = rec
		after3 := rewritten.DeepCopy()
		if _, err := PatchPod(after3, offKubeadm); err != nil {
			t.Fatal(err)
		}
		if got := aggregatorRouting(t, after3); !slices.Equal(got, tc.back) {
			t.Errorf("%s: init without the flag on the manifest kubeadm wrote anew: %q, want %q", tc.name, got, tc.back)
		}
		cc3, rec3, _, err := RecordInClusterConfiguration(cc, rec, rewritten, after3, managedNames(off))
		if err != nil {
			t.Fatal(err)
		}
		if rec3.arg(aggregatorRoutingFlag) != nil || strings.Contains(cc3, aggregatorRoutingFlag) {
			t.Errorf("%s: init without the flag on the manifest kubeadm wrote anew: record %s:\n%s", tc.name, rec3, cc3)
		}
		unpatch("init without the flag on the manifest kubeadm wrote anew", after3, rec3)
		offKubeadm.Kubeadm = rec3
		other := rewritten.DeepCopy()
		if _, err := PatchPod(other, offKubeadm); err != nil {
			t.Fatal(err)
		}
		if got := aggregatorRouting(t, other); !slices.Equal(got, tc.back) {
			t.Errorf("%s: init without the flag on another node: %q, want %q (record %s)", tc.name, got, tc.back, rec3)
		}
		unpatch("reset on another node", rewritten, rec3)
	}
}

// A manifest that konnect patched without --kubeadm holds konnect's values, not kubeadm's: a later run with
// --kubeadm records every flag it set, with the values from before konnect, exactly as a first run with --kubeadm
// would, and removal and UnpatchPod (also on a manifest kubeadm wrote anew) put both back as they were.
func TestRecordAfterPatchWithoutKubeadm(t *testing.T) {
	users := strings.Replace(clusterConfiguration, "  - name: audit-log-maxage\n", "  - name: requestheader-uid-headers\n    value: X-My-Uid\n  - name: audit-log-maxage\n", 1)
	p := kubeadmPatch(t, nil)
	p.Optional = OptionalFlags
	p.Annotations = map[string]string{EgressConfigAnnotation: "abc"}
	for _, tc := range optionalFlagCases {
		manifest := func(tail []string) *corev1.Pod {
			pod := withCommandTail(t, tail)
			// The user's own client certificate, which the patch replaces.
			c := apiserverOf(t, pod)
			for i, tok := range c.Command {
				if strings.HasPrefix(tok, "--proxy-client-cert-file=") {
					c.Command[i] = "--proxy-client-cert-file=/etc/kubernetes/pki/users-client.crt"
				}
			}
			return pod
		}
		original, reset := manifest(tc.given), manifest(tc.back)
		direct := original.DeepCopy()
		if _, err := PatchPod(direct, p); err != nil {
			t.Fatal(err)
		}
		wantCC, wantRec, _, err := RecordInClusterConfiguration(users, KubeadmRecord{}, original, direct, managedNames(p))
		if err != nil {
			t.Fatal(err)
		}

		patched := original.DeepCopy() // konnect init without --kubeadm
		if _, err := PatchPod(patched, p); err != nil {
			t.Fatal(err)
		}
		after := patched.DeepCopy() // konnect init --kubeadm
		if _, err := PatchPod(after, p); err != nil {
			t.Fatal(err)
		}
		cc, rec, changed, err := RecordInClusterConfiguration(users, KubeadmRecord{}, patched, after, managedNames(p))
		if err != nil || !changed {
			t.Fatalf("%s: changed %v err %v", tc.name, changed, err)
		}
		if rec.String() != wantRec.String() {
			t.Errorf("%s: record %s, want %s", tc.name, rec, wantRec)
		}
		if differ, _ := clusterConfigChanged(cc, wantCC); differ {
			t.Errorf("%s: ClusterConfiguration:\n%s\nwant:\n%s", tc.name, cc, wantCC)
		}
		str := func(p *string) string {
			if p == nil {
				return "<nil>"
			}
			return *p
		}
		want := map[string][2]string{ // name: Previous, ManifestPrevious
			"egress-selector-config-file": {"<nil>", "<nil>"},
			"requestheader-uid-headers":   {"X-My-Uid", "<nil>"},
			"proxy-client-cert-file":      {"<nil>", "/etc/kubernetes/pki/users-client.crt"},
		}
		if len(tc.given) == 0 {
			want[aggregatorRoutingFlag] = [2]string{"<nil>", "<nil>"}
		} else if v := *boolFlagValue(apiserverOf(t, original), aggregatorRoutingFlag); !sameBool(v, "true") {
			want[aggregatorRoutingFlag] = [2]string{"<nil>", v}
		}
		for name, w := range want {
			a := rec.arg(name)
			if a == nil || str(a.Previous) != w[0] || str(a.ManifestPrevious) != w[1] {
				t.Errorf("%s: --%s: record %s, want previous %s, manifest previous %s", tc.name, name, rec, w[0], w[1])
			}
		}
		if len(rec.ExtraArgs) != len(want) {
			t.Errorf("%s: record %s, want %d flags", tc.name, rec, len(want))
		}

		back, _, err := RemoveFromClusterConfiguration(cc, rec)
		if err != nil {
			t.Fatal(err)
		}
		if differ, _ := clusterConfigChanged(users, back); differ {
			t.Errorf("%s: after removal:\n%s\nwant the original:\n%s", tc.name, back, users)
		}
		for _, rewritten := range []bool{false, true} {
			pod := after.DeepCopy()
			if rewritten {
				pod.Annotations = original.DeepCopy().Annotations
			}
			if _, err := UnpatchPod(pod, rec); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if !equality.Semantic.DeepEqual(pod, reset) {
				t.Errorf("%s (written anew: %v): after UnpatchPod:\n%s\nwant:\n%s", tc.name, rewritten, podYAML(pod), podYAML(reset))
			}
		}
	}
}

// After konnect reset --kubeadm on one node (the record is Removed), konnect init --kubeadm on another node,
// whose kube-apiserver.yaml kubeadm wrote from the ClusterConfiguration with konnect's flags, records the same
// flags as a first run: their values on that manifest are konnect's, not kubeadm's, whatever the record says now.
func TestRecordAfterResetOnAnotherNode(t *testing.T) {
	p := kubeadmPatch(t, nil)
	p.Optional = OptionalFlags
	before, after := patchedPair(t, p)
	cc, rec, _, err := RecordInClusterConfiguration(clusterConfiguration, KubeadmRecord{}, before, after, managedNames(p))
	if err != nil {
		t.Fatal(err)
	}
	back, _, err := RemoveFromClusterConfiguration(cc, rec)
	if err != nil {
		t.Fatal(err)
	}
	removed := rec
	removed.Removed = true

	// The other node's manifest, as kubeadm wrote it from cc: konnect's values, none of its annotations.
	rewritten := after.DeepCopy()
	rewritten.Annotations = before.DeepCopy().Annotations
	again := p
	again.Kubeadm = removed
	after2 := rewritten.DeepCopy()
	if _, err := PatchPod(after2, again); err != nil {
		t.Fatal(err)
	}
	cc2, rec2, _, err := RecordInClusterConfiguration(back, removed, rewritten, after2, managedNames(p))
	if err != nil {
		t.Fatal(err)
	}
	if rec2.String() != rec.String() {
		t.Errorf("record %s, want the first run's %s", rec2, rec)
	}
	if differ, _ := clusterConfigChanged(cc, cc2); differ {
		t.Errorf("ClusterConfiguration:\n%s\nwant the first run's:\n%s", cc2, cc)
	}
}

// An optional flag konnect released whose value the user then set in the ClusterConfiguration themselves is
// theirs: the record forgets it, and neither a patch that does not ask for it nor UnpatchPod takes the value
// kubeadm wrote from the ClusterConfiguration out of the manifest, though it is the value konnect had recorded.
func TestReleasedFlagTakenByTheUser(t *testing.T) {
	on, off := routingPatches(t)
	for _, tc := range optionalFlagCases {
		before := withCommandTail(t, tc.given)
		after := before.DeepCopy()
		if _, err := PatchPod(after, on); err != nil {
			t.Fatal(err)
		}
		cc, rec, _, err := RecordInClusterConfiguration(clusterConfiguration, KubeadmRecord{}, before, after, managedNames(on))
		if err != nil {
			t.Fatal(err)
		}
		after2 := after.DeepCopy()
		if _, err := PatchPod(after2, off); err != nil {
			t.Fatal(err)
		}
		cc2, rec2, _, err := RecordInClusterConfiguration(cc, rec, after, after2, managedNames(off))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(rec2.Released, func(a RecordedArg) bool { return a.Name == aggregatorRoutingFlag }) {
			continue // the flag was on before konnect: never konnect's
		}
		if kept, err := rec2.ForgetReclaimed(cc2); err != nil || kept.String() != rec2.String() {
			t.Errorf("%s: ClusterConfiguration as konnect left it: record %s, want %s (err %v)", tc.name, kept, rec2, err)
		}

		// The user turns the flag on in the ClusterConfiguration, and kubeadm writes the manifest from it.
		users := strings.Replace(cc2, "  - name: audit-log-maxage\n", "  - name: enable-aggregator-routing\n    value: \"true\"\n  - name: audit-log-maxage\n", 1)
		if users == cc2 {
			t.Fatalf("no audit-log-maxage in:\n%s", cc2)
		}
		rewritten := after.DeepCopy()
		rewritten.Annotations = before.DeepCopy().Annotations
		want := aggregatorRouting(t, rewritten)

		forgot, err := rec2.ForgetReclaimed(users)
		if err != nil {
			t.Fatal(err)
		}
		if len(forgot.Released) != 0 || len(forgot.ExtraArgs) != len(rec2.ExtraArgs) {
			t.Errorf("%s: record %s, want %s without Released", tc.name, forgot, rec2)
		}
		patchOff := off
		patchOff.Kubeadm = forgot
		after3 := rewritten.DeepCopy()
		if _, err := PatchPod(after3, patchOff); err != nil {
			t.Fatal(err)
		}
		if got := aggregatorRouting(t, after3); !slices.Equal(got, want) {
			t.Errorf("%s: init without the flag: %q, want the user's %q", tc.name, got, want)
		}
		cc3, rec3, _, err := RecordInClusterConfiguration(users, rec2, rewritten, after3, managedNames(off))
		if err != nil {
			t.Fatal(err)
		}
		if len(rec3.Released) != 0 || !strings.Contains(cc3, aggregatorRoutingFlag) {
			t.Errorf("%s: init without the flag: record %s:\n%s", tc.name, rec3, cc3)
		}
		for _, r := range []KubeadmRecord{forgot, rec3} {
			pod := after3.DeepCopy()
			if _, err := UnpatchPod(pod, r); err != nil {
				t.Fatal(err)
			}
			if got := aggregatorRouting(t, pod); !slices.Equal(got, want) {
				t.Errorf("%s: reset with record %s: %q, want the user's %q", tc.name, r, got, want)
			}
		}
	}
}

// After a reset (a Removed record), the user gives a flag konnect had set, and kubeadm had not, a value of
// their own in the ClusterConfiguration, and kubeadm writes the manifest with it: the next record keeps that
// value as the manifest's own, and a reset after it leaves it, as it is not konnect's.
func TestRecordAfterResetKeepsTheUsersValue(t *testing.T) {
	p := kubeadmPatch(t, nil)
	before, after := patchedPair(t, p)
	cc, rec, _, err := RecordInClusterConfiguration(clusterConfiguration, KubeadmRecord{}, before, after, managedNames(p))
	if err != nil {
		t.Fatal(err)
	}
	var name string
	for _, a := range rec.ExtraArgs {
		if a.ManifestPrevious == nil && !slices.Contains(OptionalFlags, a.Name) {
			name = a.Name
			break
		}
	}
	if name == "" {
		t.Fatalf("record %s has no flag that kubeadm's manifest lacked", rec)
	}
	back, _, err := RemoveFromClusterConfiguration(cc, rec)
	if err != nil {
		t.Fatal(err)
	}
	removed := rec
	removed.Removed = true

	const users = "X-Users-Own-Uid"
	rewritten := before.DeepCopy()
	c, err := apiserverContainer(rewritten)
	if err != nil {
		t.Fatal(err)
	}
	setFlag(c, Flag{name, users})
	again := p
	again.Kubeadm = removed
	after2 := rewritten.DeepCopy()
	if _, err := PatchPod(after2, again); err != nil {
		t.Fatal(err)
	}
	_, rec2, _, err := RecordInClusterConfiguration(back, removed, rewritten, after2, managedNames(p))
	if err != nil {
		t.Fatal(err)
	}
	if a := rec2.arg(name); a == nil || a.ManifestPrevious == nil || *a.ManifestPrevious != users {
		t.Fatalf("record %s: --%s's manifest value before konnect is not the user's %s", rec2, name, users)
	}
	reset := after2.DeepCopy()
	if _, err := UnpatchPod(reset, rec2); err != nil {
		t.Fatal(err)
	}
	rc, err := apiserverContainer(reset)
	if err != nil {
		t.Fatal(err)
	}
	if v := managedValue(rc, name); v == nil || *v != users {
		t.Errorf("after reset --%s is %v, want the user's %s", name, v, users)
	}
}

// routingPatches are kubeadm's patch with --enable-aggregator-routing (on) and without it (off), the flag
// optional in both, as konnect init makes them.
func routingPatches(t *testing.T) (on, off ManifestPatch) {
	t.Helper()
	on = kubeadmPatch(t, nil)
	on.Optional = OptionalFlags
	off = kubeadmPatch(t, func(f *APIServerFlags) { f.EnableAggregatorRouting = false })
	off.Optional = OptionalFlags
	return on, off
}
