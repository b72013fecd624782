package initcmd

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// run executes a command tree in-process, as `konnect ARGS` would.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "konnect", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(NewInitCommand(), NewCertsCommand())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("konnect %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// sums maps every file under dir to its mode and sha256.
func sums(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		info, _ := d.Info()
		s := sha256.Sum256(data)
		// The inode changes on every atomic replacement, so a rewrite with equal content counts too.
		ino := info.Sys().(*syscall.Stat_t).Ino
		out[strings.TrimPrefix(p, dir+"/")] = fmt.Sprintf("%s %d %s", info.Mode(), ino, hex.EncodeToString(s[:]))
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

func changed(a, b map[string]string) []string {
	var out []string
	for k, v := range b {
		if a[k] != v {
			out = append(out, k)
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			out = append(out, k+" (removed)")
		}
	}
	slices.Sort(out)
	return out
}

func initArgs(dir string, extra ...string) []string {
	return append([]string{"init", "--dir", dir, "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443"}, extra...)
}

// TestInitAcceptance is the acceptance check: everything written, openssl verify holds for every leaf,
// a second run changes no byte, deleting one leaf regenerates only it.
func TestInitAcceptance(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "D")
	out := mustRun(t, initArgs(dir)...)
	want := []string{
		"pki/ca.crt", "pki/ca.key", "pki/front-proxy-ca.crt", "pki/front-proxy-ca.key",
		"pki/front-proxy-client.crt", "pki/front-proxy-client.key",
		"pki/konnectivity-server-client.crt", "pki/konnectivity-server-client.key",
		"pki/konnectivity-server.crt", "pki/konnectivity-server.key",
		"konnectivity-server.conf", "egress-selector-configuration.yaml", "kube-apiserver.flags",
		"manifests/konnectivity-server.yaml", "konnectivity-agent/kustomization.yaml",
	}
	first := sums(t, dir)
	for _, f := range want {
		if _, ok := first[f]; !ok {
			t.Errorf("%s not written; have %v", f, first)
		}
		shown := filepath.Join(dir, f)
		if strings.HasPrefix(f, "pki/") {
			shown = strings.TrimSuffix(strings.TrimSuffix(shown, ".crt"), ".key") + ".{crt,key}"
		}
		if !strings.Contains(out, "[created] "+shown) {
			t.Errorf("summary lacks %s:\n%s", shown, out)
		}
	}
	for f, v := range first {
		mode := strings.Fields(v)[0]
		if strings.HasSuffix(f, ".key") || f == "konnectivity-server.conf" {
			if mode != "-rw-------" {
				t.Errorf("%s: mode %s", f, mode)
			}
		}
		if strings.HasSuffix(f, ".crt") && mode != "-rw-r--r--" {
			t.Errorf("%s: mode %s", f, mode)
		}
	}
	if strings.Contains(out, "PRIVATE KEY") || strings.Contains(out, "BEGIN") {
		t.Fatal("summary shows key material")
	}

	if openssl, err := exec.LookPath("openssl"); err == nil {
		for _, leaf := range []struct{ name, ca, purpose string }{
			{"front-proxy-client", "front-proxy-ca", "sslclient"},
			{"konnectivity-server-client", "ca", "sslclient"},
			{"konnectivity-server", "ca", "sslserver"},
		} {
			cmd := exec.Command(openssl, "verify", "-purpose", leaf.purpose, "-CAfile",
				filepath.Join(dir, "pki", leaf.ca+".crt"), filepath.Join(dir, "pki", leaf.name+".crt"))
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("openssl verify %s: %v\n%s", leaf.name, err, b)
			}
		}
	}

	out = mustRun(t, initArgs(dir)...)
	if c := changed(first, sums(t, dir)); len(c) > 0 {
		t.Fatalf("second run changed %v", c)
	}
	if strings.Contains(out, "[created]") || strings.Contains(out, "[updated]") || strings.Contains(out, "[renewed]") {
		t.Fatalf("second run reports changes:\n%s", out)
	}

	os.Remove(filepath.Join(dir, "pki/konnectivity-server.crt"))
	os.Remove(filepath.Join(dir, "pki/konnectivity-server.key"))
	mustRun(t, initArgs(dir)...)
	// The server's static pod mounts that pair, so it changes with it and kubelet restarts the server.
	if c := changed(first, sums(t, dir)); !slices.Equal(c, []string{"manifests/konnectivity-server.yaml", "pki/konnectivity-server.crt", "pki/konnectivity-server.key"}) {
		t.Fatalf("deleting one leaf changed %v", c)
	}
}

func TestInitOutputs(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--enable-aggregator-routing")...)

	flags, err := os.ReadFile(filepath.Join(dir, FlagsFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(flags)), "\n")
	line := regexp.MustCompile(`^--[a-z-]+=\S+$`)
	got := map[string]string{}
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Errorf("flags line %q is not --flag=value", l)
		}
		k, v, _ := strings.Cut(strings.TrimPrefix(l, "--"), "=")
		got[k] = v
	}
	for k, v := range map[string]string{
		"requestheader-client-ca-file":       filepath.Join(dir, "pki/front-proxy-ca.crt"),
		"requestheader-allowed-names":        "front-proxy-client",
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-username-headers":     "X-Remote-User",
		"requestheader-uid-headers":          "X-Remote-Uid",
		"proxy-client-cert-file":             filepath.Join(dir, "pki/front-proxy-client.crt"),
		"proxy-client-key-file":              filepath.Join(dir, "pki/front-proxy-client.key"),
		"egress-selector-config-file":        filepath.Join(dir, EgressConfigFile),
		"enable-aggregator-routing":          "true",
	} {
		if got[k] != v {
			t.Errorf("--%s=%q, want %q", k, got[k], v)
		}
	}
	// The server's TokenReviews name the agents' audience; in kube-apiserver's --api-audiences it would make
	// their tokens credentials for its API.
	if v, ok := got["api-audiences"]; ok {
		t.Errorf("--api-audiences=%s: kube-apiserver's audiences are not konnect's to set", v)
	}

	// kube-apiserver's own loader and validation accept the egress configuration.
	sel, err := egressselector.ReadEgressSelectorConfiguration(filepath.Join(dir, EgressConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if errs := egressselector.ValidateEgressSelectorConfiguration(sel); len(errs) > 0 {
		t.Fatal(errs)
	}
	uds := sel.EgressSelections[0].Connection.Transport.UDS
	if uds == nil || uds.UDSName != filepath.Join(dir, "konnectivity-server/konnectivity-server.socket") {
		t.Fatalf("UDS %+v: a non-default --dir puts the socket under it", uds)
	}

	// The static pod runs the server on the socket kube-apiserver dials, with the files init wrote.
	podYAML, err := os.ReadFile(filepath.Join(dir, "manifests/konnectivity-server.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(podYAML, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		t.Fatalf("static pod is a %T", obj)
	}
	args := strings.Join(append(pod.Spec.Containers[0].Command, pod.Spec.Containers[0].Args...), " ")
	for _, want := range []string{
		"--uds-name=" + uds.UDSName,
		"--cluster-cert=" + filepath.Join(dir, "pki/konnectivity-server.crt"),
		"--cluster-key=" + filepath.Join(dir, "pki/konnectivity-server.key"),
		"--kubeconfig=" + filepath.Join(dir, "konnectivity-server.conf"),
		"--mode=grpc",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("static pod lacks %s: %s", want, args)
		}
	}

	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "konnectivity-server.conf"))
	if err != nil || rc.Host != "https://198.18.0.1:6443" {
		t.Fatalf("kubeconfig: %v %v", rc, err)
	}
	block, _ := pem.Decode(rc.CertData)
	cert, _ := x509.ParseCertificate(block.Bytes)
	if cert.Subject.CommonName != "system:konnectivity-server" || len(cert.Subject.Organization) != 0 {
		t.Fatalf("kubeconfig client %v", cert.Subject)
	}
}

