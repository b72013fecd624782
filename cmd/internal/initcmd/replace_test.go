package initcmd

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A user's own file where init writes one: the egress selector configuration with an etcd selection and
// comments, an upstream Konnectivity server pod, flags of their own.
var foreignFiles = map[string]string{
	EgressConfigFile: `# kube-apiserver's egress, by hand
apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: etcd # straight to etcd
  connection:
    proxyProtocol: Direct
`,
	"manifests/konnectivity-server.yaml": `apiVersion: v1
kind: Pod
metadata:
  name: konnectivity-server
  namespace: kube-system
spec:
  containers:
  - name: konnectivity-server-container
    image: registry.k8s.io/kas-network-proxy/proxy-server:v0.36.0
`,
	FlagsFile: "--etcd-servers=https://127.0.0.1:2379\n--egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml\n",
}

// backups lists the backups konnect kept beside path.
func backups(t *testing.T, path string) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".konnect-backup-*"))
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func TestInitForeignFile(t *testing.T) {
	for name, content := range foreignFiles {
		t.Run(strings.SplitN(filepath.Base(name), "-", 2)[0], func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
				t.Fatal(err)
			}
			for _, extra := range [][]string{{"--dry-run"}, nil} {
				out, err := run(t, initArgs(dir, extra...)...)
				if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "--force") {
					t.Fatalf("init %v over %s: %v\n%s", extra, name, err, out)
				}
				if data, _ := os.ReadFile(path); string(data) != content {
					t.Fatalf("init %v changed %s:\n%s", extra, name, data)
				}
			}

			out := mustRun(t, initArgs(dir, "--force")...)
			found := backups(t, path)
			if len(found) != 1 || !strings.Contains(out, "backup "+found[0]) {
				t.Fatalf("backups %v; output:\n%s", found, out)
			}
			if data, _ := os.ReadFile(found[0]); string(data) != content {
				t.Fatalf("backup %s holds %q", found[0], data)
			}
			if st, _ := os.Stat(found[0]); st.Mode().Perm() != 0o640 {
				t.Fatalf("backup mode %04o, want the file's 0640", st.Mode().Perm())
			}
			// From now on the file is konnect's: a run without --force keeps every byte.
			before := sums(t, dir)
			mustRun(t, initArgs(dir)...)
			if c := changed(before, sums(t, dir)); len(c) > 0 {
				t.Fatalf("a run over its own output changed %v", c)
			}
		})
	}
}

