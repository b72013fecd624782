package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/smallfile"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// AgentBundleDir holds the cluster-side manifests (DaemonSet, ServiceAccount, RBAC) for `kubectl apply -k`,
// under konnect's directory beside its static-pod directory, not in it: with konnect init --dir
// /etc/kubernetes, DIR/manifests is kubelet's static-pod directory, and kubelet logs an error for every
// directory it finds there at each scan (20 s).
const AgentBundleDir = "konnectivity-agent"

// What PrepareAgentBundle did to a file or directory besides writing it; pki.Kept for an earlier copy it
// left in place.
const (
	BundleMoved         pki.Action = "moved"               // the note says where
	BundleRemoved       pki.Action = "removed"             // a file an earlier run wrote that this run does not
	BundleLeftInCluster pki.Action = "left in the cluster" // an object of an earlier bundle that this one lacks
)

// A BundleChange is what PrepareAgentBundle did, or in a dry run would do, besides writing the bundle's files.
type BundleChange struct {
	Action pki.Action
	// DryRun says that the change would happen, and did not.
	DryRun bool
	// Path is a file or directory (a directory ends in a separator), or "KIND NAME [-n NS]" for an object
	// left in the cluster.
	Path string
	Note string
}

// PrepareAgentBundle readies dir for files, the agents' bundle this run renders (Agent.Render), which the
// caller then writes. It
//   - moves an earlier bundle out of legacy (AgentBundleDir inside konnect's static-pod directory, where
//     konnect wrote it before) to dir, whole, so that files a user added come along;
//   - removes konnect's own files that files no longer has;
//   - names each object of the earlier bundle that files lacks, with the kubectl command that deletes it;
//   - carries what the user added to kustomization.yaml into files.
//
// With files nil (a run that cannot render the bundle yet) it only moves the earlier bundle. With dryRun it
// changes nothing and says what it would do. On an error, the changes returned are those made before it.
func PrepareAgentBundle(dir, legacy string, files []File, dryRun bool) ([]File, []BundleChange, error) {
	earlier, changes, err := moveLegacyAgentBundle(dir, legacy, dryRun)
	if err != nil || files == nil {
		return nil, changes, err
	}
	tidied, err := tidyBundle(earlier, dir, files, dryRun)
	changes = append(changes, tidied...)
	if err != nil {
		return nil, changes, err
	}
	files, err = keepUserKustomization(earlier, files)
	return files, changes, err
}

