package kubeapiserver

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// kubeadm keeps the control plane's configuration in the ClusterConfiguration of the ConfigMap
// kube-system/kubeadm-config, and writes kube-apiserver.yaml anew from it on `kubeadm upgrade apply`,
// `kubeadm upgrade node` and `kubeadm join --control-plane`. What konnect changes in kube-apiserver must be
// recorded there (apiServer.extraArgs, apiServer.extraVolumes), or the next of these drops it.
const (
	KubeadmConfigNamespace = "kube-system"
	KubeadmConfigName      = "kubeadm-config"
	KubeadmConfigKey       = "ClusterConfiguration"
	// KubeadmRecordAnnotation, on the kubeadm-config ConfigMap, holds the KubeadmRecord of what konnect put in
	// the ClusterConfiguration. kubeadm keeps the ConfigMap's metadata when it updates the ClusterConfiguration.
	KubeadmRecordAnnotation = "konnect.dev/kubeadm"
	kubeadmAPIVersion       = "kubeadm.k8s.io/v1beta4"
)

// KubeadmRecord is what konnect added to the ClusterConfiguration's apiServer, with what was there before, so
// that it can be taken out again. It is also how kube-apiserver.yaml is put back (UnpatchPod).
type KubeadmRecord struct {
	ExtraArgs []RecordedArg `json:"extraArgs,omitempty"`
	// ExtraVolumes are the names of konnect's hostPath volumes in apiServer.extraVolumes.
	ExtraVolumes []string `json:"extraVolumes,omitempty"`
	// Released are the optional flags (OptionalFlags) that konnect recorded and a later run no longer set, with
	// the values konnect had recorded: the ClusterConfiguration has its own value back, but a manifest that
	// kubeadm wrote before, on this node or another, still carries konnect's. A patch or UnpatchPod puts
	// ManifestPrevious back on such a manifest (ReleasedValue). One to which the user gives another value in
	// the ClusterConfiguration since is theirs, and forgotten (ForgetReclaimed).
	Released []RecordedArg `json:"released,omitempty"`
	// Removed is set once konnect reset has put the ClusterConfiguration back; the other control-plane nodes'
	// resets still read the record to put their kube-apiserver.yaml back.
	Removed bool `json:"removed,omitempty"`
}

// RecordedArg is one kube-apiserver flag konnect set through apiServer.extraArgs.
type RecordedArg struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	// Previous is the ClusterConfiguration's own extraArgs value before konnect; nil when it had none.
	Previous *string `json:"previous,omitempty"`
	// ManifestPrevious is the flag's value in kube-apiserver.yaml before konnect, as kubeadm writes it without
	// konnect's extraArgs; nil when kubeadm does not set the flag.
	ManifestPrevious *string `json:"manifestPrevious,omitempty"`
}

// ParseKubeadmRecord reads the annotation's value; empty means no record.
func ParseKubeadmRecord(s string) (KubeadmRecord, error) {
	var r KubeadmRecord
	if strings.TrimSpace(s) == "" {
		return r, nil
	}
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return r, fmt.Errorf("annotation %s: %w", KubeadmRecordAnnotation, err)
	}
	return r, nil
}

// String is the annotation's value.
func (r KubeadmRecord) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

func (r *KubeadmRecord) arg(name string) *RecordedArg {
	for i := range r.ExtraArgs {
		if r.ExtraArgs[i].Name == name {
			return &r.ExtraArgs[i]
		}
	}
	return nil
}

// ReleasedValue returns, for the optional flag name that a manifest kubeadm wrote holds with value (from the
// ClusterConfiguration, the pod's own records lost), the value kubeadm gives it without konnect, when konnect
// recorded value for it there (in ExtraArgs or Released); ok is false when the value is not konnect's.
func (r KubeadmRecord) ReleasedValue(name, value string) (previous *string, ok bool) {
	if !slices.Contains(OptionalFlags, name) {
		return nil, false
	}
	for _, list := range [][]RecordedArg{r.ExtraArgs, r.Released} {
		for _, a := range list {
			if a.Name == name && sameValue(name, a.Value, value) &&
				(a.ManifestPrevious == nil || !sameValue(name, *a.ManifestPrevious, value)) {
				return a.ManifestPrevious, true
			}
		}
	}
	return nil, false
}

