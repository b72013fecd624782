package uds

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// TestListenConcurrently: processes that start at once on one path, with a stale socket in the way, take
// turns: one binds, the others find it answering and are refused. Without the turns, each removed the
// socket the one before it had just bound, and a server listened on a socket nobody could reach.
func TestListenConcurrently(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "k.sock")
	o := opts
	o.ReplaceStale = true
	for round := 0; round < 20; round++ {
		stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		stale.SetUnlinkOnClose(false)
		stale.Close()
		const n = 6
		lns := make(chan *net.UnixListener, n)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ln, err := Listen(sock, o)
				if err != nil {
					errs <- err
					return
				}
				lns <- ln
			}()
		}
		wg.Wait()
		close(lns)
		close(errs)
		var bound []*net.UnixListener
		for ln := range lns {
			bound = append(bound, ln)
		}
		for err := range errs {
			if !strings.Contains(err.Error(), "in use by a running server") {
				t.Errorf("round %d: a losing Listen: %v", round, err)
			}
		}
		if len(bound) != 1 {
			t.Fatalf("round %d: %d of %d concurrent Listens bound the socket, want exactly 1", round, len(bound), n)
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("round %d: the one listener is not reachable at %s: %v", round, sock, err)
		}
		c.Close()
		bound[0].Close()
	}
}

// TestListenChmodDoesNotFollowSymlinks: in a directory others may write to (SharedDir), someone can put a
// symlink where the socket was just bound; the chmod that follows must not change the file it points to.
func TestListenChmodDoesNotFollowSymlinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock", "k.sock")
	beforeChmod = func(path string) {
		if err := os.Remove(path); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(victim, path); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { beforeChmod = func(string) {} })
	o := Options{Mode: 0o666, DirMode: 0o755, SharedDir: true}
	if ln, err := Listen(sock, o); err == nil {
		ln.Close()
		t.Error("Listen succeeded with a symlink in the socket's place")
	}
	if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the symlink's target: %v %v, want mode 0600 kept", fi.Mode(), err)
	}
}
