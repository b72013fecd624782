package kubeapiserver

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
)

// DefaultAPIServerManifest is where kubeadm writes the kube-apiserver static pod.
const DefaultAPIServerManifest = "/etc/kubernetes/manifests/kube-apiserver.yaml"

// Volume names this package owns in the kube-apiserver pod. A volume with one of these names is updated in
// place on a later run, so changing a path moves the mount instead of adding a second one.
const (
	udsVolume          = "konnectivity-uds"
	egressConfigVolume = "egress-selector-config"
	certsVolume        = "konnect-pki"
)

// ManifestPatch is what PatchPod sets on a kube-apiserver static pod.
type ManifestPatch struct {
	// Flags are set on the kube-apiserver container: an existing flag of the same name gets the new value
	// in place (duplicates of it are dropped), a missing one is appended, and every other argument keeps
	// its value and position. The requestheader lists are merged, not replaced (sharedLists).
	Flags []Flag
	// UDSDir is the directory of the Konnectivity server's unix socket (SelectorConfig.UDSDir); it is
	// mounted read-only, since connecting to a socket needs no write access to its file system, so that
	// kube-apiserver cannot replace the socket the server listens on. Empty with --transport tcp.
	UDSDir string
	// Files are further files kube-apiserver must read, such as the TLS files of a TCP egress selector
	// (SelectorConfig.Files). The files named by *-file flags in Flags are always included.
	Files []string
	// Optional names the boolean flags konnect sets only on request (--enable-aggregator-routing). One that
	// this patch adds to a manifest without it is recorded in AddedFlagsAnnotation; one recorded there that a
	// later patch does not set is taken out again. One the manifest had with another value (=false) is
	// recorded in PodRecordAnnotation, and a later patch that does not set it puts that value back. A flag the
	// manifest had on already stays.
	Optional []string
	// Kubeadm is kubeadm's record, with --kubeadm. An optional flag this patch does not set, and that neither
	// AddedFlagsAnnotation nor PodRecordAnnotation holds (kubeadm wrote the manifest anew from a
	// ClusterConfiguration with konnect's value), gets back the value kubeadm gives it without konnect, when
	// it holds the value konnect recorded (KubeadmRecord.ReleasedValue).
	Kubeadm KubeadmRecord
	// Annotations are set on the pod. A changed annotation changes the static pod, so kubelet restarts
	// kube-apiserver: that is how a new egress selector configuration, which kube-apiserver reads only when
	// it starts, takes effect (EgressConfigAnnotation).
	Annotations map[string]string
	// BackupDir is where PatchManifestFile keeps the original manifest. Empty means next to it, as a hidden
	// file: kubelet ignores files whose names start with a dot, so the backup never runs as a second pod.
	BackupDir string
	// Now stamps the backup's name; nil means time.Now.
	Now func() time.Time
}

// EgressConfigAnnotation holds, on a patched kube-apiserver pod, the SHA-256 of the egress selector
// configuration it was started with.
const EgressConfigAnnotation = "konnect.dev/egress-selector-configuration-sha256"

// AddedFlagsAnnotation lists, on a patched kube-apiserver pod, the ManifestPatch.Optional flags that konnect
// added, so that a later patch that no longer asks for one can tell it from the user's own.
const AddedFlagsAnnotation = "konnect.dev/added-flags"

// UDSDir returns the directory to mount into kube-apiserver for c's unix socket, or "" for TCP.
func (c SelectorConfig) UDSDir() string {
	c = c.withDefaults()
	if c.Transport != TransportUDS {
		return ""
	}
	return filepath.Dir(c.UDSName)
}

// Files returns the files kube-apiserver reads because of c (the TLS files of a TCP transport).
func (c SelectorConfig) Files() []string {
	c = c.withDefaults()
	if c.Transport != TransportTCP {
		return nil
	}
	return []string{c.CABundle, c.ClientCert, c.ClientKey}
}

// PatchResult tells what PatchManifest and PatchManifestFile did, or, in a dry run, would do.
type PatchResult struct {
	// Changed is false when the manifest already carried the patch; nothing was written then.
	Changed bool
	// Backup is the path of the copy of the original manifest, if PatchManifestFile wrote one.
	Backup string
	// Replaced are the flags the manifest had with another value, which the patch replaced (the pod's
	// PodRecordAnnotation keeps the old values for UnpatchPod). The requestheader lists are not among them:
	// the patch adds to those and keeps what they held.
	Replaced []FlagChange
}

