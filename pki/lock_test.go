package pki

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/safepath"
	"golang.org/x/sys/unix"
)

// TestLock: a second holder waits, is told who holds the lock, and gives up after its wait with an error
// naming the holder; it gets the lock once the first lets go. A lock file that is a symlink or another
// user's is refused, and a directory that does not exist is only created when asked.
func TestLock(t *testing.T) {
	dir := t.TempDir()
	release, err := Lock(dir, time.Second, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, LockFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v %v, want mode 0600", fi, err)
	}
	var holder string
	start := time.Now()
	_, err = Lock(dir, 300*time.Millisecond, false, func(h string) { holder = h })
	pid := strconv.Itoa(os.Getpid())
	if err == nil || !strings.Contains(err.Error(), "pid "+pid) || !strings.Contains(err.Error(), dir) || holder != pid {
		t.Fatalf("a second Lock while the first holds: %v (told holder %q), want an error naming pid %s", err, holder, pid)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond || waited > 5*time.Second {
		t.Errorf("waited %s for a 300ms bound", waited)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	got := make(chan error, 1)
	go func() {
		defer wg.Done()
		r, err := Lock(dir, 10*time.Second, false, nil)
		if err == nil {
			r()
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	release()
	wg.Wait()
	if err := <-got; err != nil {
		t.Fatalf("after release: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("released locks left %v", entries)
	}

	missing := filepath.Join(t.TempDir(), "missing")
	if r, err := Lock(missing, time.Second, false, nil); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("Lock without create made %s: %v", missing, err)
	}
	r, err := Lock(filepath.Join(missing, "sub"), time.Second, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(missing, "sub", LockFile)); err != nil {
		t.Errorf("Lock with create: %v", err)
	}
	r()
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the directories Lock created are left, empty: %v", err)
	}

	linked := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	must(t, os.WriteFile(victim, []byte("x"), 0o644))
	must(t, os.Symlink(victim, filepath.Join(linked, LockFile)))
	if _, err := Lock(linked, time.Second, false, nil); err == nil {
		t.Error("a symlinked lock file was used")
	}
	open := filepath.Join(t.TempDir(), "open")
	must(t, os.Mkdir(open, 0o777))
	must(t, os.Chmod(open, 0o777))
	if _, err := Lock(open, time.Second, false, nil); !errors.Is(err, safepath.ErrShared) {
		t.Errorf("a directory everyone may write to: %v", err)
	}

	needRoot(t)
	theirs := t.TempDir()
	must(t, os.WriteFile(filepath.Join(theirs, LockFile), nil, 0o600))
	must(t, os.Chown(filepath.Join(theirs, LockFile), otherUser, otherUser))
	if _, err := Lock(theirs, time.Second, false, nil); !errors.Is(err, safepath.ErrShared) {
		t.Errorf("another user's lock file: %v", err)
	}
}

// TestLockExcludes: many holders at once on a directory that does not exist yet, each removing the lock file
// and the directory when done, are never inside at the same time.
func TestLockExcludes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fresh", "dir")
	var inside, most, done int32
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				release, err := Lock(dir, 20*time.Second, true, nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				most = max(most, inside)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				inside--
				done++
				mu.Unlock()
				release()
			}
		}()
	}
	wg.Wait()
	if most != 1 || done != 200 {
		t.Fatalf("%d holders at once at most, %d of 200 turns done; want 1 and 200", most, done)
	}
}

// TestLockFileRemovedAfterOpen: a run that opens the lock file just as its holder releases it (and removes
// it) finds a file with no link left. That is the next lock to take, not a planted file to refuse:
// TestConcurrentInit's waiters once failed with "not a plain file with a single link".
func TestLockFileRemovedAfterOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, LockFile)
	opened := 0
	lockOpened = func(p string) {
		opened++
		if opened == 1 {
			if err := os.Remove(p); err != nil { // the holder's release, between our open and our look
				t.Error(err)
			}
		}
	}
	defer func() { lockOpened = nil }()
	release, err := Lock(dir, 5*time.Second, false, nil)
	if err != nil {
		t.Fatalf("Lock with its lock file removed after the open: %v", err)
	}
	defer release()
	if opened != 2 {
		t.Errorf("Lock opened the lock file %d times, want 2 (the removed one, then the next)", opened)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("the lock taken is not the file at %s: %v", path, err)
	}
	if fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Errorf("the file at %s is not locked: flock = %v", path, err)
		}
		unix.Close(fd)
	}
}
