//go:build integration

package sshdial

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/crypto/ssh/knownhosts"
)

// opensshRecords runs OpenSSH's ssh with StrictHostKeyChecking=accept-new against the fixture's sshd, so
// that it records the host key in knownHosts the way it does.
func opensshRecords(t *testing.T, f *fixture, knownHosts string) {
	t.Helper()
	harness.RequireSSH(t, "ssh")
	sshConfig := filepath.Join(t.TempDir(), "ssh_config")
	os.WriteFile(sshConfig, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  IdentityFile %s\n  IdentitiesOnly yes\n", f.sshd.Port, localUser(), f.key)), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ssh", "-F", sshConfig, "-o", "UserKnownHostsFile="+knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes", "target", "true").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh: %v\n%s", err, out)
	}
}

// TestAcceptNewWritesAsOpenSSH: --accept-new creates known_hosts with the mode OpenSSH's ssh gives it under
// the same umask (0644 less the umask: never writable by others), whole, with nothing left beside it; it
// appends to a file as ssh does; and it writes through a symlink only where no other user could redirect
// the write, where ssh follows any link. A refusal ends Run, naming the file, and leaves the link's target
// as it was.
func TestAcceptNewWritesAsOpenSSH(t *testing.T) {
	f := newFixture(t)
	want := knownhosts.Normalize(f.sshd.Addr()) + " " + f.sshd.HostKeyLine + "\n"
	accept := func(t *testing.T, file string) (*Dialer, <-chan error) {
		t.Helper()
		cfg := f.config()
		cfg.AcceptNew = true
		cfg.KnownHostsFile = file
		return start(t, cfg)
	}

	for _, umask := range []int{0o022, 0o077, 0o002, 0} {
		t.Run(fmt.Sprintf("new file under umask %03o", umask), func(t *testing.T) {
			dir := t.TempDir() // before the umask: under umask 0 it would be open to everyone
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			ours, theirs := filepath.Join(dir, "konnect", "known_hosts"), filepath.Join(dir, "openssh", "known_hosts")
			os.Mkdir(filepath.Dir(theirs), 0o700)
			opensshRecords(t, f, theirs)
			d, done := accept(t, ours)
			waitReady(t, d, done)
			if b, _ := os.ReadFile(ours); string(b) != want {
				t.Errorf("known_hosts = %q, want %q", b, want)
			}
			so, _ := os.Stat(ours)
			st, _ := os.Stat(theirs)
			if so.Mode() != st.Mode() {
				t.Errorf("konnect created known_hosts mode %v, OpenSSH %v", so.Mode(), st.Mode())
			}
			if so.Mode().Perm()&0o022 != 0 {
				t.Errorf("known_hosts mode %v: writable by others", so.Mode())
			}
			if entries, _ := os.ReadDir(filepath.Dir(ours)); len(entries) != 1 {
				t.Errorf("%d files beside known_hosts, want none", len(entries)-1)
			}
		})
	}

	t.Run("appends after a last line without newline", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "known_hosts")
		os.WriteFile(file, []byte("# mine"), 0o640)
		d, done := accept(t, file)
		waitReady(t, d, done)
		if b, _ := os.ReadFile(file); string(b) != "# mine\n"+want {
			t.Errorf("known_hosts = %q", b)
		}
		if st, _ := os.Stat(file); st.Mode().Perm() != 0o640 {
			t.Errorf("mode changed to %v", st.Mode().Perm())
		}
	})

	t.Run("our own symlink is written through", func(t *testing.T) {
		dotfiles := t.TempDir()
		target := filepath.Join(dotfiles, "known_hosts")
		os.WriteFile(target, nil, 0o600)
		link := filepath.Join(t.TempDir(), "known_hosts")
		os.Symlink(target, link)
		d, done := accept(t, link)
		waitReady(t, d, done)
		if b, _ := os.ReadFile(target); string(b) != want {
			t.Errorf("the link's target holds %q", b)
		}
		if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("the link was replaced: %v", err)
		}
	})

	refused := func(t *testing.T, link, target string, words ...string) {
		t.Helper()
		before, _ := os.ReadFile(target)
		_, done := accept(t, link)
		err := waitErr(t, done)
		var hk *HostKeyError
		if !errors.As(err, &hk) || !errors.Is(err, safepath.ErrShared) {
			t.Fatalf("Run: %v, want a HostKeyError that --accept-new could not record", err)
		}
		for _, w := range append(words, "AcceptNew cannot record it", "refusing to write "+link) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error does not say %q: %v", w, err)
			}
		}
		if after, _ := os.ReadFile(target); string(after) != string(before) {
			t.Errorf("the link's target was written: %q", after)
		}
	}
	t.Run("a symlink into a directory everyone may write to", func(t *testing.T) {
		open := filepath.Join(t.TempDir(), "open")
		os.Mkdir(open, 0o777)
		os.Chmod(open, 0o777)
		target := filepath.Join(open, "known_hosts")
		os.WriteFile(target, []byte("# theirs to swap\n"), 0o644)
		link := filepath.Join(t.TempDir(), "known_hosts")
		os.Symlink(target, link)
		refused(t, link, target, open, "writable by everyone")
	})
	t.Run("another user's symlink", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("giving a symlink to another user needs root")
		}
		victim := filepath.Join(t.TempDir(), "authorized_keys")
		os.WriteFile(victim, []byte("# root's file\n"), 0o600)
		link := filepath.Join(t.TempDir(), "known_hosts")
		os.Symlink(victim, link)
		if err := os.Lchown(link, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused(t, link, victim, "symlink "+link+" belongs to uid 65534")
	})
}
