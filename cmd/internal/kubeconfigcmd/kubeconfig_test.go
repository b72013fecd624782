package kubeconfigcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- cluster:
    server: https://198.18.0.1:6443
    certificate-authority-data: Y2E=
  name: prod
- cluster:
    server: https://198.18.0.2:6443
  name: staging
contexts:
- context:
    cluster: prod
    user: alice
  name: prod-admin
- context:
    cluster: staging
    user: alice
  name: staging
current-context: staging
users:
- name: alice
  user:
    token: abc
`

func setProxy(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewKubeconfigCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"set-proxy"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

func TestKubeconfigSetProxy(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "config")
	os.WriteFile(kc, []byte(testKubeconfig), 0o600)

	if _, err := setProxy(t, "--kubeconfig", kc, "--context", "prod-admin", "--proxy-url", "socks5://127.0.0.1:1080"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Clusters["prod"].ProxyURL; got != "socks5://127.0.0.1:1080" {
		t.Fatalf("prod proxy-url = %q", got)
	}
	if got := cfg.Clusters["staging"].ProxyURL; got != "" {
		t.Fatalf("staging proxy-url changed to %q", got)
	}
	if cfg.CurrentContext != "staging" || cfg.AuthInfos["alice"].Token != "abc" || string(cfg.Clusters["prod"].CertificateAuthorityData) != "ca" {
		t.Fatalf("other settings changed: %+v", cfg)
	}
	backup, err := os.ReadFile(onlyBackup(t, kc))
	if err != nil || string(backup) != testKubeconfig {
		t.Fatalf("backup = %q, %v; want the original file", backup, err)
	}
	if st, _ := os.Stat(kc); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, want 0600 kept", st.Mode().Perm())
	}
	// An empty --proxy-url, as an unset shell variable gives, is refused and keeps the proxy.
	set, _ := os.ReadFile(kc)
	if _, err := setProxy(t, "--kubeconfig", kc, "--context", "prod-admin", "--proxy-url", ""); err == nil ||
		!strings.Contains(err.Error(), "--proxy-url: empty") || !strings.Contains(err.Error(), "--remove") {
		t.Fatalf("empty --proxy-url: %v", err)
	}
	if b, _ := os.ReadFile(kc); !bytes.Equal(b, set) || len(backups(t, kc)) != 1 {
		t.Fatalf("empty --proxy-url changed the file or kept a backup:\n%s", b)
	}
	// --remove clears it.
	out, err := setProxy(t, "--kubeconfig", kc, "--context", "prod-admin", "--remove")
	if err != nil || !strings.Contains(out, `removed proxy-url from cluster "prod"`) {
		t.Fatalf("--remove: %v\n%s", err, out)
	}
	cfg, _ = clientcmd.LoadFromFile(kc)
	if cfg.Clusters["prod"].ProxyURL != "" {
		t.Fatalf("proxy-url not cleared")
	}
	before := backups(t, kc)
	if out, err := setProxy(t, "--kubeconfig", kc, "--context", "prod-admin", "--remove"); err != nil || !strings.Contains(out, "has no proxy-url") || len(backups(t, kc)) != len(before) {
		t.Fatalf("--remove again: %v\n%s", err, out)
	}
}

// A kubeconfig that is a symlink stays one: the file it points at is edited, and backed up beside it.
func TestKubeconfigSetProxyThroughSymlink(t *testing.T) {
	dotfiles, home := t.TempDir(), t.TempDir()
	target := filepath.Join(dotfiles, "kubeconfig")
	os.WriteFile(target, []byte(testKubeconfig), 0o600)
	link := filepath.Join(home, "config")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := setProxy(t, "--kubeconfig", link, "--context", "prod-admin", "--proxy-url", "socks5://127.0.0.1:1080"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("%s is no longer a symlink: %v", link, err)
	}
	if cfg, err := clientcmd.LoadFromFile(target); err != nil || cfg.Clusters["prod"].ProxyURL != "socks5://127.0.0.1:1080" {
		t.Fatalf("the file the link points at was not edited: %v", err)
	}
	if backup, err := os.ReadFile(onlyBackup(t, target)); err != nil || string(backup) != testKubeconfig {
		t.Fatalf("backup = %q, %v; want the original beside the file", backup, err)
	}
}

// A kubeconfig that is, or leads through, a symlink another user owns is refused, naming the file; the file
// the link leads to is left as it was, and no backup is written beside it.
func TestKubeconfigSetProxyRefusesForeignSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a symlink to another user needs root")
	}
	const other = 65534
	dotfiles, home := t.TempDir(), t.TempDir()
	target := filepath.Join(dotfiles, "kubeconfig")
	os.WriteFile(target, []byte(testKubeconfig), 0o600)
	theirs := filepath.Join(home, "theirs")
	if err := os.Symlink(target, theirs); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(theirs, other, other); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(home, "config")
	if err := os.Symlink(theirs, mine); err != nil {
		t.Fatal(err)
	}
	for _, kc := range []string{theirs, mine} {
		_, err := setProxy(t, "--kubeconfig", kc, "--context", "prod-admin", "--proxy-url", "socks5://127.0.0.1:1080")
		if err == nil || !strings.Contains(err.Error(), "--kubeconfig: refusing to write "+kc) || !strings.Contains(err.Error(), "symlink "+theirs+" belongs to uid 65534") {
			t.Errorf("--kubeconfig %s: %v, want a refusal naming it and the other user's link", kc, err)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != testKubeconfig {
		t.Errorf("the file the link leads to was changed")
	}
	if entries, _ := os.ReadDir(dotfiles); len(entries) != 1 {
		t.Errorf("%s holds %d files, want only the kubeconfig (no backup, no lock)", dotfiles, len(entries))
	}
}

func TestKubeconfigSetProxyErrors(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "config")
	os.WriteFile(kc, []byte(testKubeconfig), 0o600)
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{"socks5h refused", []string{"--context", "prod-admin", "--proxy-url", "socks5h://127.0.0.1:1080"}, []string{"--proxy-url", "socks5h", "socks5://"}},
		{"unknown scheme", []string{"--context", "prod-admin", "--proxy-url", "ftp://x:1"}, []string{"--proxy-url", "ftp"}},
		{"no port", []string{"--context", "prod-admin", "--proxy-url", "socks5://127.0.0.1"}, []string{"--proxy-url", "port"}},
		{"port out of range", []string{"--context", "prod-admin", "--proxy-url", "socks5://127.0.0.1:99999"}, []string{"--proxy-url", "port 99999"}},
		{"query", []string{"--context", "prod-admin", "--proxy-url", "socks5://127.0.0.1:1080?a=b"}, []string{"--proxy-url", "query"}},
		{"missing context", []string{"--context", "nope", "--proxy-url", "socks5://127.0.0.1:1080"}, []string{"--context", `"nope"`, "prod-admin, staging"}},
		{"no context flag", []string{"--proxy-url", "socks5://127.0.0.1:1080"}, []string{"--context"}},
		{"no proxy-url flag", []string{"--context", "prod-admin"}, []string{"--proxy-url", "--remove"}},
		{"empty proxy-url", []string{"--context", "prod-admin", "--proxy-url", ""}, []string{"--proxy-url: empty", "--remove"}},
		{"remove and proxy-url", []string{"--context", "prod-admin", "--remove", "--proxy-url", "socks5://127.0.0.1:1080"}, []string{"--remove and --proxy-url"}},
		{"remove and empty proxy-url", []string{"--context", "prod-admin", "--remove", "--proxy-url", ""}, []string{"--remove and --proxy-url"}},
		{"missing file", []string{"--kubeconfig", filepath.Join(dir, "absent"), "--context", "prod-admin", "--proxy-url", "socks5://127.0.0.1:1080"}, []string{"--kubeconfig"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if !strings.Contains(strings.Join(args, " "), "--kubeconfig") {
				args = append([]string{"--kubeconfig", kc}, args...)
			}
			_, err := setProxy(t, args...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if b, _ := os.ReadFile(kc); string(b) != testKubeconfig {
				t.Fatalf("file changed on error")
			}
			if b := backups(t, kc); len(b) > 0 {
				t.Fatalf("backup written on error: %v", b)
			}
		})
	}
}

// A password in the proxy URL is written to the kubeconfig but not printed.
func TestKubeconfigSetProxyHidesPassword(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "config")
	os.WriteFile(kc, []byte(testKubeconfig), 0o600)
	const proxyURL = "http://dev:s3cret-pw@127.0.0.1:3128"
	for range 2 { // set, then "already has"
		out, err := setProxy(t, "--kubeconfig", kc, "--context", "prod-admin", "--proxy-url", proxyURL)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "s3cret-pw") || !strings.Contains(out, "dev:xxxxx@127.0.0.1:3128") {
			t.Fatalf("output does not hide the password: %q", out)
		}
	}
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Clusters["prod"].ProxyURL; got != proxyURL {
		t.Fatalf("prod proxy-url = %q, want %q", got, proxyURL)
	}
	// A URL that does not parse is refused without quoting its password either.
	for _, bad := range []string{"socks5://dev:s3cret-pw@127.0.0.1:abc", "socks5://dev:s3cret-pw@[::1:1080", "http://dev:s3cret-pw%zz@127.0.0.1:3128"} {
		out, err := setProxy(t, "--kubeconfig", kc, "--context", "prod-admin", "--proxy-url", bad)
		if err == nil || !strings.Contains(err.Error(), "--proxy-url") || strings.Contains(err.Error()+out, "s3cret-pw") {
			t.Errorf("%s: %v\n%s", bad, err, out)
		}
	}
}

// backups lists the backups of file beside it, oldest first.
func backups(t *testing.T, file string) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(filepath.Dir(file), "."+filepath.Base(file)+".konnect-backup-*"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(found) // the names carry the time, then a count within its second
	return found
}

// onlyBackup is the one backup of file.
func onlyBackup(t *testing.T, file string) string {
	t.Helper()
	b := backups(t, file)
	if len(b) != 1 {
		t.Fatalf("backups of %s: %v, want one", file, b)
	}
	return b[0]
}
