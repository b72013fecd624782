package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"github.com/konnect-dev/konnect/pki/smallfile"
	yaml "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	sigsyaml "sigs.k8s.io/yaml"
)

// FilesDigest is the SHA-256 over the names and contents of files, for Server.FilesDigest: a file that does
// not exist (yet, on a dry run) counts as empty.
func FilesDigest(files []string) (string, error) {
	h := sha256.New()
	for _, f := range files {
		data, err := smallfile.Read(f)
		if err != nil && !os.IsNotExist(err) {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
}

// PodMountedFiles are the host files that pod, a server static pod as Server.Pod renders it, mounts under
// the names Pod gives those volumes, in the order of MountedFiles: the files its FilesDigestAnnotation covers.
// The paths are the pod's own, so a path an operator changed in the manifest counts; a volume they added
// under another name does not, as the digest konnect init writes does not cover it either.
func PodMountedFiles(pod *corev1.Pod) []string {
	var out []string
	for _, name := range fileVolumes {
		for _, v := range pod.Spec.Volumes {
			if v.Name != name || v.HostPath == nil || v.HostPath.Path == "" {
				continue
			}
			if p := filepath.Clean(v.HostPath.Path); !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// digestLine is the FilesDigestAnnotation as Server.Render writes it: a line of its own with a plain or
// quoted value.
var digestLine = regexp.MustCompile(`(?m)^([ \t]*` + regexp.QuoteMeta(FilesDigestAnnotation) + `:[ \t]*)("?)([0-9a-f]*)("?)([ \t]*\r?)$`)

// SetFilesDigest returns data, a server static pod manifest (source names it in errors), with its
// FilesDigestAnnotation set to digest; changed is false, and data is returned as it is, when the annotation
// has that value already. The rest of the manifest is kept: when data has the annotation on a line of its
// own, only its value changes, byte for byte; otherwise the annotation is added to metadata and the pod keeps
// its keys, their order and its comments, but is re-indented with two spaces (written as JSON if it was). Each
// result is decoded again and must be data's pod with that one annotation changed, or nothing is returned.
func SetFilesDigest(data []byte, source, digest string) (out []byte, changed bool, err error) {
	var before corev1.Pod
	if err := sigsyaml.Unmarshal(data, &before); err != nil {
		return nil, false, fmt.Errorf("%s: not a valid Pod manifest: %w", source, err)
	}
	if before.Annotations[FilesDigestAnnotation] == digest {
		return data, false, nil
	}
	want := before.DeepCopy()
	if want.Annotations == nil {
		want.Annotations = map[string]string{}
	}
	want.Annotations[FilesDigestAnnotation] = digest
	var problems []error
	for _, edit := range []func([]byte, string) ([]byte, error){replaceDigestLine, setDigestNode} {
		out, err := edit(data, digest)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		var after corev1.Pod
		if err := sigsyaml.Unmarshal(out, &after); err != nil {
			problems = append(problems, err)
			continue
		}
		if !equality.Semantic.DeepEqual(want, &after) {
			problems = append(problems, errors.New("the edit would change more than the annotation"))
			continue
		}
		return out, true, nil
	}
	return nil, false, fmt.Errorf("%s: cannot set annotation %s: %w", source, FilesDigestAnnotation, errors.Join(problems...))
}

// replaceDigestLine replaces the value on the one annotation line that data holds.
func replaceDigestLine(data []byte, digest string) ([]byte, error) {
	m := digestLine.FindAllSubmatchIndex(data, -1)
	if len(m) != 1 {
		return nil, fmt.Errorf("%d lines hold the annotation", len(m))
	}
	value := m[0][6:8] // the third group: the value inside any quotes
	return slices.Concat(data[:value[0]], []byte(digest), data[value[1]:]), nil
}

// setDigestNode sets the annotation in the parsed manifest and encodes it again.
func setDigestNode(data []byte, digest string) ([]byte, error) {
	root, err := decodeDocument(data)
	if err != nil {
		return nil, err
	}
	if len(root.Content) != 1 {
		return nil, errors.New("no object")
	}
	meta := lookup(root.Content[0], "metadata")
	if meta == nil || meta.Kind != yaml.MappingNode {
		return nil, errors.New("no metadata")
	}
	ann := lookup(meta, "annotations")
	if ann == nil || ann.Kind != yaml.MappingNode {
		// Missing, or null: a mapping in its place.
		ann = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		setNode(meta, "annotations", ann)
	}
	setScalar(ann, FilesDigestAnnotation, digest)
	if json.Valid(data) {
		return encodeJSON(root)
	}
	out, err := encodeYAML(root)
	if err == nil && bytes.Contains(data, []byte("\r\n")) {
		out = bytes.ReplaceAll(out, []byte("\n"), []byte("\r\n"))
	}
	return out, err
}

// setNode sets key to value in mapping m, adding the key when it is missing.
func setNode(m *yaml.Node, key string, value *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = value
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, value)
}