func TestInitTCPAndMTLS(t *testing.T) {
	dir := t.TempDir()
	for _, phase := range []string{"certs", "kubeconfig", "egress", "flags"} {
		mustRun(t, "init", "phase", phase, "--dir", dir, "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443",
			"--mode", "http-connect", "--transport", "tcp", "--agent-auth", "mtls", "--key-algorithm", "ecdsa-p256")
	}
	for _, f := range []string{"konnectivity-agent", "konnectivity-frontend", "apiserver-egress-client"} {
		if _, err := os.Stat(filepath.Join(dir, "pki", f+".crt")); err != nil {
			t.Error(err)
		}
	}
	sel, err := egressselector.ReadEgressSelectorConfiguration(filepath.Join(dir, EgressConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if errs := egressselector.ValidateEgressSelectorConfiguration(sel); len(errs) > 0 {
		t.Fatal(errs)
	}
	tcp := sel.EgressSelections[0].Connection.Transport.TCP
	if tcp == nil || tcp.URL != "https://127.0.0.1:8090" || tcp.TLSConfig.ClientCert != filepath.Join(dir, "pki/apiserver-egress-client.crt") ||
		tcp.TLSConfig.CABundle != filepath.Join(dir, "pki/ca.crt") {
		t.Fatalf("TCP %+v", tcp)
	}
	// The frontend's certificate must be valid for the URL kube-apiserver dials.
	frontend, _ := os.ReadFile(filepath.Join(dir, "pki/konnectivity-frontend.crt"))
	ca, _ := os.ReadFile(filepath.Join(dir, "pki/ca.crt"))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	b, _ := pem.Decode(frontend)
	cert, _ := x509.ParseCertificate(b.Bytes)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	// kube-apiserver reads the egress caBundle once, when it starts: a renewed CA reaches it by a restart.
	if out := mustRun(t, "certs", "renew", "ca", "--dir", dir); !strings.Contains(out, "next: restart kube-apiserver: it loads its egress caBundle") {
		t.Errorf("renew ca with --transport tcp printed no kube-apiserver restart:\n%s", out)
	}
}

// TestInitRemovesStaleTemps: the temporary files of a killed run (they may hold a key) are gone after the
// next run, wherever konnect init writes.
// TestInitAgentBundleOutsideStaticPodDir: DIR/manifests is kubelet's static-pod directory when DIR is
// /etc/kubernetes, and kubelet logs an error for each directory there at every scan. A bundle an older
// konnect wrote there moves out whole, with a file the user added.
func TestInitAgentBundleOutsideStaticPodDir(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--server-leases")...)
	entries, err := os.ReadDir(filepath.Join(dir, ManifestsSubdir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("DIR/%s/%s is a directory: kubelet logs an error for it at every scan", ManifestsSubdir, e.Name())
		}
	}

	bundle := filepath.Join(dir, manifests.AgentBundleDir)
	legacy := filepath.Join(dir, ManifestsSubdir, manifests.AgentBundleDir)
	if err := os.Rename(bundle, legacy); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, "user-patch.yaml"), []byte("# the user's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A dry run reads the earlier bundle where it still is: without --server-leases now, its Lease files go.
	if out := mustRun(t, append(initArgs(dir), "--dry-run")...); !strings.Contains(out, "[would be moved] "+legacy+"/ (to "+bundle+":") ||
		!strings.Contains(out, "[would be removed] "+filepath.Join(bundle, "konnectivity-server-leases-role.yaml")) {
		t.Errorf("a dry run does not say the bundle would move, and what would go:\n%s", out)
	}
	if _, err := os.Stat(legacy); err != nil {
		t.Fatalf("a dry run moved the bundle: %v", err)
	}
	if out := mustRun(t, initArgs(dir)...); !strings.Contains(out, "[moved] "+legacy+"/ (to "+bundle+":") {
		t.Errorf("the move is not reported:\n%s", out)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", legacy, err)
	}
	for _, f := range []string{"user-patch.yaml", "kustomization.yaml"} {
		if _, err := os.Stat(filepath.Join(bundle, f)); err != nil {
			t.Errorf("after the move: %v", err)
		}
	}

	// Both there: the old copy is named, not deleted.
	if err := os.Mkdir(legacy, 0o755); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, initArgs(dir)...); !strings.Contains(out, "[kept] "+legacy+"/ (left by an older konnect") {
		t.Errorf("the old copy is not named:\n%s", out)
	}
	if _, err := os.Stat(legacy); err != nil {
		t.Errorf("the old copy was removed: %v", err)
	}
}

// TestInitRemovesStaleBundleFiles: turning --server-leases and --agent-auth mtls off removes the files that
// only they wrote (the Lease grants, the Secret with the agents' key) and says how to delete their objects;
// a file the user listed in the kustomization stays.
func TestInitRemovesStaleBundleFiles(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--server-leases", "--agent-auth", "mtls")...)
	bundle := filepath.Join(dir, manifests.AgentBundleDir)
	// The user's own copy of konnect's DaemonSet, labels and all.
	ds, err := os.ReadFile(filepath.Join(bundle, "konnectivity-agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	user := strings.Replace(string(ds), "name: konnectivity-agent\n", "name: konnectivity-agent-gpu\n", 1)
	if err := os.WriteFile(filepath.Join(bundle, "mine.yaml"), []byte(user), 0o644); err != nil {
		t.Fatal(err)
	}
	// As an earlier release wrote it: the server's Lease Role in kube-system.
	role := filepath.Join(bundle, "konnectivity-server-leases-role.yaml")
	data, err := os.ReadFile(role)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(role, []byte(strings.ReplaceAll(string(data), "namespace: konnectivity-leases", "namespace: kube-system")), 0o644); err != nil {
		t.Fatal(err)
	}
	k, err := os.ReadFile(filepath.Join(bundle, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "kustomization.yaml"), append(k, "- mine.yaml\n"...), 0o644); err != nil {
		t.Fatal(err)
	}

	out := mustRun(t, append(initArgs(dir), "--dry-run")...)
	if !strings.Contains(out, "[would be removed] "+filepath.Join(bundle, "konnectivity-agent-tls.yaml")) {
		t.Errorf("a dry run does not say the Secret would go:\n%s", out)
	}
	out = mustRun(t, initArgs(dir)...)
	for _, f := range []string{"konnectivity-agent-tls.yaml", "konnectivity-leases-namespace.yaml", "konnectivity-server-leases-role.yaml",
		"konnectivity-server-leases-rolebinding.yaml", "konnectivity-agent-leases-role.yaml", "konnectivity-agent-leases-rolebinding.yaml",
		"konnectivity-agent-kubeconfig.yaml"} {
		if _, err := os.Stat(filepath.Join(bundle, f)); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", f, err)
		}
		if !strings.Contains(out, "[removed] "+filepath.Join(bundle, f)) {
			t.Errorf("the removal of %s is not reported", f)
		}
	}
	for _, want := range []string{"kubectl delete secret konnectivity-agent-tls -n kube-system", "kubectl delete role konnectivity-server-leases -n kube-system", "kubectl delete namespace konnectivity-leases"} {
		if !strings.Contains(out, want) {
			t.Errorf("the summary does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(bundle, "mine.yaml")); err != nil || strings.Contains(out, "konnectivity-agent-gpu") {
		t.Errorf("the user's file: %v\n%s", err, out)
	}

	// With leases on again, a Role that an earlier bundle put in kube-system is named for deletion although
	// its file stays.
	mustRun(t, initArgs(dir, "--server-leases")...)
	if err := os.WriteFile(role, []byte(strings.ReplaceAll(string(data), "namespace: konnectivity-leases", "namespace: kube-system")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, initArgs(dir, "--server-leases")...); !strings.Contains(out, "[left in the cluster] role konnectivity-server-leases -n kube-system") {
		t.Errorf("the Role left in kube-system is not named:\n%s", out)
	}
}

// TestInitKeepsUserKustomization: what a user adds to the bundle's kustomization.yaml (a patch of the
// DaemonSet, a manifest of their own) stays through later runs, also one that drops a file of konnect's;
// konnect's own list is kept up to date, and a run that changes nothing changes no byte.
func TestInitKeepsUserKustomization(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--server-leases")...)
	kpath := filepath.Join(dir, manifests.AgentBundleDir, "kustomization.yaml")
	k, err := os.ReadFile(kpath)
	if err != nil {
		t.Fatal(err)
	}
	added := "- mine.yaml\npatches:\n- path: surge.yaml\n  target:\n    kind: DaemonSet\n"
	if err := os.WriteFile(kpath, append(k, added...), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, initArgs(dir)...) // --server-leases off: its files leave the bundle
	var got struct {
		Resources []string
		Patches   []struct{ Path string }
	}
	data, _ := os.ReadFile(kpath)
	if err := yaml.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Patches) != 1 || got.Patches[0].Path != "surge.yaml" || !slices.Contains(got.Resources, "mine.yaml") ||
		!slices.Contains(got.Resources, "konnectivity-agent.yaml") || slices.Contains(got.Resources, "konnectivity-agent-kubeconfig.yaml") {
		t.Fatalf("kustomization.yaml after a rerun:\n%s", data)
	}
	before := sums(t, dir)
	mustRun(t, initArgs(dir)...)
	if c := changed(before, sums(t, dir)); len(c) > 0 {
		t.Fatalf("a run that changes nothing changed %v", c)
	}
}

func TestInitRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir)...)
	var stale []string
	for _, f := range []string{FlagsFile, "manifests/konnectivity-server.yaml", "konnectivity-agent/konnectivity-agent.yaml", "pki/ca.key"} {
		p := filepath.Join(dir, filepath.Dir(f), "."+filepath.Base(f)+".tmp-12345")
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
		stale = append(stale, p)
	}
	mustRun(t, initArgs(dir)...)
	for _, p := range stale {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
}

// TestInitNamesReplacedFlags: flags the manifest had with other values are replaced, and init says which, with
// the old value and the new, on the manifest's line: another front proxy whose client CA was
// --requestheader-client-ca-file stops working, and nothing else would tell. The requestheader lists, which
// the patch adds to, are not among them, and a second run, which changes nothing, names nothing.
func TestInitNamesReplacedFlags(t *testing.T) {
	dir := t.TempDir()
	manifest := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	pod := apiserverPod("--requestheader-client-ca-file=/etc/other/ca.crt", "--requestheader-allowed-names=other-proxy", "--egress-selector-config-file=/etc/other/egress.yaml", "--proxy-client-cert-file=/etc/other/proxy.crt")
	if err := os.WriteFile(manifest, []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...)
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[updated] "+manifest+" ") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("patch not reported:\n%s", out)
	}
	for _, want := range []string{
		"(backup ",
		"; replaced ",
		"--requestheader-client-ca-file /etc/other/ca.crt → " + filepath.Join(dir, "pki", "front-proxy-ca.crt"),
		"--egress-selector-config-file /etc/other/egress.yaml → " + filepath.Join(dir, EgressConfigFile),
		"--proxy-client-cert-file /etc/other/proxy.crt → " + filepath.Join(dir, "pki", "front-proxy-client.crt"),
	} {
		if !strings.Contains(line, want) {
			t.Errorf("the manifest's line lacks %q:\n%s", want, line)
		}
	}
	if strings.Contains(line, "allowed-names") || strings.Contains(line, "proxy-client-key-file") {
		t.Errorf("a list the patch adds to, or a flag the manifest did not have, is named as replaced:\n%s", line)
	}
	if out := mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...); strings.Contains(out, "replaced") {
		t.Errorf("a second run, which changes nothing, names replaced flags:\n%s", out)
	}
}

func TestInitBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"init", "--control-plane-address", "bad address", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address"},
		// Shaped like IP addresses but not valid ones: as DNS names they would land in the SANs (issue 11).
		{[]string{"init", "--control-plane-address", "999.1.1.1", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address"},
		{[]string{"init", "--control-plane-address", "10.0.0", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address"},
		{[]string{"init", "--control-plane-address", "fd00::1::2", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address"},
		// Addresses agents cannot dial, which init rendered as their --proxy-server-host.
		{[]string{"init", "--control-plane-address", "0.0.0.0", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address: 0.0.0.0 is the unspecified address"},
		{[]string{"init", "--control-plane-address", "::", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address: :: is the unspecified address"},
		{[]string{"init", "--control-plane-address", "224.0.0.1", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address: 224.0.0.1 is a multicast address"},
		{[]string{"init", "--control-plane-address", "ff02::1", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address: ff02::1 is a multicast address"},
		{[]string{"init", "--control-plane-address", "255.255.255.255", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address: 255.255.255.255 is the broadcast address"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--control-plane-address", "::ffff:0.0.0.0", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address: ::ffff:0.0.0.0"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "http://198.18.0.1:6443"}, "--apiserver-url"},
		{[]string{"init", "--control-plane-address", "198.18.0.1"}, "--apiserver-url is required"},
		{[]string{"init", "--apiserver-url", "https://198.18.0.1:6443"}, "--control-plane-address is required"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--key-algorithm", "rsa-1024"}, "--key-algorithm"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--transport", "tcp"}, "--mode"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--mode", "ssh"}, "--mode"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--transport", "quic"}, `--transport "quic": must be "uds" or "tcp"`},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--transport", "tcp"}, "use --transport uds, or --mode http-connect for TCP"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--agent-auth", "none"}, "--agent-auth"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--cert-validity-period", "100000h"}, "--cert-validity-period"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--apiserver-manifest", "/nonexistent/kube-apiserver.yaml"}, "--apiserver-manifest"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:99999"}, "--apiserver-url"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--apiserver-manifest", notAPod(t)}, "not a v1 Pod"},
		// Agents on other nodes watch the Leases at --apiserver-url.
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://127.0.0.1:6443", "--server-leases"}, "--apiserver-url (with --server-leases)"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--server-leases"}, "--server-leases needs --apiserver-url"},
		// The socket's directory is mounted read-write into the server's pod: not DIR or above.
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--uds-name", "DIR/konnectivity-server.socket"}, "--uds-name"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--uds-name", "/konnectivity-server.socket"}, "--uds-name"},
		// The server's static pod is checked before any phase writes.
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--image", "registry.example/konnect v1"}, "--image"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--mode", "http-connect", "--transport", "tcp", "--frontend-port", "8133"}, "--frontend-port 8133"},
		// A flag for another set-up than the others make is refused, not ignored.
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--frontend-port", "9999"}, "--frontend-port applies only with --transport tcp"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--mode", "http-connect", "--transport", "tcp", "--uds-name", "/tmp/x.sock"}, "--uds-name applies only with --transport uds"},
		{[]string{"init", "--control-plane-address", "198.18.0.1", "--apiserver-url", "https://198.18.0.1:6443", "--kubeadm-kubeconfig", "/etc/kubernetes/super-admin.conf"}, "--kubeadm-kubeconfig applies only with --kubeadm"},
	} {
		dir := t.TempDir()
		args := slices.Clone(tc.args)
		for i := range args {
			args[i] = strings.Replace(args[i], "DIR/", dir+"/", 1)
		}
		out, err := run(t, append(args, "--dir", dir)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s\n%s", tc.args, err, tc.want, out)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("%v wrote %v", tc.args, entries)
		}
	}
}

// TestInitSocketDirOthersCanChange: a --uds-name directory that another user could change, which the server
// refuses to bind in, is refused by init too, naming --uds-name and --allow-shared-uds-dir; with that flag
// init accepts it and passes the flag into the server's pod, so that the server starts. A sticky directory
// (as /tmp) needs no flag.
func TestInitSocketDirOthersCanChange(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(open, "konnectivity", "konnectivity-server.socket")
	dir := t.TempDir()
	out, err := run(t, initArgs(dir, "--uds-name", sock)...)
	if err == nil || !strings.Contains(err.Error(), "--uds-name "+sock) || !strings.Contains(err.Error(), open+" is writable by everyone") ||
		!strings.Contains(err.Error(), "--allow-shared-uds-dir") {
		t.Fatalf("socket below a directory everyone may write to: %v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("the refused run wrote %v", entries)
	}
	serverArgs := func(dir string) []string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(dir, ManifestsSubdir, "konnectivity-server.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := yaml.Unmarshal(data, &pod); err != nil {
			t.Fatal(err)
		}
		return pod.Spec.Containers[0].Args
	}
	mustRun(t, initArgs(dir, "--uds-name", sock, "--allow-shared-uds-dir")...)
	if args := serverArgs(dir); !slices.Contains(args, "--allow-shared-uds-dir") || !slices.Contains(args, "--uds-name="+sock) {
		t.Errorf("the server's pod lacks --allow-shared-uds-dir: %v", args)
	}

	sticky := filepath.Join(t.TempDir(), "sticky")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	mustRun(t, initArgs(other, "--uds-name", filepath.Join(sticky, "k", "konnectivity-server.socket"))...)
	if args := serverArgs(other); slices.Contains(args, "--allow-shared-uds-dir") {
		t.Errorf("a sticky directory got --allow-shared-uds-dir: %v", args)
	}
}

// TestInitRefusesSharedSocketDir: kube-apiserver and the server's pod, which runs as root, mount the socket's
// directory read-write, so one that holds anything else (/run, with the container runtime's socket) is
// refused, naming the flag; one that is empty or holds only the socket (a server runs) is the socket's own.
func TestInitRefusesSharedSocketDir(t *testing.T) {
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "containerd.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out, err := run(t, initArgs(dir, "--uds-name", filepath.Join(shared, "konnectivity-server.socket"))...)
	if err == nil || !strings.Contains(err.Error(), "--uds-name") || !strings.Contains(err.Error(), "holds containerd.sock") {
		t.Fatalf("socket beside containerd.sock: %v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("the refused run wrote %v", entries)
	}
	own := t.TempDir()
	sock := filepath.Join(own, "konnectivity-server.socket")
	mustRun(t, initArgs(t.TempDir(), "--uds-name", sock)...)
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, initArgs(t.TempDir(), "--uds-name", sock)...)
}

func TestInitDryRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "D")
	out := mustRun(t, initArgs(dir, "--dry-run")...)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("dry run created %s", dir)
	}
	for _, f := range []string{"pki/ca.{crt,key}", "konnectivity-server.conf", EgressConfigFile, FlagsFile, "manifests/konnectivity-server.yaml"} {
		if !strings.Contains(out, "[would be created] "+filepath.Join(dir, f)) {
			t.Errorf("dry run does not list %s:\n%s", f, out)
		}
	}
	// The agents' files need the CA: the dry run says so rather than list a set the real run would not write.
	if !strings.Contains(out, "[would be created] "+filepath.Join(dir, "konnectivity-agent")+"/ (rendered once the certs phase has written ca.crt)") {
		t.Errorf("dry run does not say the agent manifests wait for ca.crt:\n%s", out)
	}
	mustRun(t, initArgs(dir)...)
	before := sums(t, dir)
	out = mustRun(t, initArgs(dir, "--dry-run", "--control-plane-address", "198.18.0.2", "--force")...)
	if !strings.Contains(out, "[would be renewed] "+filepath.Join(dir, "pki/konnectivity-server.crt")) {
		t.Errorf("dry run with a new address:\n%s", out)
	}
	if c := changed(before, sums(t, dir)); len(c) > 0 {
		t.Fatalf("dry run changed %v", c)
	}
}

