package initcmd

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
)

// podDigest is the server pod's FilesDigestAnnotation, and the digest of the files it mounts now.
func podDigest(t *testing.T, path string) (annotation, files string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := kubeapiserver.DecodePod(data, path)
	if err != nil {
		t.Fatal(err)
	}
	files, err = manifests.FilesDigest(manifests.PodMountedFiles(pod))
	if err != nil {
		t.Fatal(err)
	}
	return pod.Annotations[manifests.FilesDigestAnnotation], files
}

// TestCertsRenewRestartsServerPod: a renewal that replaces a file the server's static pod mounts sets the
// pod's digest annotation to the digest of the files it mounts now, so that kubelet restarts the server,
// whose file mounts keep the old files until then. The digest is the one init writes, so a later init
// changes nothing. Nothing else in the pod changes, also after an operator's edits, and the file keeps its
// mode. A renewal of nothing the pod mounts, and a dry run, leave it as it is, inode and all.
func TestCertsRenewRestartsServerPod(t *testing.T) {
	dir := t.TempDir()
	args := initArgs(dir, "--key-algorithm", "ecdsa-p256")
	mustRun(t, args...)
	podFile := filepath.Join(dir, ManifestsSubdir, manifests.ServerPodFile)
	const pod = "manifests/" + manifests.ServerPodFile

	before := sums(t, dir)
	out := mustRun(t, "certs", "renew", "front-proxy-client", "--dir", dir)
	if c := changed(before, sums(t, dir)); !slices.Equal(c, []string{"pki/front-proxy-client.crt"}) {
		t.Errorf("renewing what the server does not mount changed %v\n%s", c, out)
	}
	if strings.Contains(out, podFile) || strings.Contains(out, "konnectivity-server static pod") {
		t.Errorf("renewing what the server does not mount mentions its pod:\n%s", out)
	}

	before = sums(t, dir)
	out = mustRun(t, "certs", "renew", "all", "--dir", dir, "--dry-run")
	if c := changed(before, sums(t, dir)); len(c) > 0 {
		t.Errorf("dry run changed %v", c)
	}
	if !strings.Contains(out, "[would be updated] "+podFile+": annotation "+manifests.FilesDigestAnnotation) {
		t.Errorf("dry run does not say that the pod would change:\n%s", out)
	}

	out = mustRun(t, "certs", "renew", "all", "--dir", dir)
	want := []string{"konnectivity-server.conf", pod, "pki/front-proxy-client.crt", "pki/konnectivity-server-client.crt", "pki/konnectivity-server.crt"}
	if c := changed(before, sums(t, dir)); !slices.Equal(c, want) {
		t.Fatalf("renew all changed %v, want %v\n%s", c, want, out)
	}
	if annotation, files := podDigest(t, podFile); annotation != files {
		t.Errorf("annotation %s, digest of the mounted files %s", annotation, files)
	}
	if !strings.Contains(out, "[updated] "+podFile+": annotation "+manifests.FilesDigestAnnotation) ||
		strings.Count(out, "next: "+serverRestartsStep) != 1 || strings.Contains(out, restartServerStep) {
		t.Errorf("renew all does not say once that kubelet restarts the server, and only that:\n%s", out)
	}
	if !strings.Contains(serverRestartsStep, "one node at a time") {
		t.Errorf("the step says nothing of several control-plane nodes: %s", serverRestartsStep)
	}
	before = sums(t, dir)
	if out := mustRun(t, args...); strings.Contains(out, "[updated]") {
		t.Errorf("init after renew updates:\n%s", out)
	}
	if c := changed(before, sums(t, dir)); len(c) > 0 {
		t.Errorf("init after renew changed %v", c)
	}

	// An operator's edits and file mode stay; only the annotation's value changes.
	data, err := os.ReadFile(podFile)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(data), "    - --health-port=8134\n", "    # raised while debugging\n    - --health-port=8134\n    - -v=4\n", 1)
	if edited == string(data) {
		t.Fatal("no --health-port line to edit")
	}
	if err := os.WriteFile(podFile, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(podFile, 0o640); err != nil {
		t.Fatal(err)
	}
	oldDigest, _ := podDigest(t, podFile)
	mustRun(t, "certs", "renew", "konnectivity-server", "--dir", dir)
	got, err := os.ReadFile(podFile)
	if err != nil {
		t.Fatal(err)
	}
	newDigest, files := podDigest(t, podFile)
	if newDigest != files || newDigest == oldDigest || string(got) != strings.Replace(edited, oldDigest, newDigest, 1) {
		t.Errorf("renew did not change only the annotation of the edited pod:\n%s", got)
	}
	if st, err := os.Stat(podFile); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("pod file mode: %v, %v", st.Mode(), err)
	}
}

