package kubeapiserver

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// PodRecordAnnotation holds, on a patched kube-apiserver pod, the PodRecord of what PatchPod changed, so that
// UnpatchPod can put the pod back as it was before konnect whatever directory konnect init wrote into, without
// kubeadm's record. kubeadm drops it when it writes the manifest anew; its own record (KubeadmRecord) covers
// that case.
const PodRecordAnnotation = "konnect.dev/patch-record"

// PodRecord is what PatchPod changed in a kube-apiserver pod, with what was there before. An entry is written
// the first time konnect changes a flag or volume and kept by later patches, so it always holds the value from
// before konnect. The exception is an optional flag (ManifestPatch.Optional) whose value konnect replaced: a
// patch that no longer sets it puts the value back and drops the entry.
type PodRecord struct {
	Flags   []RecordedFlag   `json:"flags,omitempty"`
	Volumes []RecordedVolume `json:"volumes,omitempty"`
}

// RecordedFlag is a flag of ManifestPatch.Flags that PatchPod changed. An optional flag is recorded only when
// PatchPod replaced the value the pod had (AddedFlagsAnnotation records one it added).
type RecordedFlag struct {
	Name string `json:"name"`
	// Previous is the flag's value before konnect; nil when the pod did not have the flag.
	Previous *string `json:"previous,omitempty"`
	// Unknown: a konnect that kept no record (before this annotation existed) had set the flag, so its value
	// before konnect is not known. UnpatchPod leaves it as it is.
	Unknown bool `json:"unknown,omitempty"`
}

// RecordedVolume is one of konnect's volumes (konnectVolume) that PatchPod changed.
type RecordedVolume struct {
	Name string `json:"name"`
	// Previous and PreviousMount are the pod's own volume of that name and the kube-apiserver container's mount
	// of it before konnect; Previous is nil when konnect added the volume.
	Previous      *corev1.Volume      `json:"previous,omitempty"`
	PreviousMount *corev1.VolumeMount `json:"previousMount,omitempty"`
}

// writePodRecord sets pod's PodRecordAnnotation to r.
func writePodRecord(pod *corev1.Pod, r PodRecord) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[PodRecordAnnotation] = string(data)
	return nil
}

// readPodRecord reads pod's PodRecordAnnotation; ok is false when it has none.
func readPodRecord(pod *corev1.Pod) (r PodRecord, ok bool, err error) {
	s := pod.Annotations[PodRecordAnnotation]
	if strings.TrimSpace(s) == "" {
		return r, false, nil
	}
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return r, false, fmt.Errorf("annotation %s: %w", PodRecordAnnotation, err)
	}
	return r, true, nil
}

func (r PodRecord) flag(name string) bool {
	return slices.ContainsFunc(r.Flags, func(f RecordedFlag) bool { return f.Name == name })
}

func (r PodRecord) volume(name string) bool {
	return slices.ContainsFunc(r.Volumes, func(v RecordedVolume) bool { return v.Name == name })
}

// restores reports whether the record puts back a volume of the pod's own called name, rather than removing it.
func (r PodRecord) restores(name string) bool {
	return slices.ContainsFunc(r.Volumes, func(v RecordedVolume) bool { return v.Name == name && v.Previous != nil })
}

// podSnapshot is what of a kube-apiserver pod PatchPod may change and PodRecord records.
type podSnapshot struct {
	flags   map[string]*string
	volumes map[string]volumeAndMount
}

type volumeAndMount struct {
	volume *corev1.Volume
	mount  *corev1.VolumeMount
}

// snapshot takes the values of the flags called names, and konnect's volumes with c's mounts of them.
func snapshot(pod *corev1.Pod, c *corev1.Container, names []string) podSnapshot {
	s := podSnapshot{flags: map[string]*string{}, volumes: map[string]volumeAndMount{}}
	for _, name := range names {
		s.flags[name] = flagValue(c, name)
	}
	for i := range pod.Spec.Volumes {
		if v := &pod.Spec.Volumes[i]; konnectVolume(v.Name) {
			s.volumes[v.Name] = volumeAndMount{v.DeepCopy(), mountOf(c, v.Name)}
		}
	}
	return s
}

// flagValue is the value kube-apiserver takes for flag name in c: the last one, or for a list all of them.
func flagValue(c *corev1.Container, name string) *string {
	vs := lookupFlag(c, name)
	if len(vs) == 0 {
		return nil
	}
	v := vs[len(vs)-1]
	if sharedLists[name] {
		v = strings.Join(vs, ",")
	}
	return &v
}

func mountOf(c *corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return c.VolumeMounts[i].DeepCopy()
		}
	}
	return nil
}

// unrecorded reports whether pod was patched by a konnect that kept no PodRecord: it carries konnect's marks
// but no record. What such a pod has of konnect's is not what it had before konnect.
func unrecorded(pod *corev1.Pod) bool {
	_, egress := pod.Annotations[EgressConfigAnnotation]
	_, added := pod.Annotations[AddedFlagsAnnotation]
	_, recorded := pod.Annotations[PodRecordAnnotation]
	return (egress || added) && !recorded
}

