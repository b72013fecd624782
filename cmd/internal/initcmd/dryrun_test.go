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
		"[would be updated] " + manifest + " (replaced --",
		")\n--- " + manifest + "\n+++ " + manifest + " (after this run)\n@@ ",
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

// A dry run names the flags of the manifest that the patch would replace, old → new, as the real run then
// does: the diff shows them too, but among every other line it changes.
func TestDryRunNamesReplacedFlags(t *testing.T) {
	dir := t.TempDir()
	manifest := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	pod := apiserverPod("--requestheader-client-ca-file=/etc/other/ca.crt", "--proxy-client-cert-file=/etc/other/proxy.crt")
	if err := os.WriteFile(manifest, []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
	replaced := func(out, prefix string) string {
		t.Helper()
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, prefix+manifest+" ") {
				if _, r, ok := strings.Cut(l, "replaced "); ok {
					return strings.TrimSuffix(r, ")")
				}
			}
		}
		t.Fatalf("no flags named as replaced on the line of %s:\n%s", manifest, out)
		return ""
	}
	mustRun(t, initArgs(dir)...)
	dry := replaced(mustRun(t, initArgs(dir, "--apiserver-manifest", manifest, "--dry-run")...), "[would be updated] ")
	if now, _ := os.ReadFile(manifest); string(now) != pod {
		t.Fatal("dry run changed the kube-apiserver manifest")
	}
	if want := "--requestheader-client-ca-file /etc/other/ca.crt → " + filepath.Join(dir, "pki", "front-proxy-ca.crt"); !strings.Contains(dry, want) {
		t.Errorf("dry run names %q, want %q among them", dry, want)
	}
	if real := replaced(mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...), "[updated] "); real != dry {
		t.Errorf("the dry run names %q as replaced, the run %q", dry, real)
	}
}
