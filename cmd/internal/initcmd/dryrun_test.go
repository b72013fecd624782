package initcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A dry run shows what it would change in each file it would update, as a unified diff.
func TestDryRunShowsDiff(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "D")
	manifest := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	orig, err := os.ReadFile("../../../manifests/kubeapiserver/testdata/kube-apiserver.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, initArgs(dir, "--key-algorithm", "ecdsa-p256")...)
	before := sums(t, dir)

	out := mustRun(t, initArgs(dir, "--key-algorithm", "ecdsa-p256", "--dry-run", "--mode", "http-connect", "--apiserver-manifest", manifest)...)
	egressFile := filepath.Join(dir, EgressConfigFile)
	for _, want := range []string{
		"[would be updated] " + egressFile + "\n--- " + egressFile + "\n+++ " + egressFile + " (after this run)\n@@ ",
		"\n-    proxyProtocol: GRPC\n",
		"\n+    proxyProtocol: HTTPConnect\n",
		"[would be updated] " + manifest + "\n--- " + manifest + "\n+++ " + manifest + " (after this run)\n@@ ",
		"\n+    - --egress-selector-config-file=" + egressFile + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output has no %q:\n%s", want, out)
		}
	}
	if c := changed(before, sums(t, dir)); len(c) > 0 {
		t.Fatalf("dry run changed %v", c)
	}
	if now, _ := os.ReadFile(manifest); string(now) != string(orig) {
		t.Fatal("dry run changed the kube-apiserver manifest")
	}
	// A file kept as it is gets no diff.
	if strings.Contains(out, "--- "+filepath.Join(dir, FlagsFile)) {
		t.Errorf("dry run shows a diff of %s, which it keeps:\n%s", FlagsFile, out)
	}
}

// A dry run never prints keys or tokens.
func TestDryRunDiffWithholdsSecrets(t *testing.T) {
	for _, tc := range []struct{ old, new string }{
		{"apiVersion: v1\nkind: Secret\ndata:\n  tls.key: b2xk\n", "apiVersion: v1\nkind: Secret\ndata:\n  tls.key: bmV3\n"},
		{"x\n", "-----BEGIN EC PRIVATE KEY-----\n"},
		{"users:\n- user:\n    client-key-data: b2xk\n", "users:\n- user:\n    client-key-data: bmV3\n"},
		{"users:\n- user:\n    token: old\n", "users:\n- user:\n    token: new\n"},
	} {
		d := dryRunDiff("f", []byte(tc.old), []byte(tc.new), true)
		if strings.Contains(d, "b2xk") || strings.Contains(d, "bmV3") || strings.Contains(d, "BEGIN") || strings.Contains(d, "new") ||
			!strings.Contains(d, "key or token") {
			t.Errorf("diff %q -> %q: %q", tc.old, tc.new, d)
		}
	}
	// The static pod is 0600, like kubeadm's, but names its key files only: its diff is shown.
	if d := dryRunDiff("f", []byte("- --mode=grpc\n"), []byte("- --mode=http-connect\n"), true); !strings.Contains(d, "+- --mode=http-connect\n") {
		t.Errorf("diff of a static pod: %q", d)
	}
}
