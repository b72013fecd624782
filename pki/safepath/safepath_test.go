package safepath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// other is the uid and gid of "another user": root can give them files without the user existing.
const other = 65534

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making another user's files needs root")
	}
}

func mkdir(t *testing.T, path string, mode os.FileMode) string {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func write(t *testing.T, path string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func symlink(t *testing.T, target, link string) string {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	return link
}

func chown(t *testing.T, path string, uid, gid int) {
	t.Helper()
	if err := os.Lchown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
}

func wantShared(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if !errors.Is(err, ErrShared) {
		t.Errorf("%s: %v, want ErrShared", what, err)
		return
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
}

// TestCheckDir: a directory, or one above it, that another user owns or may write to is refused; the
// sticky bit (as on /tmp), a group write bit for root's group, and directories still to be made are fine.
func TestCheckDir(t *testing.T) {
	root := t.TempDir()
	open := mkdir(t, filepath.Join(root, "open"), 0o777)
	wantShared(t, "below a directory everyone may write to", CheckDir(filepath.Join(open, "a", "b")), open, "writable by everyone without the sticky bit")
	sticky := mkdir(t, filepath.Join(root, "sticky"), 0o777|os.ModeSticky)
	if err := CheckDir(filepath.Join(sticky, "mine")); err != nil {
		t.Errorf("below a sticky directory: %v", err)
	}
	if err := CheckDir(filepath.Join(root, "not", "yet")); err != nil {
		t.Errorf("directories still to be made: %v", err)
	}
	// A symlink on the path is followed: what it leads to is checked, not the link's own mode (0777).
	viaLink := symlink(t, open, filepath.Join(root, "via"))
	wantShared(t, "through a symlink to a directory everyone may write to", CheckDir(filepath.Join(viaLink, "a")), open)
	good := mkdir(t, filepath.Join(root, "good"), 0o755)
	if err := CheckDir(symlink(t, good, filepath.Join(root, "to-good"))); err != nil {
		t.Errorf("through a symlink to a sound directory: %v", err)
	}

	needRoot(t)
	theirs := mkdir(t, filepath.Join(root, "theirs"), 0o755)
	chown(t, theirs, other, other)
	wantShared(t, "another user's directory", CheckDir(filepath.Join(theirs, "pki")), theirs, "belongs to uid 65534")
	// Even a directory of ours below it: they can rename it away and put one of theirs in its place.
	mine := mkdir(t, filepath.Join(theirs, "mine"), 0o700)
	wantShared(t, "our directory below theirs", CheckDir(mine), theirs)
	group := mkdir(t, filepath.Join(root, "group"), 0o775)
	chown(t, group, 0, other)
	wantShared(t, "a directory another group may write to", CheckDir(group), "writable by group 65534")
	rootGroup := mkdir(t, filepath.Join(root, "rootgroup"), 0o775)
	if err := CheckDir(rootGroup); err != nil {
		t.Errorf("a directory root's group may write to: %v", err)
	}
	// A symlink another user owns, on the way to a sound directory: they planted it.
	planted := symlink(t, good, filepath.Join(root, "planted"))
	chown(t, planted, other, other)
	wantShared(t, "another user's symlink", CheckDir(filepath.Join(planted, "x")), planted, "belongs to uid 65534")
}

// TestResolve: a plain path is itself; a symlink is written through only when the links, the file they
// lead to and the directories of both are root's or ours and closed to others; otherwise the refusal names
// what another user could change.
func TestResolve(t *testing.T) {
	root := t.TempDir()
	pki := mkdir(t, filepath.Join(root, "pki"), 0o700)
	shared := mkdir(t, filepath.Join(root, "shared"), 0o755)
	target := write(t, filepath.Join(shared, "ca.crt"), 0o644)

	plain := filepath.Join(pki, "plain.crt")
	if p, err := Resolve(plain); err != nil || p != plain {
		t.Errorf("a file still to be written: %q %v", p, err)
	}
	link := symlink(t, "../shared/ca.crt", filepath.Join(pki, "ca.crt"))
	if p, err := Resolve(link); err != nil || p != target {
		t.Errorf("a relative symlink to a sound file: %q %v, want %s", p, err, target)
	}
	chain := symlink(t, link, filepath.Join(pki, "chain.crt"))
	if p, err := Resolve(chain); err != nil || p != target {
		t.Errorf("a chain of symlinks: %q %v", p, err)
	}
	// ".." after a symlinked directory leads to the parent of where that link points, as in the kernel.
	deep := mkdir(t, filepath.Join(shared, "deep", "er"), 0o755)
	symlink(t, deep, filepath.Join(pki, "d"))
	dotdot := symlink(t, "d/../ca2.crt", filepath.Join(pki, "dotdot.crt"))
	want := write(t, filepath.Join(shared, "deep", "ca2.crt"), 0o644)
	if p, err := Resolve(dotdot); err != nil || p != want {
		t.Errorf(`".." after a symlinked directory: %q %v, want %s`, p, err, want)
	}
	if evaluated, _ := filepath.EvalSymlinks(dotdot); evaluated != want {
		t.Fatalf("the test is wrong: EvalSymlinks gives %s", evaluated)
	}

	dangling := symlink(t, "../nowhere/gone.crt", filepath.Join(pki, "gone.crt"))
	if _, err := Resolve(dangling); err == nil || errors.Is(err, ErrShared) || !strings.Contains(err.Error(), filepath.Join(root, "nowhere")) {
		t.Errorf("a dangling symlink: %v", err)
	}
	toDir := symlink(t, shared, filepath.Join(pki, "dir.crt"))
	if _, err := Resolve(toDir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("a symlink to a directory: %v", err)
	}
	loop := symlink(t, "loop.crt", filepath.Join(pki, "loop.crt"))
	if _, err := Resolve(loop); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("a symlink loop: %v", err)
	}
	open := write(t, filepath.Join(shared, "open.crt"), 0o666)
	wantShared(t, "a symlink to a file everyone may write to", func() error {
		_, err := Resolve(symlink(t, open, filepath.Join(pki, "open.crt")))
		return err
	}(), open, "writable by everyone")
	openDir := mkdir(t, filepath.Join(root, "opendir"), 0o777)
	inOpen := write(t, filepath.Join(openDir, "x.key"), 0o600)
	wantShared(t, "a symlink into a directory everyone may write to", func() error {
		_, err := Resolve(symlink(t, inOpen, filepath.Join(pki, "x.key")))
		return err
	}(), openDir)

	needRoot(t)
	// The review's attack: another user's symlink in the pki directory, to a file anywhere.
	victim := write(t, filepath.Join(root, "victim"), 0o644)
	planted := symlink(t, victim, filepath.Join(pki, "front-proxy-client.key"))
	chown(t, planted, other, other)
	wantShared(t, "another user's symlink", func() error { _, err := Resolve(planted); return err }(), "symlink "+planted+" belongs to uid 65534")
	// Our symlink, to another user's file.
	theirFile := write(t, filepath.Join(shared, "theirs.crt"), 0o644)
	chown(t, theirFile, other, other)
	wantShared(t, "a symlink to another user's file", func() error {
		_, err := Resolve(symlink(t, theirFile, filepath.Join(pki, "theirs.crt")))
		return err
	}(), "belongs to uid 65534")
	// Our symlink, to our file in another user's directory: they can swap the file.
	theirDir := mkdir(t, filepath.Join(root, "theirdir"), 0o755)
	chown(t, theirDir, other, other)
	mineThere := write(t, filepath.Join(theirDir, "mine.crt"), 0o644)
	wantShared(t, "a symlink into another user's directory", func() error {
		_, err := Resolve(symlink(t, mineThere, filepath.Join(pki, "mine.crt")))
		return err
	}(), theirDir)
	// A chain whose middle link is another user's.
	mid := symlink(t, target, filepath.Join(shared, "mid.crt"))
	chown(t, mid, other, other)
	wantShared(t, "a chain through another user's symlink", func() error {
		_, err := Resolve(symlink(t, mid, filepath.Join(pki, "mid.crt")))
		return err
	}(), mid)
	// A plain file of another user's in our directory is replaced, not written through: no refusal.
	theirs := write(t, filepath.Join(pki, "replaced.crt"), 0o666)
	chown(t, theirs, other, other)
	if p, err := Resolve(theirs); err != nil || p != theirs {
		t.Errorf("a plain file to be replaced: %q %v", p, err)
	}
}

// TestCheckFile: a file whose content is trusted must be closed to others, also when it is reached by a
// symlink.
func TestCheckFile(t *testing.T) {
	root := t.TempDir()
	if err := CheckFile(filepath.Join(root, "missing")); err != nil {
		t.Errorf("a missing file: %v", err)
	}
	ok := write(t, filepath.Join(root, "ok.crt"), 0o644)
	if err := CheckFile(ok); err != nil {
		t.Errorf("a sound file: %v", err)
	}
	open := write(t, filepath.Join(root, "open.crt"), 0o646)
	wantShared(t, "a file everyone may write to", CheckFile(open), "writable by everyone")
	link := symlink(t, open, filepath.Join(root, "link.crt"))
	wantShared(t, "a symlink to it", CheckFile(link), "symlink to "+open)

	needRoot(t)
	theirs := write(t, filepath.Join(root, "theirs.crt"), 0o644)
	chown(t, theirs, other, other)
	wantShared(t, "another user's file", CheckFile(theirs), "belongs to uid 65534")
}