// FlagChange is a flag of ManifestPatch.Flags that a patch set in place of another value.
type FlagChange struct {
	Name     string
	Old, New string
}

// PatchManifestFile patches the kube-apiserver static pod manifest at path (see PatchPod). When the patch
// changes the pod it first copies the original to a backup, then replaces path atomically, keeping its file
// mode; when it does not, no file is touched. The new manifest is encoded from the typed Pod, as kubeadm
// writes it, so comments in a hand-written manifest survive only in the backup.
func PatchManifestFile(path string, p ManifestPatch) (PatchResult, error) {
	var patched PatchResult
	res, err := editManifestFile(path, p.BackupDir, p.Now, func(data []byte) (out []byte, changed bool, err error) {
		out, patched, err = PatchManifest(data, path, p)
		return out, patched.Changed, err
	})
	if err == nil && res.Changed {
		res.Replaced = patched.Replaced
	}
	return res, err
}

// editManifestFile rewrites the manifest at path with edit. When edit changes it, the original is first copied to
// a backup in backupDir (empty: next to it, hidden), then path is replaced atomically, keeping its file mode;
// when it does not, no file is touched.
func editManifestFile(path, backupDir string, now func() time.Time, edit func([]byte) ([]byte, bool, error)) (PatchResult, error) {
	// Write through a symlink to its target rather than replacing the link with a file, but only where
	// pki.WriteFile would: never through a link, to a file or into a directory, that another user could
	// change. Resolved here because the backup goes beside the target.
	resolved, err := safepath.Resolve(path)
	if err != nil {
		return PatchResult{}, fmt.Errorf("kube-apiserver manifest %s: %w", path, err)
	}
	// Nor a manifest that another user may change: kubelet would run what they wrote, with the flags and
	// mounts konnect merges into it, and the patched file would pass to root.
	if err := safepath.CheckFile(resolved); err != nil {
		return PatchResult{}, fmt.Errorf("kube-apiserver manifest %s: refusing to patch it: %w", path, err)
	}
	path = resolved
	data, err := smallfile.Read(path)
	if err != nil {
		return PatchResult{}, fmt.Errorf("kube-apiserver manifest: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return PatchResult{}, fmt.Errorf("kube-apiserver manifest: %w", err)
	}
	out, changed, err := edit(data)
	if err != nil || !changed {
		return PatchResult{}, err
	}
	if now == nil {
		now = time.Now
	}
	backup, err := pki.Backup(path, backupDir, data, st.Mode().Perm(), now())
	if err != nil {
		return PatchResult{}, fmt.Errorf("kube-apiserver manifest: %w", err)
	}
	if _, err := pki.WriteFile(path, out, st.Mode().Perm(), 0o700); err != nil {
		return PatchResult{Backup: backup}, fmt.Errorf("kube-apiserver manifest: %w", err)
	}
	return PatchResult{Changed: true, Backup: backup}, nil
}

// PatchManifest patches a kube-apiserver static pod manifest held in data (see PatchPod); source names it
// in errors. It returns data itself, and res.Changed false, when the pod already carries the patch, so that
// an unchanged manifest is never reformatted. It writes nothing: res.Replaced is what PatchManifestFile would
// report, so that a dry run names the same flags.
func PatchManifest(data []byte, source string, p ManifestPatch) (out []byte, res PatchResult, err error) {
	pod, err := DecodePod(data, source)
	if err != nil {
		return nil, PatchResult{}, err
	}
	changed, replaced, err := patchPod(pod, p)
	if err != nil {
		return nil, PatchResult{}, fmt.Errorf("%s: %w", source, err)
	}
	if !changed {
		return data, PatchResult{}, nil
	}
	out, changed, err = encodePod(pod, source)
	if err != nil {
		return nil, PatchResult{}, err
	}
	return out, PatchResult{Changed: changed, Replaced: replaced}, nil
}

// encodePod writes pod as kubeadm does, from the typed Pod.
func encodePod(pod *corev1.Pod, source string) ([]byte, bool, error) {
	pod.APIVersion, pod.Kind = "v1", "Pod"
	out, err := yaml.Marshal(pod)
	if err != nil {
		return nil, false, fmt.Errorf("%s: encode: %w", source, err)
	}
	return out, true, nil
}

// strictCodecs refuse unknown and duplicate fields, so that a typo in a manifest is reported rather than
// silently dropped when the patched pod is written back.
var strictCodecs = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)

