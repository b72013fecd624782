package kubeconfigcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// A kubeconfig as people keep it: comments, keys in their own order, several clusters.
const orderedKubeconfig = `# work clusters
apiVersion: v1
kind: Config
current-context: staging
preferences: {}
clusters:
- name: staging
  cluster:
    server: https://198.18.0.2:6443
- name: prod   # the one behind the bastion
  cluster:
    server: https://10.0.0.10:6443
    certificate-authority-data: Y2E=
    tls-server-name: api.prod.example.com
contexts:
- name: prod-admin
  context:
    user: alice
    cluster: prod
- name: staging
  context: {cluster: staging, user: alice}
users:
- name: alice
  user:
    token: abc
`

// set-proxy changes the one line it is about: the file keeps its order and comments, and a second run keeps
// the first backup.
func TestKubeconfigSetProxyKeepsTheFile(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(kc, []byte(orderedKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	set := func(url string) {
		t.Helper()
		how := []string{"--proxy-url", url}
		if url == "" {
			how = []string{"--remove"}
		}
		if out, err := setProxy(t, append([]string{"--kubeconfig", kc, "--context", "prod-admin"}, how...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}

	set("socks5://127.0.0.1:1080")
	want := strings.Replace(orderedKubeconfig, "    server: https://10.0.0.10:6443\n",
		"    proxy-url: socks5://127.0.0.1:1080\n    server: https://10.0.0.10:6443\n", 1)
	if got := read(kc); got != want {
		t.Fatalf("after set-proxy:\n%s\nwant the file with one line added:\n%s", got, want)
	}
	if got := read(onlyBackup(t, kc)); got != orderedKubeconfig {
		t.Fatalf("backup:\n%s\nwant the original", got)
	}

	set("http://127.0.0.1:3128")
	second := strings.Replace(want, "proxy-url: socks5://127.0.0.1:1080", "proxy-url: http://127.0.0.1:3128", 1)
	if got := read(kc); got != second {
		t.Fatalf("after a second set-proxy:\n%s\nwant one line changed:\n%s", got, second)
	}
	kept := backups(t, kc)
	if len(kept) != 2 {
		t.Fatalf("backups after two runs: %v", kept)
	}
	if got := read(kept[0]); got != orderedKubeconfig {
		t.Fatalf("the second run overwrote the first backup:\n%s", got)
	}
	if got := read(kept[1]); got != want {
		t.Fatalf("second backup:\n%s\nwant the file as the first run left it", got)
	}

	set("")
	if got := read(kc); got != orderedKubeconfig {
		t.Fatalf("after removing proxy-url:\n%s\nwant the original file", got)
	}
	kept = backups(t, kc)
	if len(kept) != 3 {
		t.Fatalf("backups after three runs: %v", kept)
	}
	if got := read(kept[2]); got != second {
		t.Fatalf("third backup:\n%s", got)
	}
	if st, _ := os.Stat(kept[2]); st.Mode().Perm() != 0o600 {
		t.Errorf("backup mode %v, want the file's 0600", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(kc))
	if len(entries) != 4 {
		t.Errorf("directory holds %d files, want the kubeconfig and three backups (no temporary file left)", len(entries))
	}
}

// A cluster entry in flow style cannot take a line of its own: it is written from the node tree, keeping
// the order of keys and the comments elsewhere.
func TestKubeconfigSetProxyFlowStyle(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "config")
	flow := strings.Replace(orderedKubeconfig, `  cluster:
    server: https://198.18.0.2:6443`, `  cluster: {server: "https://198.18.0.2:6443"}`, 1)
	if err := os.WriteFile(kc, []byte(flow), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := setProxy(t, "--kubeconfig", kc, "--context", "staging", "--proxy-url", "socks5://127.0.0.1:1080"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b, _ := os.ReadFile(kc)
	cfg, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Clusters["staging"].ProxyURL != "socks5://127.0.0.1:1080" || cfg.Clusters["prod"].ProxyURL != "" || cfg.AuthInfos["alice"].Token != "abc" {
		t.Fatalf("after set-proxy:\n%s", b)
	}
	got := string(b)
	for _, keep := range []string{"# work clusters\n", "# the one behind the bastion", "    tls-server-name: api.prod.example.com\n"} {
		if !strings.Contains(got, keep) {
			t.Errorf("lost %q:\n%s", keep, got)
		}
	}
	if strings.Index(got, "current-context") > strings.Index(got, "clusters:") {
		t.Errorf("top-level keys reordered:\n%s", got)
	}
}
