package manifests

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki"
)

// renderBundle is the agents' bundle for a, with or without the server's Leases.
func renderBundle(t *testing.T, leases bool) []File {
	t.Helper()
	a := Agent{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1"}
	if leases {
		a.ServerLeases, a.APIServerURL = true, "https://198.18.0.1:6443"
	}
	files, err := a.Render()
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func writeBundle(t *testing.T, dir string, files []File) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.Name), f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func fileNamed(files []File, name string) (File, bool) {
	i := slices.IndexFunc(files, func(f File) bool { return f.Name == name })
	if i < 0 {
		return File{}, false
	}
	return files[i], true
}

// TestPrepareAgentBundleMovesLegacy: a bundle in the static-pod directory moves out whole, with a file the
// user added; a dry run only says so; with both there, the old copy stays and is named.
func TestPrepareAgentBundleMovesLegacy(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, AgentBundleDir)
	legacy := filepath.Join(root, "manifests", AgentBundleDir)
	files := renderBundle(t, false)
	writeBundle(t, legacy, files)
	if err := os.WriteFile(filepath.Join(legacy, "user-patch.yaml"), []byte("# the user's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const why = "kubelet logs an error for each directory in its static-pod directory"
	moved := BundleChange{Action: BundleMoved, Path: legacy + "/", Note: "to " + dir + ": " + why}

	_, changes, err := PrepareAgentBundle(dir, legacy, renderBundle(t, false), true)
	if want := (BundleChange{Action: moved.Action, DryRun: true, Path: moved.Path, Note: moved.Note}); err != nil || !reflect.DeepEqual(changes, []BundleChange{want}) {
		t.Errorf("dry run: %+v, %v; want %+v", changes, err, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("a dry run moved the bundle: %v", err)
	}

	// Without files (not rendered yet) it still moves.
	got, changes, err := PrepareAgentBundle(dir, legacy, nil, false)
	if err != nil || got != nil || !reflect.DeepEqual(changes, []BundleChange{moved}) {
		t.Errorf("got %v, %+v, %v; want no files and %+v", got, changes, err, moved)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", legacy, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "user-patch.yaml")); err != nil {
		t.Errorf("the user's file did not come along: %v", err)
	}

	if err := os.Mkdir(legacy, 0o755); err != nil {
		t.Fatal(err)
	}
	_, changes, err = PrepareAgentBundle(dir, legacy, renderBundle(t, false), false)
	kept := BundleChange{Action: pki.Kept, Path: legacy + "/", Note: "left by an older konnect: the bundle is now " + dir + "; delete this copy: " + why}
	if err != nil || !reflect.DeepEqual(changes, []BundleChange{kept}) {
		t.Errorf("both there: %+v, %v; want %+v", changes, err, kept)
	}
	if _, err := os.Stat(legacy); err != nil {
		t.Errorf("the old copy was removed: %v", err)
	}
}

// TestPrepareAgentBundleRemovesStaleFiles: konnect's files that this run no longer renders go (a dry run
// only names them); a file the user listed stays, although its objects carry konnect's label.
func TestPrepareAgentBundleRemovesStaleFiles(t *testing.T) {
	dir := t.TempDir()
	earlier := renderBundle(t, true)
	k, _ := fileNamed(earlier, "kustomization.yaml")
	k.Data = append(k.Data, "- mine.yaml\n"...)
	earlier = append(earlier, k)
	writeBundle(t, dir, earlier)
	ds, _ := fileNamed(earlier, "konnectivity-agent.yaml")
	mine := strings.Replace(string(ds.Data), "name: konnectivity-agent\n", "name: konnectivity-agent-gpu\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "mine.yaml"), []byte(mine), 0o644); err != nil {
		t.Fatal(err)
	}
	now := renderBundle(t, false)
	var stale []string
	for _, f := range earlier {
		if _, ok := fileNamed(now, f.Name); !ok && slices.Contains(AgentBundleFiles, f.Name) {
			stale = append(stale, filepath.Join(dir, f.Name))
		}
	}
	if len(stale) == 0 {
		t.Fatal("the bundle without Leases has every file of the one with them")
	}

	for _, dryRun := range []bool{true, false} {
		_, changes, err := PrepareAgentBundle(dir, filepath.Join(dir, "no-legacy"), now, dryRun)
		if err != nil {
			t.Fatal(err)
		}
		var removed []string
		for _, c := range changes {
			if c.Action == BundleRemoved {
				if c.DryRun != dryRun || c.Note != "no longer part of the bundle" {
					t.Errorf("dry run %v: %+v", dryRun, c)
				}
				removed = append(removed, c.Path)
			}
		}
		if !reflect.DeepEqual(removed, stale) {
			t.Errorf("dry run %v: removed %q, want %q", dryRun, removed, stale)
		}
		for _, path := range stale {
			if _, err := os.Stat(path); os.IsNotExist(err) != !dryRun {
				t.Errorf("dry run %v: %s: %v", dryRun, path, err)
			}
		}
		if slices.ContainsFunc(changes, func(c BundleChange) bool { return strings.Contains(c.Path+c.Note, "gpu") }) {
			t.Errorf("the user's objects are named: %+v", changes)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "mine.yaml")); err != nil {
		t.Errorf("the user's file: %v", err)
	}
}

// TestPrepareAgentBundleNamesObjectsLeftInCluster: kubectl apply -k deletes nothing, so an object of the
// earlier bundle that this one lacks, here a Role that moved namespace, is named with the command that
// deletes it, although its file stays.
func TestPrepareAgentBundleNamesObjectsLeftInCluster(t *testing.T) {
	dir := t.TempDir()
	files := renderBundle(t, true)
	writeBundle(t, dir, files)
	role := filepath.Join(dir, "konnectivity-server-leases-role.yaml")
	data, err := os.ReadFile(role)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(role, []byte(strings.ReplaceAll(string(data), "namespace: "+LeaseNamespace, "namespace: kube-system")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, changes, err := PrepareAgentBundle(dir, filepath.Join(dir, "no-legacy"), renderBundle(t, true), false)
	want := BundleChange{Action: BundleLeftInCluster, Path: "role konnectivity-server-leases -n kube-system",
		Note: "an earlier bundle created it and kubectl apply -k does not delete it: kubectl delete role konnectivity-server-leases -n kube-system"}
	if err != nil || !reflect.DeepEqual(changes, []BundleChange{want}) {
		t.Errorf("got %+v, %v; want %+v", changes, err, want)
	}
	if _, err := os.Stat(role); err != nil {
		t.Errorf("the Role's file, still rendered, went: %v", err)
	}
}

// TestPrepareAgentBundleKeepsUserKustomization: what the user added to kustomization.yaml comes into the
// files returned, read from the legacy place on a dry run that would move it.
func TestPrepareAgentBundleKeepsUserKustomization(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, AgentBundleDir)
	legacy := filepath.Join(root, "manifests", AgentBundleDir)
	earlier := renderBundle(t, false)
	k, _ := fileNamed(earlier, "kustomization.yaml")
	const added = "- mine.yaml\npatches:\n- path: surge.yaml\n  target:\n    kind: DaemonSet\n"
	k.Data = append(k.Data, added...)
	writeBundle(t, legacy, append(earlier, k))

	for _, dryRun := range []bool{true, false} {
		files, _, err := PrepareAgentBundle(dir, legacy, renderBundle(t, false), dryRun)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := fileNamed(files, "kustomization.yaml")
		for _, want := range []string{"- mine.yaml\n", "path: surge.yaml", "konnectivity-agent.yaml"} {
			if !strings.Contains(string(got.Data), want) {
				t.Errorf("dry run %v: kustomization.yaml lacks %q:\n%s", dryRun, want, got.Data)
			}
		}
	}
}