func TestInitPhases(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, "init", "phase", "kubeconfig", "--dir", dir, "--apiserver-url", "https://198.18.0.1:6443")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "pki/ca.crt")) {
		t.Fatalf("kubeconfig before certs: %v\n%s", err, out)
	}
	mustRun(t, "init", "phase", "certs", "konnectivity-server", "--dir", dir, "--control-plane-address", "198.18.0.1")
	var files []string
	for f := range sums(t, dir) {
		files = append(files, f)
	}
	slices.Sort(files)
	if want := []string{"pki/ca.crt", "pki/ca.key", "pki/konnectivity-server.crt", "pki/konnectivity-server.key"}; !slices.Equal(files, want) {
		t.Fatalf("phase certs konnectivity-server wrote %v", files)
	}
	mustRun(t, "init", "phase", "certs", "front-proxy-client", "--dir", dir)
	mustRun(t, "init", "phase", "egress", "--dir", dir)
	mustRun(t, "init", "phase", "flags", "--dir", dir)
	for _, f := range []string{EgressConfigFile, FlagsFile, "pki/front-proxy-ca.crt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	// Help and subcommands come from the certificate table.
	help := mustRun(t, "init", "phase", "certs", "--help")
	for _, s := range pki.Specs() {
		if !strings.Contains(help, s.Name) || !strings.Contains(help, s.Description) {
			t.Errorf("phase certs help lacks %s", s.Name)
		}
		if _, err := run(t, "init", "phase", "certs", s.Name, "--help"); err != nil {
			t.Errorf("no subcommand %s: %v", s.Name, err)
		}
	}
	help = mustRun(t, "init", "--help")
	for _, p := range []string{"pki/ca.{crt,key}", "konnectivity-server.conf", EgressConfigFile, FlagsFile} {
		if !strings.Contains(help, p) {
			t.Errorf("init help lacks %s", p)
		}
	}
}