// recordPatch adds to pod's PodRecordAnnotation each flag and volume that differs from before, unless the
// record holds it already, and each optional flag (values before the patch in optional) that now holds another
// value as a boolean. byOlder says the pod was unrecorded before this patch: its konnect-named volumes are
// then konnect's, and the flags it had set are recorded as Unknown whether this patch changed them or not,
// so that neither a later patch nor UnpatchPod takes an older konnect's value for the pod's own. The
// egress selector flag is the exception: the mark says konnect added it, as UnpatchPod assumes. An optional flag's
// replaced value is the pod's own even then: no konnect ever turned one off.
func recordPatch(pod *corev1.Pod, c *corev1.Container, before podSnapshot, optional map[string]*string, byOlder bool) error {
	rec, _, err := readPodRecord(pod)
	if err != nil {
		return err
	}
	n := len(rec.Flags) + len(rec.Volumes)
	names := make([]string, 0, len(before.flags))
	for name := range before.flags {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		prev := before.flags[name]
		if rec.flag(name) {
			continue
		}
		switch {
		case byOlder && prev != nil && name != egressSelectorFlag:
			rec.Flags = append(rec.Flags, RecordedFlag{Name: name, Unknown: true})
		case byOlder && name == egressSelectorFlag:
			rec.Flags = append(rec.Flags, RecordedFlag{Name: name})
		case !equality.Semantic.DeepEqual(prev, flagValue(c, name)):
			rec.Flags = append(rec.Flags, RecordedFlag{Name: name, Previous: prev})
		}
	}
	names = names[:0]
	for name := range optional {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		prev, now := optional[name], boolFlagValue(c, name)
		if prev != nil && now != nil && !sameBool(*prev, *now) && !rec.flag(name) {
			rec.Flags = append(rec.Flags, RecordedFlag{Name: name, Previous: prev})
		}
	}
	after := snapshot(pod, c, nil)
	var vols []string
	for name := range before.volumes {
		vols = append(vols, name)
	}
	for name := range after.volumes {
		if _, ok := before.volumes[name]; !ok {
			vols = append(vols, name)
		}
	}
	slices.Sort(vols)
	for _, name := range vols {
		b, a := before.volumes[name], after.volumes[name]
		same := equality.Semantic.DeepEqual(b.volume, a.volume) && equality.Semantic.DeepEqual(b.mount, a.mount)
		if same || rec.volume(name) {
			continue
		}
		if byOlder {
			b = volumeAndMount{} // konnect's own, from before the record
		}
		rec.Volumes = append(rec.Volumes, RecordedVolume{Name: name, Previous: b.volume, PreviousMount: b.mount})
	}
	if len(rec.Flags)+len(rec.Volumes) == n {
		return nil
	}
	return writePodRecord(pod, rec)
}

// restoreVolume puts back the volume rv recorded, with c's mount of it, in their places, or removes them when
// konnect added the volume.
func restoreVolume(pod *corev1.Pod, c *corev1.Container, rv RecordedVolume) {
	vi := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == rv.Name })
	switch {
	case rv.Previous == nil && vi >= 0:
		pod.Spec.Volumes = slices.Delete(pod.Spec.Volumes, vi, vi+1)
	case rv.Previous != nil && vi >= 0:
		pod.Spec.Volumes[vi] = *rv.Previous
	case rv.Previous != nil:
		pod.Spec.Volumes = append(pod.Spec.Volumes, *rv.Previous)
	}
	mi := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == rv.Name })
	switch {
	case rv.PreviousMount == nil && mi >= 0:
		c.VolumeMounts = slices.Delete(c.VolumeMounts, mi, mi+1)
	case rv.PreviousMount != nil && mi >= 0:
		c.VolumeMounts[mi] = *rv.PreviousMount
	case rv.PreviousMount != nil:
		c.VolumeMounts = append(c.VolumeMounts, *rv.PreviousMount)
	}
}

// flagUsing returns a flag of c whose value names a path inside the mount of volume name, so that removing the
// volume would leave kube-apiserver unable to read it; ok is false when there is none.
func flagUsing(c *corev1.Container, name string) (flag, path string, ok bool) {
	m := mountOf(c, name)
	if m == nil {
		return "", "", false
	}
	mp := filepath.Clean(m.MountPath)
	cmd, args := flagLists(c)
	for _, list := range [][]string{cmd, args} {
		for i, tok := range list {
			if !strings.HasPrefix(tok, "--") {
				continue
			}
			f, v, found := strings.Cut(strings.TrimPrefix(tok, "--"), "=")
			if !found && i+1 < len(list) && !strings.HasPrefix(list[i+1], "-") {
				v = list[i+1]
			}
			for _, p := range strings.Split(v, ",") {
				if !filepath.IsAbs(p) {
					continue
				}
				if p = filepath.Clean(p); p == mp || strings.HasPrefix(p, strings.TrimSuffix(mp, "/")+"/") {
					return f, p, true
				}
			}
		}
	}
	return "", "", false
}