// Files that konnect wrote are replaced without --force and without a backup, also when an older konnect
// wrote them, before the egress configuration carried its mark.
func TestInitReplacesItsOwnFiles(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir)...)
	egress := filepath.Join(dir, EgressConfigFile)
	data, _ := os.ReadFile(egress)
	mark, unmarked, _ := bytes.Cut(data, []byte("\n"))
	if !bytes.HasPrefix(mark, []byte(writtenBy)) {
		t.Fatalf("%s does not start with %q:\n%s", egress, writtenBy, data)
	}
	if err := os.WriteFile(egress, unmarked, 0o644); err != nil {
		t.Fatal(err)
	}
	pod := filepath.Join(dir, "manifests/konnectivity-server.yaml")
	podData, _ := os.ReadFile(pod)
	if err := os.WriteFile(pod, bytes.Replace(podData, []byte("image: "), []byte("image: example.com/"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	// The egress configuration without its mark and an edited pod of konnect's are rewritten.
	mustRun(t, initArgs(dir)...)
	if got, _ := os.ReadFile(egress); !bytes.Equal(got, data) {
		t.Fatalf("%s:\n%s\nwant\n%s", egress, got, data)
	}
	if got, _ := os.ReadFile(pod); !bytes.Equal(got, podData) {
		t.Fatalf("%s not rewritten", pod)
	}
	for _, p := range []string{egress, pod} {
		if b := backups(t, p); len(b) > 0 {
			t.Fatalf("backup of konnect's own file: %v", b)
		}
	}
	// A flags file of konnect's own flags with other values is konnect's too.
	flags := filepath.Join(dir, FlagsFile)
	flagsData, _ := os.ReadFile(flags)
	if err := os.WriteFile(flags, bytes.Replace(flagsData, []byte("=front-proxy-client"), []byte("=someone"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, initArgs(dir)...)
	if got, _ := os.ReadFile(flags); !bytes.Equal(got, flagsData) {
		t.Fatalf("%s not rewritten:\n%s", flags, got)
	}
}

// A world-readable kubeconfig holds the server's client key: a run closes it and says so.
func TestInitClosesReadableKubeconfig(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir)...)
	conf := filepath.Join(dir, "konnectivity-server.conf")
	if err := os.Chmod(conf, 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, initArgs(dir)...)
	if !strings.Contains(out, "[updated] "+conf+" (mode 0644") {
		t.Fatalf("output does not report the mode of %s:\n%s", conf, out)
	}
	if st, _ := os.Stat(conf); st.Mode().Perm() != 0o600 {
		t.Fatalf("%s is mode %04o", conf, st.Mode().Perm())
	}
}

// certs webhook writes secret.yaml and copies of the manifests into --out: a user's own secret.yaml there
// is refused as init refuses one, and an earlier copy of a manifest the user has changed since is replaced.
func TestCertsWebhookRefusesForeignSecret(t *testing.T) {
	in := t.TempDir()
	hooks := filepath.Join(in, "hooks.yaml")
	if err := os.WriteFile(hooks, []byte(testWebhooks), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	secret := filepath.Join(out, "secret.yaml")
	const mine = "# mine\napiVersion: v1\nkind: Secret\nmetadata:\n  name: hook-tls\n  namespace: pizza\nstringData:\n  password: hunter2\n"
	if err := os.WriteFile(secret, []byte(mine), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out, "--key-algorithm", "ecdsa-p256", hooks}
	if stdout, err := run(t, args...); err == nil || !strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("over a user's secret.yaml: %v\n%s", err, stdout)
	}
	if data, _ := os.ReadFile(secret); string(data) != mine {
		t.Fatalf("secret.yaml changed:\n%s", data)
	}
	stdout := mustRun(t, append(args, "--force")...)
	if b := backups(t, secret); len(b) != 1 || !strings.Contains(stdout, "backup "+b[0]) {
		t.Fatalf("backups %v:\n%s", b, stdout)
	}
	before := sums(t, out)
	mustRun(t, args...)
	if !maps.Equal(before, sums(t, out)) {
		t.Fatal("a run over its own output changed files")
	}
	// The user changes the manifest: konnect's copy follows without --force.
	if err := os.WriteFile(hooks, []byte(strings.Replace(testWebhooks, "path: /validate", "path: /v2/validate", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, args...)
	if data, _ := os.ReadFile(filepath.Join(out, "hooks.yaml")); !strings.Contains(string(data), "/v2/validate") {
		t.Fatalf("the copy did not follow the manifest:\n%s", data)
	}
}

// --force rewrites a konnectivity-server.conf that points at another server, or that is no kubeconfig, and
// keeps what it replaced beside it, closed (it may hold the client key), as it does for a foreign manifest.
func TestInitForceKeepsKubeconfigBackup(t *testing.T) {
	for name, edit := range map[string]func([]byte) []byte{
		"server": func(b []byte) []byte {
			return bytes.Replace(b, []byte("https://198.18.0.1:6443"), []byte("https://kube.example.com:6443"), 1)
		},
		"garbage": func([]byte) []byte { return []byte("not a kubeconfig: [\n") },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mustRun(t, initArgs(dir)...)
			conf := filepath.Join(dir, "konnectivity-server.conf")
			data, err := os.ReadFile(conf)
			if err != nil {
				t.Fatal(err)
			}
			edited := edit(data)
			if err := os.WriteFile(conf, edited, 0o600); err != nil {
				t.Fatal(err)
			}
			out := mustRun(t, initArgs(dir, "--force")...)
			if got, _ := os.ReadFile(conf); !bytes.Equal(got, data) {
				t.Fatalf("%s not rewritten:\n%s", conf, got)
			}
			found := backups(t, conf)
			if len(found) != 1 || !strings.Contains(out, "rewritten with --force, backup "+found[0]) {
				t.Fatalf("backups %v; output:\n%s", found, out)
			}
			if got, _ := os.ReadFile(found[0]); !bytes.Equal(got, edited) {
				t.Fatalf("backup %s holds %q", found[0], got)
			}
			if st, _ := os.Stat(found[0]); st.Mode().Perm() != 0o600 {
				t.Fatalf("backup mode %04o, want 0600", st.Mode().Perm())
			}
			// A run over konnect's own conf keeps no backup.
			mustRun(t, initArgs(dir, "--force")...)
			if b := backups(t, conf); len(b) != 1 {
				t.Fatalf("backups after a run over konnect's own conf: %v", b)
			}
		})
	}
}

// TestInitRefusesWhatItCannotRead: where init writes a file stands something it cannot read whole: a file
// larger than any it writes, or a FIFO. Neither is konnect's, and neither can be kept as a backup, so init
// refuses, naming it, even with --force, and leaves it as it was.
func TestInitRefusesWhatItCannotRead(t *testing.T) {
	for _, c := range []struct {
		test, name string
		make       func(path string) error
		want       string
	}{
		{"large", FlagsFile, func(path string) error {
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write(bytes.Repeat([]byte("# a user's notes, kept with the flags\n"), 5<<20/38+1))
			return err
		}, "larger than 4 MiB"},
		{"fifo", EgressConfigFile, func(path string) error { return syscall.Mkfifo(path, 0o600) }, "not a regular file (a fifo)"},
	} {
		t.Run(c.test, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, c.name)
			if err := c.make(path); err != nil {
				t.Fatal(err)
			}
			before, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, extra := range [][]string{nil, {"--force"}, {"--dry-run"}} {
				out, err := run(t, initArgs(dir, extra...)...)
				if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("init %v over %s: %v, want an error naming it, %q\n%s", extra, c.name, err, c.want, out)
				}
				after, err := os.Lstat(path)
				if err != nil || after.Mode() != before.Mode() || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
					t.Fatalf("init %v changed %s: %v, %v", extra, c.name, after, err)
				}
				if b := backups(t, path); len(b) != 0 {
					t.Fatalf("init %v kept backups %v", extra, b)
				}
			}
		})
	}
}