// DecodePod decodes data strictly as a v1 Pod; source names the data in errors.
func DecodePod(data []byte, source string) (*corev1.Pod, error) {
	// kubelet reads one pod per file; a second document would be lost when the patched pod is written.
	if n, err := countDocuments(data); err != nil {
		return nil, fmt.Errorf("%s: not a valid Pod manifest: %w", source, err)
	} else if n > 1 {
		return nil, fmt.Errorf("%s: holds %d YAML documents; a static pod manifest holds one Pod", source, n)
	}
	obj, gvk, err := strictCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: not a valid Pod manifest: %w", source, err)
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, fmt.Errorf("%s: is a %s, not a v1 Pod", source, gvk)
	}
	return pod, nil
}

// countDocuments counts the non-empty documents of a YAML stream.
func countDocuments(data []byte) (int, error) {
	docs, err := manifests.SplitDocuments(data)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, doc := range docs {
		if len(bytes.TrimSpace(doc.Body)) > 0 && !onlyComments(doc.Body) {
			n++
		}
	}
	return n, nil
}

func onlyComments(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

// PatchPod finds the kube-apiserver container in pod (by name, or by a command that runs kube-apiserver; two
// such containers are an error),
// sets p.Flags on it, and makes every directory and file it needs visible inside it at the same path
// through hostPath volumes, unless a hostPath mount already covers the path. It reports whether pod
// changed; applying the same patch twice changes nothing the second time.
func PatchPod(pod *corev1.Pod, p ManifestPatch) (changed bool, err error) {
	changed, _, err = patchPod(pod, p)
	return changed, err
}

// patchPod is PatchPod that also returns the flags it replaced (PatchResult.Replaced).
func patchPod(pod *corev1.Pod, p ManifestPatch) (changed bool, replaced []FlagChange, err error) {
	before := pod.DeepCopy()
	c, err := apiserverContainer(pod)
	if err != nil {
		return false, nil, err
	}
	// The optional flags have AddedFlagsAnnotation for their record, or, where they replace a value, the
	// optional map below.
	var recorded []string
	for _, f := range p.Flags {
		if !slices.Contains(p.Optional, f.Name) && !slices.Contains(recorded, f.Name) {
			recorded = append(recorded, f.Name)
		}
	}
	earlier, byOlder := snapshot(pod, c, recorded), unrecorded(pod)
	// An optional flag the manifest had with another value is replaced, and recorded, as the others are.
	optional := map[string]*string{}
	for _, f := range p.Flags {
		if slices.Contains(p.Optional, f.Name) {
			optional[f.Name] = boolFlagValue(c, f.Name)
		}
	}
	if err := trackOptionalFlags(pod, c, p); err != nil {
		return false, nil, err
	}
	for _, f := range p.Flags {
		if f.Name == "" || strings.HasPrefix(f.Name, "-") || strings.ContainsAny(f.Name, "= ") {
			return false, nil, fmt.Errorf("bad flag name %q", f.Name)
		}
		if f.Name == uidHeadersFlag && !takesUIDHeaders(c) {
			// Older kube-apiservers refuse the flag and would not start; without it, extension servers see
			// no user UID, as before 1.33.
			editFlag(c, f.Name, false, "")
			continue
		}
		if sharedLists[f.Name] {
			var base []string
			for _, v := range lookupFlag(c, f.Name) {
				base = append(base, strings.Split(v, ",")...)
			}
			if f.Name == allowedNamesFlag && len(base) > 0 && strings.TrimSpace(strings.Join(base, "")) == "" {
				// Set but empty: every client certificate of the request-header CA may act as a front
				// proxy, konnect's among them. Adding names would lock the others out.
				continue
			}
			merged, err := mergeList(f.Name, base, strings.Split(f.Value, ","))
			if err != nil {
				return false, nil, err
			}
			f.Value = strings.Join(merged, ",")
		}
		setFlag(c, f)
	}

	retireAgentAudience(c)

	for k, v := range p.Annotations {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[k] = v
	}

	if p.UDSDir != "" {
		if !filepath.IsAbs(p.UDSDir) {
			return false, nil, fmt.Errorf("unix socket directory %q must be absolute", p.UDSDir)
		}
		if err := ensureHostPath(pod, c, udsVolume, filepath.Clean(p.UDSDir), corev1.HostPathDirectoryOrCreate, true); err != nil {
			return false, nil, err
		}
	} else {
		// No socket (TCP transport): a socket mount from an earlier run has no purpose any more.
		removeVolume(pod, c, udsVolume)
	}
	var dirs []string
	seenDir := map[string]bool{}
	addDir := func(file string) error {
		if !filepath.IsAbs(file) {
			return fmt.Errorf("file %q must be an absolute path", file)
		}
		if d := filepath.Dir(filepath.Clean(file)); !seenDir[d] {
			seenDir[d] = true
			dirs = append(dirs, d)
		}
		return nil
	}
	for _, f := range p.Flags {
		if !strings.HasSuffix(f.Name, "-file") {
			continue
		}
		if f.Name == egressSelectorFlag {
			// Mounted as a single file: its directory (often /etc/kubernetes) holds admin credentials that
			// kube-apiserver has no business seeing, and kube-apiserver reads this file only at start-up.
			if !filepath.IsAbs(f.Value) {
				return false, nil, fmt.Errorf("--%s=%s: path must be absolute", f.Name, f.Value)
			}
			if err := ensureHostPath(pod, c, egressConfigVolume, filepath.Clean(f.Value), corev1.HostPathFile, true); err != nil {
				return false, nil, err
			}
			continue
		}
		if err := addDir(f.Value); err != nil {
			return false, nil, fmt.Errorf("--%s: %w", f.Name, err)
		}
	}
	for _, f := range p.Files {
		if err := addDir(f); err != nil {
			return false, nil, err
		}
	}
	// Certificates are mounted by directory, not file by file: kube-apiserver reloads the front-proxy
	// files when they change, and a file bind mount would keep showing the replaced inode after an atomic
	// rename. Directories are numbered in sorted order so that a rerun maps each to the same volume.
	sort.Strings(dirs)
	n := 0
	for _, d := range dirs {
		name := numbered(certsVolume, n)
		if covered(pod, c, d, name) {
			removeVolume(pod, c, name)
			continue
		}
		if err := ensureHostPath(pod, c, name, d, corev1.HostPathDirectory, true); err != nil {
			return false, nil, err
		}
		n++
	}
	for _, v := range append([]corev1.Volume(nil), pod.Spec.Volumes...) {
		if isNumbered(v.Name, certsVolume, n) {
			removeVolume(pod, c, v.Name)
		}
	}
	if err := recordPatch(pod, c, earlier, optional, byOlder); err != nil {
		return false, nil, err
	}
	for _, name := range recorded {
		if sharedLists[name] {
			continue
		}
		if old, now := earlier.flags[name], flagValue(c, name); old != nil && now != nil && *old != *now {
			replaced = append(replaced, FlagChange{Name: name, Old: *old, New: *now})
		}
	}
	for _, f := range p.Flags {
		old, ok := optional[f.Name]
		if !ok || old == nil {
			continue
		}
		if now := boolFlagValue(c, f.Name); now != nil && !sameBool(*old, *now) {
			replaced = append(replaced, FlagChange{Name: f.Name, Old: *old, New: *now})
		}
		delete(optional, f.Name)
	}
	return !equality.Semantic.DeepEqual(before, pod), replaced, nil
}

// boolFlagValue is the value kube-apiserver takes for the boolean flag name in c (the last occurrence's; "true"
// for one without a value), or nil when c does not have it.
func boolFlagValue(c *corev1.Container, name string) *string {
	var v *string
	cmd, args := flagLists(c)
	for _, list := range [][]string{cmd, args} {
		for i, tok := range list {
			if match, _ := flagAt(list, i, name, true); match {
				val := "true"
				if _, after, ok := strings.Cut(tok, "="); ok {
					val = after
				}
				v = &val
			}
		}
	}
	return v
}

// sameBool reports whether a and b are the same value of a boolean flag ("1" and "true" are).
func sameBool(a, b string) bool {
	x, errA := strconv.ParseBool(a)
	y, errB := strconv.ParseBool(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return x == y
}

func numbered(name string, n int) string {
	if n == 0 {
		return name
	}
	return name + "-" + strconv.Itoa(n+1)
}

// CheckPod returns the error PatchPod would return for a pod in which it finds no one kube-apiserver container
// to patch, or nil, so that a caller can refuse such a manifest before it writes anything else.
func CheckPod(pod *corev1.Pod) error {
	_, err := apiserverContainer(pod)
	return err
}

// apiserverContainer returns the container that runs kube-apiserver: the one named kube-apiserver or whose
// command runs kube-apiserver. Two or more such containers are an error: which one kube-apiserver's flags
// belong to is a guess, and a wrong one would leave the serving kube-apiserver unpatched without a word.
// Other containers (sidecars) are never touched.
func apiserverContainer(pod *corev1.Pod) (*corev1.Container, error) {
	var found []*corev1.Container
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name == "kube-apiserver" || (len(c.Command) > 0 && filepath.Base(c.Command[0]) == "kube-apiserver") {
			found = append(found, c)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("pod %s: no kube-apiserver container (none is named kube-apiserver or runs it)", pod.Name)
	case 1:
		return found[0], nil
	}
	names := make([]string, len(found))
	for i, c := range found {
		names[i] = strconv.Quote(c.Name)
	}
	return nil, fmt.Errorf("pod %s: containers %s all run kube-apiserver (by name or command), so which one to patch is ambiguous; leave one", pod.Name, strings.Join(names, ", "))
}

// flagAt reports whether tok is flag name (--name or --name=value), and whether the value is the next
// token (--name value). Boolean flags never take the next token as their value.
func flagAt(list []string, i int, name string, boolean bool) (match, twoTokens bool) {
	tok := list[i]
	if strings.HasPrefix(tok, "--"+name+"=") {
		return true, false
	}
	if tok != "--"+name {
		return false, false
	}
	return true, !boolean && i+1 < len(list) && !strings.HasPrefix(list[i+1], "-")
}

// namesProgram reports whether c's command starts with the program (kube-apiserver) rather than with a
// flag, as when the image's entrypoint is the program and command holds only flags.
func namesProgram(c *corev1.Container) bool {
	return len(c.Command) > 0 && !strings.HasPrefix(c.Command[0], "-")
}

// flagLists returns the parts of c's command line that hold flags: the command after the program name,
// and the args.
func flagLists(c *corev1.Container) (cmd []string, args []string) {
	if namesProgram(c) {
		return c.Command[1:], c.Args
	}
	return c.Command, c.Args
}

// lookupFlag returns the values of every occurrence of flag name in c.
func lookupFlag(c *corev1.Container, name string) []string {
	var out []string
	cmd, args := flagLists(c)
	for _, list := range [][]string{cmd, args} {
		for i := 0; i < len(list); i++ {
			match, two := flagAt(list, i, name, false)
			switch {
			case !match:
			case two:
				out = append(out, list[i+1])
				i++
			case strings.Contains(list[i], "="):
				out = append(out, strings.SplitN(list[i], "=", 2)[1])
			}
		}
	}
	return out
}

// hasFlag reports whether c's command line has the boolean flag name, with a value or without.
func hasFlag(c *corev1.Container, name string) bool {
	cmd, args := flagLists(c)
	for _, list := range [][]string{cmd, args} {
		for i := range list {
			if match, _ := flagAt(list, i, name, true); match {
				return true
			}
		}
	}
	return false
}

// setFlag gives f's value to the first occurrence of f in c, removes any later occurrence, and appends f
// where c keeps its flags if it had none.
func setFlag(c *corev1.Container, f Flag) {
	if editFlag(c, f.Name, f.Value == "true" || f.Value == "false", f.String()) {
		return
	}
	// Append where the flags live: kubeadm puts them all in command; other manifests use args.
	if len(c.Args) > 0 || len(c.Command) == 0 {
		c.Args = append(c.Args, f.String())
	} else {
		c.Command = append(c.Command, f.String())
	}
}

// editFlag puts with ("--name=value") in place of the first occurrence of the flag name in c, or nothing when
// with is empty, removes every later occurrence, and reports whether there was one.
func editFlag(c *corev1.Container, name string, boolean bool, with string) (found bool) {
	edit := func(list []string) []string {
		out := list[:0:0]
		for i := 0; i < len(list); i++ {
			match, two := flagAt(list, i, name, boolean)
			if !match {
				out = append(out, list[i])
				continue
			}
			if two {
				i++
			}
			if !found && with != "" {
				out = append(out, with)
			}
			found = true
		}
		return out
	}
	if namesProgram(c) {
		c.Command = append(c.Command[:1:1], edit(c.Command[1:])...)
	} else if len(c.Command) > 0 {
		c.Command = edit(c.Command)
	}
	if len(c.Args) > 0 {
		c.Args = edit(c.Args)
	}
	return found
}

// retireAgentAudience takes the agents' token audience out of --api-audiences, where konnect put it before:
// there it made every agent's token a credential for kube-apiserver's API, and the server's TokenReviews,
// which name the audience themselves, never needed it. A flag left empty is removed, so that kube-apiserver
// falls back to its issuers.
func retireAgentAudience(c *corev1.Container) {
	var kept []string
	found := false
	for _, v := range lookupFlag(c, "api-audiences") {
		for _, a := range strings.Split(v, ",") {
			switch a = strings.TrimSpace(a); {
			case a == KonnectivityAudience:
				found = true
			case a != "":
				kept = append(kept, a)
			}
		}
	}
	if !found {
		return
	}
	with := ""
	if len(kept) > 0 {
		with = Flag{"api-audiences", strings.Join(kept, ",")}.String()
	}
	editFlag(c, "api-audiences", false, with)
}

// trackOptionalFlags keeps AddedFlagsAnnotation: it records each of p.Optional that p adds to c, and takes out
// of c each recorded one that p no longer sets. One that p no longer sets and that PodRecordAnnotation holds
// (konnect replaced the manifest's value) gets that value back, and leaves the record, so that a later patch
// that sets it again records the value c has then; one neither holds gets back what p.Kubeadm recorded. It
// runs before p's flags are set, to see which c already had.
func trackOptionalFlags(pod *corev1.Pod, c *corev1.Container, p ManifestPatch) error {
	rec, _, err := readPodRecord(pod)
	if err != nil {
		return err
	}
	var added []string
	if v := pod.Annotations[AddedFlagsAnnotation]; v != "" {
		added = strings.Split(v, ",")
	}
	restored := false
	for _, name := range p.Optional {
		asked := slices.ContainsFunc(p.Flags, func(f Flag) bool { return f.Name == name })
		i := slices.IndexFunc(rec.Flags, func(f RecordedFlag) bool { return f.Name == name && !f.Unknown })
		switch had := hasFlag(c, name); {
		case asked && !had && !slices.Contains(added, name) && !rec.flag(name):
			added = append(added, name)
		case !asked && slices.Contains(added, name):
			editFlag(c, name, true, "")
			added = slices.DeleteFunc(added, func(n string) bool { return n == name })
		case !asked && i >= 0:
			restoreFlag(c, name, rec.Flags[i].Previous)
			rec.Flags = slices.Delete(rec.Flags, i, i+1)
			restored = true
		case !asked && had && !rec.flag(name):
			if previous, ok := p.Kubeadm.ReleasedValue(name, *boolFlagValue(c, name)); ok {
				restoreFlag(c, name, previous)
			}
		}
	}
	if restored {
		// Kept even when empty: a pod with konnect's marks and no record is one an older konnect patched.
		if err := writePodRecord(pod, rec); err != nil {
			return err
		}
	}
	slices.Sort(added)
	switch {
	case len(added) > 0:
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[AddedFlagsAnnotation] = strings.Join(added, ",")
	case pod.Annotations != nil:
		delete(pod.Annotations, AddedFlagsAnnotation)
	}
	return nil
}

// uidHeadersFlag is the one request-header flag that older kube-apiservers refuse.
const uidHeadersFlag = "requestheader-uid-headers"

// allowedNamesFlag lists the front proxies' certificate names; empty means any the request-header CA signed.
const allowedNamesFlag = "requestheader-allowed-names"

// sharedLists are kube-apiserver's comma-separated flags that konnect needs entries in but does not own.
// The patch adds its entries after those the manifest has, so that another front proxy's name and headers
// keep working.
var sharedLists = map[string]bool{
	allowedNamesFlag:                     true,
	"requestheader-extra-headers-prefix": true,
	"requestheader-group-headers":        true,
	"requestheader-username-headers":     true,
	uidHeadersFlag:                       true,
}

// takesUIDHeaders reports whether the kube-apiserver container c takes --requestheader-uid-headers: 1.33 and
// later do, 1.32 when its --feature-gates turn RemoteRequestHeaderUID on (it is off by default), and older
// ones do not know it. An image whose tag is not a version is taken to be recent.
func takesUIDHeaders(c *corev1.Container) bool {
	ref := c.Image[strings.LastIndex(c.Image, "/")+1:]
	ref, _, _ = strings.Cut(ref, "@")
	_, tag, ok := strings.Cut(ref, ":")
	if !ok {
		return true
	}
	v, err := version.ParseGeneric(tag)
	if err != nil || v.Major() != 1 || v.Minor() >= 33 {
		return true
	}
	return v.Minor() == 32 && featureGate(c, "RemoteRequestHeaderUID")
}

// featureGate reports whether c's --feature-gates turn gate on; the last setting wins, as in kube-apiserver.
func featureGate(c *corev1.Container, gate string) bool {
	on := false
	for _, v := range lookupFlag(c, "feature-gates") {
		for _, kv := range strings.Split(v, ",") {
			if k, val, _ := strings.Cut(strings.TrimSpace(kv), "="); k == gate {
				on = strings.EqualFold(strings.TrimSpace(val), "true")
			}
		}
	}
	return on
}

// isNumbered reports whether name is numbered(base, k) for some k >= from.
func isNumbered(name, base string, from int) bool {
	for k := from; k < from+64; k++ {
		if name == numbered(base, k) {
			return true
		}
	}
	return false
}

// removeVolume drops the volume called name and c's mount of it.
func removeVolume(pod *corev1.Pod, c *corev1.Container, name string) {
	vols := pod.Spec.Volumes[:0:0]
	for _, v := range pod.Spec.Volumes {
		if v.Name != name {
			vols = append(vols, v)
		}
	}
	if len(vols) == len(pod.Spec.Volumes) {
		return
	}
	pod.Spec.Volumes = vols
	mounts := c.VolumeMounts[:0:0]
	for _, m := range c.VolumeMounts {
		if m.Name != name {
			mounts = append(mounts, m)
		}
	}
	c.VolumeMounts = mounts
}

// covered reports whether path is already visible inside c at the same path: some mount other than of
// volume except is a hostPath volume mounted at the host path it maps, and that path is path itself or
// one of its parent directories.
func covered(pod *corev1.Pod, c *corev1.Container, path, except string) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == except || m.SubPath != "" || m.SubPathExpr != "" {
			continue
		}
		mp := filepath.Clean(m.MountPath)
		if path != mp && !strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/") {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && filepath.Clean(v.HostPath.Path) == mp {
				return true
			}
		}
	}
	return false
}