// TestInitPhaseUnknownBehindFlags: an unknown phase is named as such also when flags come before it; the flag,
// which every phase takes, is not blamed, nor is its value taken for the phase.
func TestInitPhaseUnknownBehindFlags(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"init", "phase", "--dir", dir, "bogus"},
		{"init", "phase", "--dry-run", "bogus"},
		{"init", "phase", "--dir=" + dir, "--control-plane-address", "198.18.0.1", "bogus", "--force"},
	} {
		out, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), `unknown command "bogus" for "konnect init phase"`) {
			t.Errorf("konnect %s: %v, want the unknown phase bogus named\n%s", strings.Join(args, " "), err, out)
		}
	}
	if help := mustRun(t, "init", "phase", "--help"); strings.Contains(help, "--dir") {
		t.Errorf("init phase --help lists the phases' flags:\n%s", help)
	}
}

// TestInitPhaseWithFlagsButNoName: flags without a phase name (a script's empty $PHASE) are an error naming the
// phases, not help and success; without flags, konnect init phase prints its help.
func TestInitPhaseWithFlagsButNoName(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"init", "phase", "--dir", dir, "--force"},
		{"init", "phase", "--dry-run"},
		{"init", "phase", "--dir=" + dir},
	} {
		out, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), "name a phase: certs, kubeconfig, egress, kubeadm, flags, manifests") {
			t.Errorf("konnect %s: %v, want an error naming the phases\n%s", strings.Join(args, " "), err, out)
		}
	}
	if help := mustRun(t, "init", "phase"); !strings.Contains(help, "Run one phase of konnect init") {
		t.Errorf("konnect init phase:\n%s", help)
	}
}

