package initcmd

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki"
)

// otherUser is "another user": root can give them files and directories without the user existing.
const otherUser = 65534

// apiserverPod is a kube-apiserver static pod, as kubeadm writes it, whose command has flags after the binary.
func apiserverPod(flags ...string) string {
	var b strings.Builder
	b.WriteString(`apiVersion: v1
kind: Pod
metadata:
  name: kube-apiserver
  namespace: kube-system
spec:
  containers:
  - name: kube-apiserver
    image: registry.k8s.io/kube-apiserver:v1.36.1
    command:
    - kube-apiserver
`)
	for _, f := range flags {
		b.WriteString("    - " + f + "\n")
	}
	b.WriteString("  hostNetwork: true\n")
	return b.String()
}

var minimalPod = apiserverPod()

// TestInitRefusesWhatOthersCanChange: a --dir, or a directory in or above it, that another user owns or
// everyone may write to, and a file init would write that is a symlink another user planted, are refused
// before anything is written, naming the flag and what the other user could change; the file such a link
// points to keeps its content. Also for a file that only a later phase writes, and for the kube-apiserver
// manifest that init patches.
func TestInitRefusesWhatOthersCanChange(t *testing.T) {
	for _, c := range []struct {
		name string
		root bool
		// setUp prepares the directory, the file a planted link points to, and returns extra flags and what
		// the error must say.
		setUp func(t *testing.T, dir, victim string) (extra []string, want []string)
	}{
		{name: "dir writable by everyone", setUp: func(t *testing.T, dir, _ string) ([]string, []string) {
			mkdirMode(t, dir, 0o777)
			return nil, []string{"--dir " + dir, dir + " is writable by everyone"}
		}},
		{name: "directory above writable by everyone", setUp: func(t *testing.T, dir, _ string) ([]string, []string) {
			mkdirMode(t, filepath.Dir(dir), 0o777)
			return nil, []string{"--dir " + dir, filepath.Dir(dir) + " is writable by everyone"}
		}},
		{name: "pki directory of another user", root: true, setUp: func(t *testing.T, dir, _ string) ([]string, []string) {
			mkdirMode(t, filepath.Join(dir, "pki"), 0o700)
			chown(t, filepath.Join(dir, "pki"), otherUser)
			return nil, []string{"--dir " + dir, filepath.Join(dir, "pki") + " belongs to uid 65534"}
		}},
		{name: "planted key symlink", root: true, setUp: func(t *testing.T, dir, victim string) ([]string, []string) {
			link := filepath.Join(dir, "pki", "front-proxy-client.key")
			plant(t, victim, link)
			return nil, []string{"refusing to write " + link, "symlink " + link + " belongs to uid 65534"}
		}},
		{name: "planted symlink that a later phase writes", root: true, setUp: func(t *testing.T, dir, victim string) ([]string, []string) {
			link := filepath.Join(dir, FlagsFile)
			plant(t, victim, link)
			return nil, []string{"refusing to write " + link}
		}},
		{name: "planted symlink in the agents' bundle", root: true, setUp: func(t *testing.T, dir, victim string) ([]string, []string) {
			link := filepath.Join(dir, manifests.AgentBundleDir, "konnectivity-agent.yaml")
			plant(t, victim, link)
			return nil, []string{"refusing to write " + link}
		}},
		{name: "kube-apiserver manifest through another user's symlink", root: true, setUp: func(t *testing.T, dir, victim string) ([]string, []string) {
			if err := os.WriteFile(victim, []byte(minimalPod), 0o600); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(filepath.Dir(dir), "kube-apiserver.yaml")
			plant(t, victim, link)
			return []string{"--apiserver-manifest", link}, []string{"--apiserver-manifest " + link, "belongs to uid 65534"}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.root && os.Geteuid() != 0 {
				t.Skip("making another user's files needs root")
			}
			// Short, so that the socket's default path under --dir stays within the kernel's limit.
			base, err := os.MkdirTemp("", "kh")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(filepath.Join(base, "p"), 0o755); os.RemoveAll(base) })
			dir := filepath.Join(base, "p", "k")
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("precious\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			extra, want := c.setUp(t, dir, victim)
			before := tree(t, base)
			victimBefore, _ := os.ReadFile(victim)
			for _, dryRun := range []bool{false, true} {
				args := initArgs(dir, extra...)
				if dryRun {
					args = append(args, "--dry-run")
				}
				out, err := run(t, args...)
				if err == nil {
					t.Fatalf("dry run %v: init succeeded\n%s", dryRun, out)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("dry run %v: %v\ndoes not say %q", dryRun, err, w)
					}
				}
			}
			if after := tree(t, base); !maps.Equal(before, after) {
				t.Errorf("the refused runs wrote: before %v, after %v", before, after)
			}
			if after, _ := os.ReadFile(victim); string(after) != string(victimBefore) {
				t.Errorf("the symlink's target changed: %q", after)
			}
		})
	}
}

