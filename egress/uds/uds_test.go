package uds

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var opts = Options{Mode: 0o600, DirMode: 0o750}

// TestListenRefusesSwappableDirectories: a directory above the socket's that everyone may write to without
// the sticky bit, or that belongs to another user, would let that user move the socket's directory away and
// put one of theirs in its place. Listen refuses both, creates nothing, and SharedDir accepts them.
func TestListenRefusesSwappableDirectories(t *testing.T) {
	root := t.TempDir()
	open := filepath.Join(root, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(open, "sub", "k.sock")
	if _, err := Listen(sock, opts); !errors.Is(err, ErrSharedDir) || !strings.Contains(err.Error(), open+" is writable by everyone") {
		t.Fatalf("under a directory everyone may write to: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(sock)); !os.IsNotExist(err) {
		t.Fatalf("the refused Listen created %s: %v", filepath.Dir(sock), err)
	}
	shared := opts
	shared.SharedDir = true
	ln, err := Listen(sock, shared)
	if err != nil {
		t.Fatalf("with SharedDir: %v", err)
	}
	ln.Close()

	if os.Geteuid() != 0 {
		t.Skip("another user's directory needs root to make")
	}
	theirs := filepath.Join(root, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(theirs, "k.sock"), opts); !errors.Is(err, ErrSharedDir) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("in another user's directory: %v", err)
	}
}

// TestListenStickyDirectoryIsSafe: the sticky bit (as on /tmp) keeps others from renaming what is not theirs.
func TestListenStickyDirectoryIsSafe(t *testing.T) {
	sticky := filepath.Join(t.TempDir(), "sticky")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(filepath.Join(sticky, "own", "k.sock"), opts)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

// TestListenFailsCleanly: a path longer than the kernel takes is refused before anything is created, and
// directories Listen created for a socket it then could not bind are removed again.
func TestListenFailsCleanly(t *testing.T) {
	root := t.TempDir()
	long := filepath.Join(root, "new", strings.Repeat("s", maxPath)+".sock")
	if _, err := Listen(long, opts); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("a path of %d bytes: %v", len(long), err)
	}
	bad := filepath.Join(root, "a", "b", "k\x00.sock") // the directories can be made, the socket cannot
	if _, err := Listen(bad, opts); err == nil {
		t.Fatal("a socket name with a NUL byte was bound")
	}
	if entries, _ := os.ReadDir(root); len(entries) > 0 {
		t.Fatalf("failed Listens left %v", entries)
	}
}