func TestInitPatchesAPIServerManifest(t *testing.T) {
	dir := t.TempDir()
	manifest := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	pod := apiserverPod("--advertise-address=198.18.0.1", "--service-account-issuer=https://kubernetes.default.svc.cluster.local")
	if err := os.WriteFile(manifest, []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...)
	if !strings.Contains(out, "[updated] "+manifest) {
		t.Fatalf("patch not reported:\n%s", out)
	}
	data, _ := os.ReadFile(manifest)
	for _, want := range []string{"--egress-selector-config-file=" + filepath.Join(dir, EgressConfigFile), "--advertise-address=198.18.0.1", "--requestheader-uid-headers=X-Remote-Uid"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("patched manifest lacks %s", want)
		}
	}
	if !strings.Contains(string(data), kubeapiserver.EgressConfigAnnotation+": ") {
		t.Errorf("patched manifest lacks the annotation %s", kubeapiserver.EgressConfigAnnotation)
	}
	before := sums(t, filepath.Dir(manifest))
	out = mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...)
	if !strings.Contains(out, "[kept] "+manifest) {
		t.Fatalf("second patch:\n%s", out)
	}
	if c := changed(before, sums(t, filepath.Dir(manifest))); len(c) > 0 {
		t.Fatalf("second run changed %v", c)
	}

	// Another --mode changes the egress selector configuration, which kube-apiserver reads only when it
	// starts: its pod changes too (the configuration's hash), so kubelet restarts it.
	out = mustRun(t, initArgs(dir, "--apiserver-manifest", manifest, "--mode", "http-connect")...)
	if !strings.Contains(out, "[updated] "+manifest) {
		t.Fatalf("a new --mode left kube-apiserver's pod as it was:\n%s", out)
	}
	out = mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...)
	if !strings.Contains(out, "[updated] "+manifest) {
		t.Fatalf("the first --mode again left kube-apiserver's pod as it was:\n%s", out)
	}
	if back, _ := os.ReadFile(manifest); string(back) != string(data) {
		t.Fatalf("back at the first --mode, the pod differs from the first patch:\n%s", back)
	}

	// --enable-aggregator-routing, once asked for and then no longer, leaves the pod as it was before.
	withRouting := mustRun(t, initArgs(dir, "--apiserver-manifest", manifest, "--enable-aggregator-routing")...)
	if patched, _ := os.ReadFile(manifest); !strings.Contains(string(patched), "--enable-aggregator-routing=true") {
		t.Fatalf("--enable-aggregator-routing not patched in:\n%s\n%s", withRouting, patched)
	}
	mustRun(t, initArgs(dir, "--apiserver-manifest", manifest)...)
	if back, _ := os.ReadFile(manifest); string(back) != string(data) {
		t.Fatalf("without --enable-aggregator-routing again, the pod differs from before it:\n%s", back)
	}
	before = sums(t, filepath.Dir(manifest))

	// The flags phase alone on a fresh directory would point kube-apiserver at files that do not exist:
	// refused, and the manifest is left alone.
	fresh := t.TempDir()
	if _, err := run(t, "init", "phase", "flags", "--dir", fresh, "--apiserver-manifest", manifest); err == nil ||
		!strings.Contains(err.Error(), "--apiserver-manifest") || !strings.Contains(err.Error(), fresh) {
		t.Fatalf("flags phase before the certs and egress phases: %v", err)
	}
	if c := changed(before, sums(t, filepath.Dir(manifest))); len(c) > 0 {
		t.Fatalf("refused patch changed %v", c)
	}
	if entries, _ := os.ReadDir(fresh); len(entries) > 0 {
		t.Fatalf("the refused flags phase wrote %v", entries)
	}

	// A bad input of a later phase is refused before kube-apiserver is patched to dial a server that
	// would never be set up.
	if _, err := run(t, initArgs(fresh, "--apiserver-manifest", manifest, "--image", "registry.example/konnect v1")...); err == nil || !strings.Contains(err.Error(), "--image") {
		t.Fatalf("bad --image: %v", err)
	}
	if c := changed(before, sums(t, filepath.Dir(manifest))); len(c) > 0 {
		t.Fatalf("a run refused for --image changed %v", c)
	}
}