// ForgetReclaimed returns r without the Released flags to which clusterConfig (the ClusterConfiguration YAML of
// kubeadm-config) no longer gives the value konnect put back (Previous): the user set them there since, and a
// manifest kubeadm writes from it holds the user's value, even where that is the value konnect had recorded.
// Read with the ClusterConfiguration, the record then leaves such a flag alone in a patch and in UnpatchPod.
func (r KubeadmRecord) ForgetReclaimed(clusterConfig string) (KubeadmRecord, error) {
	if len(r.Released) == 0 {
		return r, nil // nothing to read the ClusterConfiguration for, whatever its version
	}
	cc, err := decodeClusterConfiguration(clusterConfig)
	if err != nil {
		return r, err
	}
	return r.forgetReclaimed(listAt(mapAt(cc, "apiServer"), "extraArgs")), nil
}

func (r KubeadmRecord) forgetReclaimed(args []any) KubeadmRecord {
	var kept []RecordedArg
	for _, a := range r.Released {
		v, ok := argValue(args, a.Name)
		if ok == (a.Previous != nil) && (!ok || sameValue(a.Name, v, *a.Previous)) {
			kept = append(kept, a)
		}
	}
	r.Released = kept
	return r
}

// konnectVolume reports whether name is one of the hostPath volumes PatchPod owns.
func konnectVolume(name string) bool {
	return name == udsVolume || name == egressConfigVolume || isNumbered(name, certsVolume, 0)
}

// RecordInClusterConfiguration records in clusterConfig (the ClusterConfiguration YAML of kubeadm-config) what
// the patch changed in kube-apiserver: before is kube-apiserver.yaml as it is, after as the patch makes it, and
// managed names the flags the patch sets (an optional flag it does not set is not konnect's). A managed flag is
// recorded when after gives it a value that before did not have without konnect (its flags put back as
// UnpatchPod puts them back: a manifest konnect patched without --kubeadm holds konnect's values, not
// kubeadm's), or when rec already holds it (a node that joined with konnect's extraArgs has them before the
// patch); one rec holds that after no longer has, or that is no longer managed, is taken out again, putting
// back what the ClusterConfiguration had, and an optional one among them is kept in Released, until the user
// gives it another value in the ClusterConfiguration (ForgetReclaimed). Every konnect
// volume of after is recorded, and one of rec that after lacks is taken out. It returns the new
// ClusterConfiguration and record, and whether the ClusterConfiguration changed.
func RecordInClusterConfiguration(clusterConfig string, rec KubeadmRecord, before, after *corev1.Pod, managed []string) (string, KubeadmRecord, bool, error) {
	cc, err := decodeClusterConfiguration(clusterConfig)
	if err != nil {
		return "", rec, false, err
	}
	api := mapAt(cc, "apiServer")
	args := listAt(api, "extraArgs")
	rec = rec.forgetReclaimed(args)
	// A Removed record no longer describes the ClusterConfiguration, but still the manifests kubeadm wrote
	// from it before the reset, on this node or another: it puts those back to kubeadm's values below.
	onPod := rec
	if rec.Removed {
		rec = KubeadmRecord{}
	}
	// What kubeadm sets is the manifest without konnect: before may carry a patch by konnect already (an
	// earlier run without --kubeadm, or kubeadm writing it from konnect's extraArgs), whose values are
	// konnect's, not kubeadm's.
	kubeadms := before.DeepCopy()
	bc, err := apiserverContainer(kubeadms)
	if err != nil {
		return "", rec, false, err
	}
	if _, _, err := unpatchFlags(kubeadms, bc, onPod); err != nil {
		return "", rec, false, err
	}
	ac, err := apiserverContainer(after)
	if err != nil {
		return "", rec, false, err
	}
	var out KubeadmRecord
	for _, name := range managed {
		av := managedValue(ac, name)
		if av == nil || out.arg(name) != nil {
			continue
		}
		value := *av
		bv := managedValue(bc, name)
		old := rec.arg(name)
		if old == nil && bv != nil && sameValue(name, *bv, value) {
			continue // kubeadm sets it so already
		}
		if old != nil && old.ManifestPrevious != nil && sameValue(name, *old.ManifestPrevious, value) {
			// No longer konnect's: an optional flag the patch no longer sets has its value from before konnect.
			continue
		}
		ra := RecordedArg{Name: name, Value: value}
		if old != nil {
			ra.Previous, ra.ManifestPrevious = old.Previous, old.ManifestPrevious
		} else {
			if v, ok := argValue(args, name); ok {
				ra.Previous = &v
			}
			ra.ManifestPrevious = bv
		}
		args = setArg(args, name, &value)
		out.ExtraArgs = append(out.ExtraArgs, ra)
	}
	for _, old := range rec.ExtraArgs {
		if out.arg(old.Name) == nil {
			args = setArg(args, old.Name, old.Previous)
			if slices.Contains(OptionalFlags, old.Name) {
				out.Released = append(out.Released, old)
			}
		}
	}
	for _, old := range rec.Released {
		if out.arg(old.Name) == nil && !slices.ContainsFunc(out.Released, func(a RecordedArg) bool { return a.Name == old.Name }) {
			out.Released = append(out.Released, old)
		}
	}
	vols := listAt(api, "extraVolumes")
	for _, name := range rec.ExtraVolumes {
		vols = removeNamed(vols, name)
	}
	for _, v := range after.Spec.Volumes {
		if !konnectVolume(v.Name) || v.HostPath == nil {
			continue
		}
		m := map[string]any{"name": v.Name, "hostPath": v.HostPath.Path, "mountPath": v.HostPath.Path}
		for _, vm := range ac.VolumeMounts {
			if vm.Name == v.Name {
				m["mountPath"] = vm.MountPath
				m["readOnly"] = vm.ReadOnly
			}
		}
		if v.HostPath.Type != nil {
			m["pathType"] = string(*v.HostPath.Type)
		}
		vols = append(removeNamed(vols, v.Name), m)
		out.ExtraVolumes = append(out.ExtraVolumes, v.Name)
	}
	setList(api, "extraArgs", args)
	setList(api, "extraVolumes", vols)
	cc["apiServer"] = api
	newCC, err := encodeClusterConfiguration(cc)
	if err != nil {
		return "", rec, false, err
	}
	changed, err := clusterConfigChanged(clusterConfig, newCC)
	return newCC, out, changed, err
}