// TestCertsOutOthersCanChange: the output directory of certs apiservice and certs webhook holds a CA key,
// and is refused like init's --dir.
func TestCertsOutOthersCanChange(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	mkdirMode(t, open, 0o777)
	out := filepath.Join(open, "pizza-apiservice")
	for _, args := range [][]string{
		{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1", "--out", out},
		{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out},
	} {
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "--out "+out) || !strings.Contains(err.Error(), open+" is writable by everyone") {
			t.Errorf("%s: %v", args[1], err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: the refused run made %s", args[1], out)
		}
	}
}

// TestInitWritesThroughOwnSymlinks keeps the use of writing through links: a cluster CA shared by several
// directories through symlinks of root's (or ours) is kept by init, and renewed through the links, which stay.
func TestInitWritesThroughOwnSymlinks(t *testing.T) {
	shared := filepath.Join(t.TempDir(), "shared")
	mustRun(t, initArgs(shared)...)
	dir := t.TempDir()
	mkdirMode(t, filepath.Join(dir, "pki"), 0o700)
	for _, f := range []string{"ca.crt", "ca.key"} {
		if err := os.Symlink(filepath.Join(shared, "pki", f), filepath.Join(dir, "pki", f)); err != nil {
			t.Fatal(err)
		}
	}
	out := mustRun(t, initArgs(dir)...)
	if !strings.Contains(out, "[kept] "+filepath.Join(dir, "pki", "ca.{crt,key}")) {
		t.Errorf("the shared CA was not kept:\n%s", out)
	}
	caBefore, _ := os.ReadFile(filepath.Join(shared, "pki", "ca.crt"))
	mustRun(t, "certs", "renew", "ca", "--dir", dir)
	caAfter, _ := os.ReadFile(filepath.Join(shared, "pki", "ca.crt"))
	if string(caAfter) == string(caBefore) {
		t.Error("renewing the linked CA did not reach the shared file")
	}
	if fi, err := os.Lstat(filepath.Join(dir, "pki", "ca.crt")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", fi, err)
	}
	ca := mustCert(t, filepath.Join(shared, "pki", "ca.crt"))
	leaf := mustCert(t, filepath.Join(dir, "pki", "konnectivity-server.crt"))
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		t.Errorf("this directory's leaf is not signed by the shared CA: %v", err)
	}
}

func mustCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tree lists every file, directory and link under dir with its mode and content.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			v += " -> " + target
		case info.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			v += " " + string(data)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mkdirMode(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// plant makes link, a symlink to target, as another user would have left it.
func plant(t *testing.T, target, link string) {
	t.Helper()
	mkdirMode(t, filepath.Dir(link), 0o755)
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	chown(t, link, otherUser)
}

// TestWritingCommandsTakeTheLock: every command that writes into a directory waits while another holds its
// lock, says so, and finishes once it is free; a dry run writes nothing and does not wait.
func TestWritingCommandsTakeTheLock(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir)...)
	webhookOut := filepath.Join(t.TempDir(), "hook")
	mustRun(t, "certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", webhookOut)
	apiOut := filepath.Join(t.TempDir(), "api")
	for _, c := range []struct {
		name string
		dir  string
		args []string
	}{
		{"init", dir, initArgs(dir, "--force")},
		{"init phase", dir, []string{"init", "phase", "flags", "--dir", dir}},
		{"init phase certs NAME", dir, []string{"init", "phase", "certs", "front-proxy-client", "--dir", dir}},
		{"certs renew", dir, []string{"certs", "renew", "all", "--dir", dir}},
		{"certs apiservice", apiOut, []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1", "--out", apiOut}},
		{"certs webhook", webhookOut, []string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", webhookOut}},
		{"certs rotate-ca", webhookOut, []string{"certs", "rotate-ca", "--out", webhookOut, "--step", "1"}},
		{"certs renew of a serving directory", webhookOut, []string{"certs", "renew", "all", "--dir", webhookOut}},
	} {
		t.Run(c.name, func(t *testing.T) {
			release, err := pki.Lock(c.dir, time.Second, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				out string
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := run(t, c.args...)
				done <- result{out, err}
			}()
			select {
			case r := <-done:
				release()
				t.Fatalf("finished while another held the lock: %v\n%s", r.err, r.out)
			case <-time.After(700 * time.Millisecond):
			}
			release()
			select {
			case r := <-done:
				if r.err != nil {
					t.Fatalf("after the lock was free: %v\n%s", r.err, r.out)
				}
				if want := fmt.Sprintf("Waiting for another konnect command (pid %d), which is writing into %s", os.Getpid(), c.dir); !strings.Contains(r.out, want) {
					t.Errorf("output does not say %q:\n%s", want, r.out)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("still waiting 30s after the lock was free")
			}
			if _, err := os.Lstat(filepath.Join(c.dir, pki.LockFile)); !os.IsNotExist(err) {
				t.Errorf("the lock file was left: %v", err)
			}
		})
	}
	release, err := pki.Lock(dir, time.Second, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if out, err := run(t, initArgs(dir, "--dry-run")...); err != nil || strings.Contains(out, "Waiting") {
		t.Errorf("a dry run waited or failed: %v\n%s", err, out)
	}
}