// keepUserKustomization carries what a user added to the bundle's kustomization.yaml, in the directory
// earlier, into this run's files.
func keepUserKustomization(earlier string, files []File) ([]File, error) {
	path := filepath.Join(earlier, "kustomization.yaml")
	existing, err := smallfile.Read(path)
	if os.IsNotExist(err) {
		return files, nil
	}
	if err != nil {
		return nil, err
	}
	for i, f := range files {
		if f.Name == "kustomization.yaml" {
			if files[i], err = KeepUserKustomization(f, existing, AgentBundleFiles); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	return files, nil
}

// moveLegacyAgentBundle moves the agents' bundle out of legacy, where konnect wrote it before, to dir. The
// directory moves whole, so that files a user added (a kustomize patch) come along, and init then rewrites
// its own files there as it did in the old place (keeping what the user added to kustomization.yaml). If
// both exist, the old one stays and is named.
// It returns where the earlier bundle is now: dir, or in a dry run the old place.
func moveLegacyAgentBundle(dir, legacy string, dryRun bool) (string, []BundleChange, error) {
	if fi, err := os.Lstat(legacy); err != nil || !fi.IsDir() {
		return dir, nil, nil
	}
	const why = "kubelet logs an error for each directory in its static-pod directory"
	switch _, err := os.Lstat(dir); {
	case err == nil:
		return dir, []BundleChange{{Action: pki.Kept, Path: legacy + string(filepath.Separator),
			Note: "left by an older konnect: the bundle is now " + dir + "; delete this copy: " + why}}, nil
	case !os.IsNotExist(err):
		return "", nil, err
	}
	changes := []BundleChange{{Action: BundleMoved, DryRun: dryRun, Path: legacy + string(filepath.Separator),
		Note: "to " + dir + ": " + why}}
	if dryRun {
		return legacy, changes, nil
	}
	if err := os.Rename(legacy, dir); err != nil {
		return "", changes, fmt.Errorf("move the agents' bundle out of %s: %w", filepath.Dir(legacy), err)
	}
	return dir, changes, nil
}

// tidyBundle compares the bundle an earlier run left in earlier with this run's files for dir. A file of
// konnect's (AgentBundleFiles, listed by the earlier kustomization.yaml, every object labelled as konnect's)
// that this run does not write is removed: a feature turned off (--server-leases, or --agent-auth mtls with
// the Secret that holds the agents' key) would otherwise leave it there. kubectl apply -k deletes nothing,
// so each object the earlier files held and this run's do not (also one that moved namespace) is named with
// the command that deletes it.
func tidyBundle(earlier, dir string, files []File, dryRun bool) ([]BundleChange, error) {
	data, err := smallfile.Read(filepath.Join(earlier, "kustomization.yaml"))
	if err != nil {
		return nil, nil
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if yaml.Unmarshal(data, &k) != nil {
		return nil, nil
	}
	now := map[string]bool{}
	for _, f := range files {
		objs, err := objectsInData(f.Data, f.Name)
		if err != nil {
			return nil, err
		}
		for _, obj := range objs {
			now[deleteCommand(obj)] = true
		}
	}
	var changes []BundleChange
	var gone []string
	for _, name := range k.Resources {
		if !slices.Contains(AgentBundleFiles, name) {
			continue
		}
		objs, err := ObjectsIn(filepath.Join(earlier, name))
		if err != nil || len(objs) == 0 || slices.ContainsFunc(objs, func(o metav1.PartialObjectMetadata) bool {
			return o.Labels[ManagedByLabel] != ManagedBy
		}) {
			continue
		}
		for _, obj := range objs {
			if cmd := deleteCommand(obj); !now[cmd] {
				gone = append(gone, cmd)
			}
		}
		if slices.ContainsFunc(files, func(f File) bool { return f.Name == name }) {
			continue
		}
		path := filepath.Join(dir, name)
		if !dryRun {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return changes, err
			}
		}
		changes = append(changes, BundleChange{Action: BundleRemoved, DryRun: dryRun, Path: path, Note: "no longer part of the bundle"})
	}
	for _, cmd := range gone {
		changes = append(changes, BundleChange{Action: BundleLeftInCluster, DryRun: dryRun, Path: strings.TrimPrefix(cmd, "kubectl delete "),
			Note: "an earlier bundle created it and kubectl apply -k does not delete it: " + cmd})
	}
	return changes, nil
}

// deleteCommand is the kubectl command that deletes obj.
func deleteCommand(obj metav1.PartialObjectMetadata) string {
	cmd := "kubectl delete " + strings.ToLower(obj.Kind) + " " + obj.Name
	if obj.Namespace != "" {
		cmd += " -n " + obj.Namespace
	}
	return cmd
}

// ObjectsIn reads the kind and metadata of every object in a YAML file of one or more documents.
func ObjectsIn(path string) ([]metav1.PartialObjectMetadata, error) {
	data, err := smallfile.Read(path)
	if err != nil {
		return nil, err
	}
	return objectsInData(data, path)
}

// ManagedByKonnect reports whether data, the content of the file source, holds objects and each carries
// konnect's ManagedByLabel: the mark of a manifest konnect wrote, which a later run may replace or remove.
func ManagedByKonnect(data []byte, source string) bool {
	objs, err := objectsInData(data, source)
	if err != nil || len(objs) == 0 {
		return false
	}
	for _, o := range objs {
		if o.Labels[ManagedByLabel] != ManagedBy {
			return false
		}
	}
	return true
}

// objectsInData is ObjectsIn for data read from path.
func objectsInData(data []byte, path string) ([]metav1.PartialObjectMetadata, error) {
	docs, err := SplitDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var objs []metav1.PartialObjectMetadata
	for _, doc := range docs {
		if len(doc.Body) == 0 {
			continue
		}
		var obj metav1.PartialObjectMetadata
		if err := yaml.Unmarshal(doc.Body, &obj); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}