// managedValue is the value kube-apiserver takes for the managed flag name in c (the last occurrence's), or nil
// when c lacks it. An optional flag is a boolean one: "true" when it has no value.
func managedValue(c *corev1.Container, name string) *string {
	if slices.Contains(OptionalFlags, name) {
		return boolFlagValue(c, name)
	}
	vs := lookupFlag(c, name)
	if len(vs) == 0 {
		return nil
	}
	return &vs[len(vs)-1]
}

// sameValue reports whether a and b are the same value of the managed flag name: an optional flag's are compared
// as booleans ("1" and "true" are).
func sameValue(name, a, b string) bool {
	if slices.Contains(OptionalFlags, name) {
		return sameBool(a, b)
	}
	return a == b
}

// RemoveFromClusterConfiguration takes what rec recorded out of clusterConfig, putting back the values the
// ClusterConfiguration had before konnect. A record already Removed changes nothing.
func RemoveFromClusterConfiguration(clusterConfig string, rec KubeadmRecord) (string, bool, error) {
	if rec.Removed {
		return clusterConfig, false, nil
	}
	cc, err := decodeClusterConfiguration(clusterConfig)
	if err != nil {
		return "", false, err
	}
	api := mapAt(cc, "apiServer")
	args := listAt(api, "extraArgs")
	for _, a := range rec.ExtraArgs {
		args = setArg(args, a.Name, a.Previous)
	}
	vols := listAt(api, "extraVolumes")
	for _, name := range rec.ExtraVolumes {
		vols = removeNamed(vols, name)
	}
	setList(api, "extraArgs", args)
	setList(api, "extraVolumes", vols)
	cc["apiServer"] = api
	out, err := encodeClusterConfiguration(cc)
	if err != nil {
		return "", false, err
	}
	changed, err := clusterConfigChanged(clusterConfig, out)
	return out, changed, err
}