// TestCertsRenewServerPodMountsNone: with agents authenticated by certificate and no leases, the server reads
// no kubeconfig: renewing its client certificate changes the kubeconfig but not the pod, and asks for no
// restart. The agents' CA, which it mounts, does.
func TestCertsRenewServerPodMountsNone(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--agent-auth", "mtls", "--key-algorithm", "ecdsa-p256")...)
	before := sums(t, dir)
	out := mustRun(t, "certs", "renew", "konnectivity-server-client", "--dir", dir)
	if c := changed(before, sums(t, dir)); !slices.Equal(c, []string{"konnectivity-server.conf", "pki/konnectivity-server-client.crt"}) {
		t.Errorf("renew konnectivity-server-client changed %v\n%s", c, out)
	}
	if strings.Contains(out, "konnectivity-server static pod") {
		t.Errorf("asks to restart a server that does not read the renewed file:\n%s", out)
	}
	out = mustRun(t, "certs", "renew", "konnectivity-agent-ca", "--dir", dir)
	if !strings.Contains(out, "next: "+serverRestartsStep) {
		t.Errorf("renew konnectivity-agent-ca does not restart the server:\n%s", out)
	}
	if annotation, files := podDigest(t, filepath.Join(dir, ManifestsSubdir, manifests.ServerPodFile)); annotation != files {
		t.Errorf("annotation %s, digest of the mounted files %s", annotation, files)
	}
}

// TestCertsRenewLeavesOthersServerPod: a server pod that konnect did not write is left as it is, and the
// output says to restart it; one of konnect's that does not decode, and one behind another user's symlink,
// are errors that name it, and neither the file nor the symlink's target changes. The certificates are
// renewed either way.
func TestCertsRenewLeavesOthersServerPod(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--key-algorithm", "ecdsa-p256")...)
	podFile := filepath.Join(dir, ManifestsSubdir, manifests.ServerPodFile)
	data, err := os.ReadFile(podFile)
	if err != nil {
		t.Fatal(err)
	}
	foreign := strings.Replace(string(data), manifests.ManagedByLabel+": "+manifests.ManagedBy, manifests.ManagedByLabel+": someone", 1)
	if err := os.WriteFile(podFile, []byte(foreign), 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "certs", "renew", "konnectivity-server", "--dir", dir)
	if got := readFile(t, podFile); got != foreign {
		t.Errorf("renew changed a pod konnect did not write:\n%s", got)
	}
	if !strings.Contains(out, "[kept] "+podFile+": it mounts renewed files, but konnect did not write it") || !strings.Contains(out, "next: "+restartServerStep) {
		t.Errorf("renew does not say to restart a pod konnect did not write:\n%s", out)
	}

	// konnect's, but not a Pod it can read: an error that names the file and says what to do, after the renewal.
	broken := "apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n    " + manifests.ManagedByLabel + ": " + manifests.ManagedBy + "\nspec:\n  bogus: 1\n"
	if err := os.WriteFile(podFile, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	certBefore := readFile(t, filepath.Join(dir, "pki", "konnectivity-server.crt"))
	out, err = run(t, "certs", "renew", "konnectivity-server", "--dir", dir)
	if err == nil || !strings.Contains(err.Error(), podFile+": certificates renewed, but the server's static pod was not updated") || !strings.Contains(err.Error(), "restart it yourself") {
		t.Errorf("renew with an unreadable pod of konnect's: %v\n%s", err, out)
	}
	if readFile(t, podFile) != broken || readFile(t, filepath.Join(dir, "pki", "konnectivity-server.crt")) == certBefore {
		t.Error("the unreadable pod changed, or the certificate was not renewed")
	}

	if os.Geteuid() != 0 {
		t.Skip("making another user's files needs root")
	}
	victim := filepath.Join(t.TempDir(), "victim.yaml")
	if err := os.WriteFile(victim, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(podFile); err != nil {
		t.Fatal(err)
	}
	plant(t, victim, podFile)
	before := tree(t, filepath.Dir(podFile))
	certBefore = readFile(t, filepath.Join(dir, "pki", "konnectivity-server.crt"))
	out, err = run(t, "certs", "renew", "konnectivity-server", "--dir", dir)
	if err == nil || !strings.Contains(err.Error(), podFile) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("renew through another user's symlink: %v\n%s", err, out)
	}
	if got := readFile(t, victim); got != string(data) {
		t.Errorf("the symlink's target changed:\n%s", got)
	}
	if after := tree(t, filepath.Dir(podFile)); !maps.Equal(before, after) {
		t.Errorf("the refused renewal wrote into %s: %v", filepath.Dir(podFile), after)
	}
	if readFile(t, filepath.Join(dir, "pki", "konnectivity-server.crt")) == certBefore {
		t.Error("the certificate was not renewed")
	}
}