func TestCertsCommands(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--key-algorithm", "ecdsa-p256")...)

	out := mustRun(t, "certs", "check-expiration", "--dir", dir, "-o", "json")
	var doc struct {
		Certificates []pki.Expiration `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Certificates) != 6 || strings.Contains(out, "PRIVATE") {
		t.Fatalf("check-expiration: %s", out)
	}
	text := mustRun(t, "certs", "check-expiration", "--dir", dir)
	if !strings.Contains(text, "RESIDUAL TIME") || !strings.Contains(text, "konnectivity-server.conf") {
		t.Fatalf("text: %s", text)
	}
	if _, err := run(t, "certs", "check-expiration", "--dir", dir, "-o", "yaml"); err == nil || !strings.Contains(err.Error(), "--output") {
		t.Fatalf("-o yaml: %v", err)
	}

	before := sums(t, dir)
	out = mustRun(t, "certs", "renew", "all", "--dir", dir)
	c := changed(before, sums(t, dir))
	want := []string{"konnectivity-server.conf", "manifests/konnectivity-server.yaml", "pki/front-proxy-client.crt", "pki/konnectivity-server-client.crt", "pki/konnectivity-server.crt"}
	if !slices.Equal(c, want) {
		t.Fatalf("renew all changed %v, want %v\n%s", c, want, out)
	}
	// The server's static pod pins its certificate files: renew changes the pod so that kubelet restarts it,
	// and says so, once (TestCertsRenewRestartsServerPod).
	if n := strings.Count(out, "next: "+serverRestartsStep); n != 1 {
		t.Errorf("renew all says %d times that the server pod restarts:\n%s", n, out)
	}
	// The agents' certificate reaches them in the bundle's Secret, which only init writes.
	mtls := t.TempDir()
	mustRun(t, initArgs(mtls, "--agent-auth", "mtls")...)
	if out := mustRun(t, "certs", "renew", "konnectivity-agent", "--dir", mtls); !strings.Contains(out, "next: run konnect init again and re-apply "+filepath.Join(mtls, manifests.AgentBundleDir)) {
		t.Errorf("renew konnectivity-agent does not say how the agents get it:\n%s", out)
	}
	// The cluster CA reaches the agents in the bundle's ConfigMap. Without the server pod in DIR/manifests,
	// renew cannot tell whether the server reads the kubeconfig, and says to restart it.
	if err := os.Remove(filepath.Join(mtls, ManifestsSubdir, manifests.ServerPodFile)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"konnectivity-server-client", "ca"} {
		out := mustRun(t, "certs", "renew", name, "--dir", mtls)
		if !strings.Contains(out, "next: restart the konnectivity-server static pod") {
			t.Errorf("renew %s does not say to restart the server:\n%s", name, out)
		}
		if agents := strings.Contains(out, "its ConfigMap carries ca.crt to the agents"); agents != (name == "ca") {
			t.Errorf("renew %s: says to re-apply the agents' ConfigMap: %v\n%s", name, agents, out)
		}
	}
	// Everything still passes init's checks, and init finds the server's static pod as renew left it.
	before = sums(t, dir)
	mustRun(t, initArgs(dir, "--key-algorithm", "ecdsa-p256")...)
	if c := changed(before, sums(t, dir)); len(c) > 0 {
		t.Fatalf("init after renew changed %v", c)
	}
	if _, err := run(t, "certs", "renew", "--dir", dir); err == nil {
		t.Fatal("renew without a name")
	}

	apiDir := filepath.Join(t.TempDir(), "out")
	mustRun(t, "certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1", "--out", apiDir, "--key-algorithm", "ecdsa-p256")
	apiservice, err := os.ReadFile(filepath.Join(apiDir, "apiservice.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(apiservice), "insecureSkipTLSVerify") || !strings.Contains(string(apiservice), "caBundle:") {
		t.Fatalf("apiservice.yaml:\n%s", apiservice)
	}
	// Both versions of a server in one run; a later run with one of them says what it drops.
	out = mustRun(t, "certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1,v1beta1", "--out", apiDir)
	if apiservice, _ = os.ReadFile(filepath.Join(apiDir, "apiservice.yaml")); strings.Count(string(apiservice), "caBundle:") != 2 || !strings.Contains(string(apiservice), "name: v1beta1.restaurant.example.com") {
		t.Fatalf("two versions: %s\napiservice.yaml:\n%s", out, apiservice)
	}
	if out := mustRun(t, "certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1beta1", "--out", apiDir); !strings.Contains(out, "no longer lists v1alpha1.restaurant.example.com") {
		t.Errorf("dropping a version is not named:\n%s", out)
	}
	if _, err := run(t, "certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "Bad_Group", "--version", "v1", "--out", filepath.Join(t.TempDir(), "x")); err == nil || !strings.Contains(err.Error(), "--group") {
		t.Fatalf("bad group: %v", err)
	}
	if _, err := run(t, "certs", "apiservice", "--namespace", "pizza"); err == nil || !strings.Contains(err.Error(), "--service is required") {
		t.Fatalf("missing --service: %v", err)
	}
}

func TestInitTCPStaticPod(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir, "--mode", "http-connect", "--transport", "tcp", "--key-algorithm", "ecdsa-p256", "--frontend-port", "8091")...)
	data, err := os.ReadFile(filepath.Join(dir, "manifests/konnectivity-server.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := obj.(*corev1.Pod).Spec.Containers[0]
	args := strings.Join(append(c.Command, c.Args...), " ")
	for _, want := range []string{
		"--mode=http-connect",
		"--server-port=8091",
		"--server-cert=" + filepath.Join(dir, "pki/konnectivity-frontend.crt"),
		"--server-key=" + filepath.Join(dir, "pki/konnectivity-frontend.key"),
		"--server-ca-cert=" + filepath.Join(dir, "pki/ca.crt"),
		// The cluster CA also signs kubelets' and users' certificates: only kube-apiserver's is let in.
		"--server-allowed-names=apiserver-egress-client",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("static pod lacks %s: %s", want, args)
		}
	}
	if strings.Contains(args, "--uds-name") {
		t.Errorf("TCP static pod with --uds-name: %s", args)
	}
	sel, err := egressselector.ReadEgressSelectorConfiguration(filepath.Join(dir, EgressConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if u := sel.EgressSelections[0].Connection.Transport.TCP.URL; u != "https://127.0.0.1:8091" {
		t.Errorf("egress URL %s", u)
	}
}

// TestInitManifestWithoutAPIServerNamesFlag: a manifest with no kube-apiserver container is refused before
// anything is written, with an error that names the file and the flag that named it: --apiserver-manifest, or
// --kubeadm when that chose kubeadm's manifest. It used to surface only in the flags phase, after the PKI was
// written, naming the file alone.
func TestInitManifestWithoutAPIServerNamesFlag(t *testing.T) {
	etcd := filepath.Join(t.TempDir(), "etcd.yaml")
	if err := os.WriteFile(etcd, []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\nspec:\n  containers:\n  - name: etcd\n    image: etcd\n    command: [etcd]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "--apiserver-manifest: " + etcd + ": pod etcd: no kube-apiserver container"
	for _, args := range [][]string{
		initArgs("DIR", "--apiserver-manifest", etcd),
		{"init", "phase", "flags", "--dir", "DIR", "--apiserver-manifest", etcd},
	} {
		dir := t.TempDir()
		args = slices.Clone(args)
		args[slices.Index(args, "DIR")] = dir
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: error = %v, want one containing %q", args, err, want)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("%v wrote %v", args, entries)
		}
	}

	// --kubeadm alone patches kubeadm's manifest, which this test cannot write: it stands in for it.
	o := NewOptions()
	o.Kubeadm = true
	if err := o.Complete(nil); err != nil {
		t.Fatal(err)
	}
	o.Dir, o.APIServerManifest = t.TempDir(), etcd
	if err := o.Validate(needs{}); err == nil || !strings.Contains(err.Error(), "--kubeadm: "+etcd+": pod etcd: no kube-apiserver container") {
		t.Errorf("with --kubeadm: error = %v", err)
	}
	o = NewOptions()
	o.Kubeadm, o.APIServerManifest = true, etcd
	if err := o.Complete(nil); err != nil {
		t.Fatal(err)
	}
	if got := o.manifestFlag(); got != "--apiserver-manifest" {
		t.Errorf("--kubeadm with --apiserver-manifest: errors name %s", got)
	}
}

// notAPod writes a manifest that is valid YAML but a Service, not the kube-apiserver Pod.
func notAPod(t *testing.T) string {
	f := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	if err := os.WriteFile(f, []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: kube-apiserver\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestInitAgentMTLS runs konnect init with client-certificate agent authentication and checks that the
// rendered server and agent arguments name files that exist and fit together: the server verifies
// agents against the CA that signed the certificate shipped in the agents' Secret.
func TestInitAgentMTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "D")
	mtls := initArgs(dir, "--agent-auth", "mtls", "--key-algorithm", "ecdsa-p256")

	// A dry run on a fresh directory writes nothing and shows no key.
	out := mustRun(t, append(mtls, "--dry-run")...)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("dry run created %s", dir)
	}
	if !strings.Contains(out, "[would be created] "+filepath.Join(dir, "konnectivity-agent")) {
		t.Errorf("dry run does not list the agent manifests:\n%s", out)
	}

	// kubeadm does not copy the agents' CA to other control-plane nodes: init says to.
	if out := mustRun(t, mtls...); !strings.Contains(out, "konnectivity-agent-ca.{crt,key} (with several control-plane nodes, copy it") {
		t.Errorf("init does not say to copy the agents' CA:\n%s", out)
	}
	decode := func(name string) any {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer().Decode(data, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return obj
	}
	flags := func(c corev1.Container) map[string]string {
		m := map[string]string{}
		for _, a := range c.Args[1:] {
			k, v, _ := strings.Cut(a, "=")
			m[k] = v
		}
		return m
	}

	pod := decode("manifests/konnectivity-server.yaml").(*corev1.Pod)
	server := flags(pod.Spec.Containers[0])
	// The agents' own CA: kube-apiserver trusts the cluster CA, and must not take the agents' certificate.
	if server["--cluster-ca-cert"] != filepath.Join(dir, "pki/konnectivity-agent-ca.crt") {
		t.Errorf("--cluster-ca-cert=%q, want %s", server["--cluster-ca-cert"], filepath.Join(dir, "pki/konnectivity-agent-ca.crt"))
	}
	for _, f := range []string{"--kubeconfig", "--agent-namespace", "--agent-service-account", "--authentication-audience"} {
		if _, ok := server[f]; ok {
			t.Errorf("static pod has %s with client-certificate agents: %q", f, pod.Spec.Containers[0].Args)
		}
	}
	for _, f := range []string{"--cluster-ca-cert", "--cluster-cert", "--cluster-key"} {
		mounted := false
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			mounted = mounted || m.MountPath == server[f] || strings.HasPrefix(server[f], m.MountPath+"/")
		}
		if _, err := os.Stat(server[f]); err != nil || !mounted {
			t.Errorf("%s=%s: mounted %v, %v", f, server[f], mounted, err)
		}
	}

	agentDir := filepath.Join(dir, "konnectivity-agent")
	secret := decode("konnectivity-agent/konnectivity-agent-tls.yaml").(*corev1.Secret)
	if info, err := os.Stat(filepath.Join(agentDir, "konnectivity-agent-tls.yaml")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("Secret file: %v, mode %v", err, info.Mode())
	}
	wantCert, _ := os.ReadFile(filepath.Join(dir, "pki/konnectivity-agent.crt"))
	wantKey, _ := os.ReadFile(filepath.Join(dir, "pki/konnectivity-agent.key"))
	if secret.Type != corev1.SecretTypeTLS || secret.Name != "konnectivity-agent-tls" || secret.Namespace != "kube-system" ||
		!bytes.Equal(secret.Data["tls.crt"], wantCert) || !bytes.Equal(secret.Data["tls.key"], wantKey) || len(wantKey) == 0 {
		t.Fatalf("Secret %s/%s type %s does not hold DIR/pki/konnectivity-agent.{crt,key}", secret.Namespace, secret.Name, secret.Type)
	}
	// The certificate the agents present passes the check the server makes with --cluster-ca-cert.
	ca, _ := os.ReadFile(server["--cluster-ca-cert"])
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	b, _ := pem.Decode(secret.Data["tls.crt"])
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("agent certificate against --cluster-ca-cert: %v", err)
	}
	clusterCA, _ := os.ReadFile(filepath.Join(dir, "pki/ca.crt"))
	clusterRoots := x509.NewCertPool()
	clusterRoots.AppendCertsFromPEM(clusterCA)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: clusterRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the agent certificate verifies against the cluster CA, kube-apiserver's --client-ca-file")
	}
	// And its common name is the one the server allows.
	if allowed := server["--cluster-allowed-names"]; allowed != cert.Subject.CommonName || allowed != "konnectivity-agent" {
		t.Errorf("--cluster-allowed-names=%q, agent certificate CN %q", allowed, cert.Subject.CommonName)
	}

	ds := decode("konnectivity-agent/konnectivity-agent.yaml").(*appsv1.DaemonSet)
	agent := flags(ds.Spec.Template.Spec.Containers[0])
	if _, ok := agent["--service-account-token-path"]; ok {
		t.Errorf("agent has --service-account-token-path: %q", ds.Spec.Template.Spec.Containers[0].Args)
	}
	if agent["--agent-cert"] == "" || agent["--agent-key"] == "" {
		t.Errorf("agent args %q lack --agent-cert/--agent-key", ds.Spec.Template.Spec.Containers[0].Args)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil {
				t.Errorf("volume %s projects a service-account token", v.Name)
			}
		}
	}
	for _, f := range []string{"konnectivity-server-clusterrole.yaml", "konnectivity-server-rbac.yaml"} {
		if _, err := os.Stat(filepath.Join(agentDir, f)); !os.IsNotExist(err) {
			t.Errorf("TokenReview RBAC %s rendered for client-certificate agents: %v", f, err)
		}
	}

	// Not t.Skip: the idempotence and key-hiding checks below must run without kubectl too.
	if kubectl, err := exec.LookPath("kubectl"); err != nil {
		t.Log("kubectl not installed: kubectl kustomize not checked")
	} else {
		kust, err := exec.Command(kubectl, "kustomize", agentDir).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl kustomize: %v\n%s", err, kust)
		}
		for _, kind := range []string{"kind: Secret", "kind: ConfigMap", "kind: ServiceAccount", "kind: DaemonSet"} {
			if !bytes.Contains(kust, []byte("\n"+kind+"\n")) {
				t.Errorf("kubectl kustomize output lacks %s", kind)
			}
		}
	}

	// A second run changes nothing, and a dry run over the result neither shows nor touches the key.
	before := sums(t, dir)
	mustRun(t, mtls...)
	out = mustRun(t, append(mtls, "--dry-run")...)
	if c := changed(before, sums(t, dir)); len(c) > 0 {
		t.Errorf("second run changed %v", c)
	}
	if strings.Contains(out, "PRIVATE KEY") || strings.Contains(out, base64.StdEncoding.EncodeToString(wantKey)[:40]) {
		t.Errorf("dry run prints key material:\n%s", out)
	}
}

// --server-leases turns on the server's lease controller and the agents' lease counting, with the Roles both
// need; with client-certificate agents too, where the server then keeps its kubeconfig for the Leases alone.
func TestInitServerLeases(t *testing.T) {
	for _, auth := range []string{"token", "mtls"} {
		dir := filepath.Join(t.TempDir(), "D")
		mustRun(t, initArgs(dir, "--agent-auth", auth, "--key-algorithm", "ecdsa-p256", "--server-leases")...)
		pod, err := os.ReadFile(filepath.Join(dir, "manifests/konnectivity-server.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"--enable-lease-controller", "--kubeconfig=" + filepath.Join(dir, "konnectivity-server.conf")} {
			if !strings.Contains(string(pod), want) {
				t.Errorf("%s: the server pod lacks %s", auth, want)
			}
		}
		agentDir := filepath.Join(dir, "konnectivity-agent")
		ds, err := os.ReadFile(filepath.Join(agentDir, "konnectivity-agent.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(ds), "--count-server-leases") {
			t.Errorf("%s: the DaemonSet lacks --count-server-leases", auth)
		}
		kc, err := os.ReadFile(filepath.Join(agentDir, "konnectivity-agent-kubeconfig.yaml"))
		if err != nil || !strings.Contains(string(kc), "https://198.18.0.1:6443") {
			t.Errorf("%s: the agents' kubeconfig does not name --apiserver-url: %v\n%s", auth, err, kc)
		}
		for _, f := range []string{"konnectivity-server-leases-role.yaml", "konnectivity-agent-leases-rolebinding.yaml"} {
			if _, err := os.Stat(filepath.Join(agentDir, f)); err != nil {
				t.Errorf("%s: %v", auth, err)
			}
		}
	}
}