// UnpatchPod takes konnect out of a kube-apiserver pod, changing only what konnect changed. The flags and volumes
// the pod's PodRecordAnnotation recorded get back their values from before konnect (or go); then the flags rec
// (kubeadm's record) recorded get the values kubeadm gives them without konnect (or go), the flags konnect added
// on request (AddedFlagsAnnotation) go, and so does --egress-selector-config-file where neither record has it but
// the pod carries konnect's EgressConfigAnnotation (a patch by a konnect that kept no PodRecord). Konnect's
// volumes that no record holds go only from a pod that carries a mark of konnect; one that a flag left on the
// pod still reads from is an error, never a kube-apiserver that cannot start. Konnect's annotations go too. It
// reports whether pod changed; on an error pod is left as it was.
func UnpatchPod(out *corev1.Pod, rec KubeadmRecord) (bool, error) {
	pod := out.DeepCopy()
	c, err := apiserverContainer(pod)
	if err != nil {
		return false, err
	}
	podRec, recorded, err := unpatchFlags(pod, c, rec)
	if err != nil {
		return false, err
	}
	// kubeadm's record wins: kubeadm may have written the manifest anew since, and then a later patch recorded
	// konnect's own earlier values as the pod's.
	for i, v := range podRec.Volumes {
		if slices.Contains(rec.ExtraVolumes, v.Name) {
			podRec.Volumes[i].Previous, podRec.Volumes[i].PreviousMount = nil, nil
		}
	}
	_, egressMarked := pod.Annotations[EgressConfigAnnotation]
	_, addedMarked := pod.Annotations[AddedFlagsAnnotation]
	// Without a mark of konnect, a volume of one of its names may be the user's: the Kubernetes documentation's
	// own Konnectivity set-up uses konnectivity-uds and egress-selector-config.
	marked := recorded || egressMarked || addedMarked || len(rec.ExtraArgs) > 0 || len(rec.ExtraVolumes) > 0
	for _, v := range slices.Clone(pod.Spec.Volumes) {
		if !konnectVolume(v.Name) || !(podRec.volume(v.Name) || marked || isNumbered(v.Name, certsVolume, 0)) {
			continue
		}
		if flag, path, ok := flagUsing(c, v.Name); ok && !podRec.restores(v.Name) {
			return false, fmt.Errorf("volume %q is konnect's, but --%s still reads %s through it, and konnect has no record of that flag's value before it (annotation %s; with kubeadm, konnect reset --kubeadm reads kubeadm's record): put the flag back as it was before konnect, then run konnect reset again",
				v.Name, flag, path, PodRecordAnnotation)
		}
	}
	for _, v := range slices.Clone(pod.Spec.Volumes) {
		if konnectVolume(v.Name) && !podRec.volume(v.Name) && (marked || isNumbered(v.Name, certsVolume, 0)) {
			removeVolume(pod, c, v.Name)
		}
	}
	for _, v := range podRec.Volumes {
		restoreVolume(pod, c, v)
	}
	delete(pod.Annotations, AddedFlagsAnnotation)
	delete(pod.Annotations, EgressConfigAnnotation)
	delete(pod.Annotations, PodRecordAnnotation)
	if equality.Semantic.DeepEqual(out, pod) {
		return false, nil
	}
	*out = *pod
	return true, nil
}

// unpatchFlags gives the flags of c, pod's kube-apiserver container, their values from before konnect, as
// UnpatchPod does, and returns pod's PodRecord and whether it had one. Volumes and annotations stay.
func unpatchFlags(pod *corev1.Pod, c *corev1.Container, rec KubeadmRecord) (PodRecord, bool, error) {
	podRec, recorded, err := readPodRecord(pod)
	if err != nil {
		return podRec, false, err
	}
	for _, f := range podRec.Flags {
		if !f.Unknown {
			restoreFlag(c, f.Name, f.Previous)
		}
	}
	// Only where the manifest still holds konnect's value: one that kubeadm wrote anew with a value the user
	// gave the ClusterConfiguration after a reset (a Removed record) is the user's.
	for _, a := range rec.ExtraArgs {
		if v := managedValue(c, a.Name); v != nil && sameValue(a.Name, *v, a.Value) {
			restoreFlag(c, a.Name, a.ManifestPrevious)
		}
	}
	for _, a := range rec.Released {
		if v := boolFlagValue(c, a.Name); v != nil && !podRec.flag(a.Name) && rec.arg(a.Name) == nil {
			if previous, ok := rec.ReleasedValue(a.Name, *v); ok {
				restoreFlag(c, a.Name, previous)
			}
		}
	}
	if _, marked := pod.Annotations[EgressConfigAnnotation]; marked && !podRec.flag(egressSelectorFlag) && rec.arg(egressSelectorFlag) == nil {
		editFlag(c, egressSelectorFlag, false, "")
	}
	if v := pod.Annotations[AddedFlagsAnnotation]; v != "" {
		for _, name := range strings.Split(v, ",") {
			editFlag(c, name, true, "")
		}
	}
	return podRec, recorded, nil
}