// ensureHostPath makes host path visible in c at the same path. If another hostPath mount already covers
// it, a volume called name (left by an earlier run) is removed. Otherwise the volume called name, which
// this package owns, is created or pointed at path, and so is c's mount of it.
func ensureHostPath(pod *corev1.Pod, c *corev1.Container, name, path string, t corev1.HostPathType, readOnly bool) error {
	if covered(pod, c, path, name) {
		removeVolume(pod, c, name)
		return nil
	}
	for _, m := range c.VolumeMounts {
		if m.Name != name && filepath.Clean(m.MountPath) == path {
			return fmt.Errorf("container %s: mount path %s is taken by volume %q, which does not map host path %s there",
				c.Name, path, m.Name, path)
		}
	}
	want := corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &t},
	}}
	vi := -1
	for i, v := range pod.Spec.Volumes {
		if v.Name == name {
			vi = i
		}
	}
	if vi < 0 {
		pod.Spec.Volumes = append(pod.Spec.Volumes, want)
	} else {
		if pod.Spec.Volumes[vi].HostPath == nil {
			return fmt.Errorf("volume %q exists and is not a hostPath volume; rename it", name)
		}
		pod.Spec.Volumes[vi] = want
	}
	mount := corev1.VolumeMount{Name: name, MountPath: path, ReadOnly: readOnly}
	for i, m := range c.VolumeMounts {
		if m.Name == name {
			c.VolumeMounts[i] = mount
			return nil
		}
	}
	c.VolumeMounts = append(c.VolumeMounts, mount)
	return nil
}