// restoreFlag gives flag name of c the value previous, or removes it when previous is nil. An optional flag is
// a boolean one: it never takes the next argument as its value.
func restoreFlag(c *corev1.Container, name string, previous *string) {
	boolean := slices.Contains(OptionalFlags, name)
	switch {
	case previous == nil:
		editFlag(c, name, boolean, "")
	case boolean && editFlag(c, name, true, Flag{name, *previous}.String()):
	default:
		setFlag(c, Flag{name, *previous})
	}
}

// UnpatchManifestFile takes konnect out of the kube-apiserver static pod manifest at path (UnpatchPod), keeping a
// backup and writing atomically as PatchManifestFile does.
func UnpatchManifestFile(path string, rec KubeadmRecord, backupDir string) (PatchResult, error) {
	return editManifestFile(path, backupDir, nil, func(data []byte) ([]byte, bool, error) {
		pod, err := DecodePod(data, path)
		if err != nil {
			return nil, false, err
		}
		changed, err := UnpatchPod(pod, rec)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", path, err)
		}
		if !changed {
			return data, false, nil
		}
		return encodePod(pod, path)
	})
}

func decodeClusterConfiguration(s string) (map[string]any, error) {
	var cc map[string]any
	if err := yaml.Unmarshal([]byte(s), &cc); err != nil {
		return nil, fmt.Errorf("ClusterConfiguration: %w", err)
	}
	if cc == nil {
		return nil, fmt.Errorf("ClusterConfiguration is empty")
	}
	if v, _ := cc["apiVersion"].(string); v != kubeadmAPIVersion {
		return nil, fmt.Errorf("ClusterConfiguration is %q; konnect records its flags in a %s one (kubeadm 1.31 and later; kubeadm upgrade converts an older one)", v, kubeadmAPIVersion)
	}
	if k, _ := cc["kind"].(string); k != "ClusterConfiguration" {
		return nil, fmt.Errorf("ClusterConfiguration has kind %q", k)
	}
	return cc, nil
}

func encodeClusterConfiguration(cc map[string]any) (string, error) {
	b, err := yaml.Marshal(cc)
	if err != nil {
		return "", fmt.Errorf("ClusterConfiguration: %w", err)
	}
	return string(b), nil
}

// clusterConfigChanged compares two ClusterConfigurations by content, so that formatting alone is no change.
func clusterConfigChanged(a, b string) (bool, error) {
	var x, y any
	if err := yaml.Unmarshal([]byte(a), &x); err != nil {
		return false, err
	}
	if err := yaml.Unmarshal([]byte(b), &y); err != nil {
		return false, err
	}
	xj, _ := json.Marshal(x)
	yj, _ := json.Marshal(y)
	return string(xj) != string(yj), nil
}

func mapAt(m map[string]any, key string) map[string]any {
	if v, ok := m[key].(map[string]any); ok {
		return v
	}
	return map[string]any{}
}

func listAt(m map[string]any, key string) []any {
	v, _ := m[key].([]any)
	return v
}

func setList(m map[string]any, key string, l []any) {
	if len(l) == 0 {
		delete(m, key)
		return
	}
	m[key] = l
}

// argValue is the value of the last extraArgs entry called name.
func argValue(args []any, name string) (string, bool) {
	v, found := "", false
	for _, a := range args {
		if m, ok := a.(map[string]any); ok && m["name"] == name {
			v, _ = m["value"].(string)
			found = true
		}
	}
	return v, found
}

// setArg replaces every extraArgs entry called name with one of value, in the place of the first, or removes them
// all when value is nil.
func setArg(args []any, name string, value *string) []any {
	var out []any
	placed := false
	for _, a := range args {
		m, ok := a.(map[string]any)
		if !ok || m["name"] != name {
			out = append(out, a)
			continue
		}
		if value != nil && !placed {
			out = append(out, map[string]any{"name": name, "value": *value})
			placed = true
		}
	}
	if value != nil && !placed {
		out = append(out, map[string]any{"name": name, "value": *value})
	}
	return out
}

func removeNamed(list []any, name string) []any {
	var out []any
	for _, e := range list {
		if m, ok := e.(map[string]any); ok && m["name"] == name {
			continue
		}
		out = append(out, e)
	}
	return out
}
