package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/pki/interrupt"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"golang.org/x/sys/unix"
)

// LockFile is the file in a konnect directory whose lock every command that writes into the directory
// holds: two runs of konnect init at once would otherwise each create a CA and leave leaves that the other
// one's CA signed.
const LockFile = ".konnect.lock"

// Lock takes the exclusive lock of dir, an flock on dir/LockFile, and returns the function that releases
// it. The kernel releases it too when the process ends, however it ends, so a lock is never left stale. When
// another process holds it, Lock calls waiting once, with that process's pid if known, and waits at most
// wait before it gives up with an error that says who holds it.
//
// dir must pass safepath.CheckDir. When it does not exist, Lock creates it (mode 0755) if create is set,
// and otherwise returns without a lock: there is nothing in it to protect. The lock file is created without
// following a symlink and must be a plain file of root's or ours. When dir cannot be written to (read-only,
// or not ours to write), Lock returns without a lock: nobody with our rights can write there either, and
// the caller's first write fails naming its file, as it would without a lock; a run that finds everything in
// place still succeeds. Release removes the lock file again, and the directories Lock created if they are
// still empty, so that a command that then wrote nothing leaves nothing behind; whoever waited on the
// removed file finds that out and locks the new one.
func Lock(dir string, wait time.Duration, create bool, waiting func(holder string)) (release func(), err error) {
	if err := safepath.CheckDir(dir); err != nil {
		return nil, fmt.Errorf("refusing to lock %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockFile)
	deadline := time.Now().Add(wait)
	told := false
	created := ""
	var fd int
	// An interrupted command leaves no lock file behind, whenever the signal comes: what this run opened
	// it removes if it can lock it (it is then this run's, as for release), and the directories it made.
	var undoMu sync.Mutex
	opened := -1
	stopUndo := interrupt.Undo(func() {
		undoMu.Lock()
		defer undoMu.Unlock()
		if opened >= 0 && unix.Flock(opened, unix.LOCK_EX|unix.LOCK_NB) == nil && samePath(opened, path) {
			_ = unix.Unlink(path)
		}
		removeCreated(dir, created)
	})
	holding := false
	defer func() {
		if !holding {
			stopUndo()
		}
	}()
	closeOpened := func() {
		undoMu.Lock()
		opened = -1
		undoMu.Unlock()
		unix.Close(fd)
	}
	for {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("another konnect command%s has been writing into %s for more than %s (it holds %s); let it finish, then run this again", describeHolder(lockHolder(path)), dir, wait, path)
		}
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			if !create {
				return func() {}, nil
			}
			undoMu.Lock()
			top, err := mkdirAll(dir)
			if err == nil && created == "" {
				created = top
			}
			undoMu.Unlock()
			if errors.Is(err, fs.ErrNotExist) {
				// The holder before us removed a directory above dir, empty once its lock file went, while
				// we made the ones below it. Returning here would hand out no lock to a second holder.
				continue
			}
			if err != nil {
				return func() {}, nil // see "cannot be written to" above: the caller's own mkdir says why
			}
		}
		undoMu.Lock()
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(KeyMode))
		if err == nil {
			opened = fd
		}
		undoMu.Unlock()
		if errors.Is(err, unix.ENOENT) {
			continue // the directory was removed by the holder before us, which had created it
		}
		if errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES) {
			return func() {}, nil // see "cannot be written to" above
		}
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if lockOpened != nil {
			lockOpened(path)
		}
		if err := checkLockFile(fd, path); err != nil {
			closeOpened()
			if errors.Is(err, errLockRemoved) {
				continue // its holder released it between our open and our look: lock the next one
			}
			return nil, err
		}
		locked := false
		for !locked {
			err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
			switch {
			case err == nil:
				locked = true
				continue
			case !errors.Is(err, unix.EWOULDBLOCK):
				closeOpened()
				return nil, fmt.Errorf("lock %s: %w", path, err)
			case time.Now().After(deadline):
				holder := lockHolder(path)
				closeOpened()
				return nil, fmt.Errorf("another konnect command%s has been writing into %s for more than %s (it holds %s); let it finish, then run this again", describeHolder(holder), dir, wait, path)
			}
			if !told && waiting != nil {
				waiting(lockHolder(path))
				told = true
			}
			time.Sleep(50 * time.Millisecond)
		}
		// The holder before us removes the file when it is done: only the file still at path is the lock.
		if samePath(fd, path) {
			break
		}
		closeOpened()
	}
	// For the message of whoever waits next; the lock itself is the flock, not this content.
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if unix.Ftruncate(fd, 0) == nil {
		_, _ = unix.Pwrite(fd, pid, 0)
	}
	holding = true
	return func() {
		stopUndo()
		// Removed while still locked, so that nobody locks this file after us without noticing.
		_ = unix.Unlink(path)
		unix.Close(fd)
		removeCreated(dir, created)
	}, nil
}

// removeCreated removes dir and the directories above it up to created, the topmost one Lock created,
// while they are empty.
func removeCreated(dir, created string) {
	if created == "" {
		return
	}
	for d := dir; os.Remove(d) == nil && d != created; d = filepath.Dir(d) {
	}
}

// lockOpened, when a test sets it, runs between Lock's open of the lock file and its look at the file: the
// moment at which the holder before it can release the lock and remove the file.
var lockOpened func(path string)

// samePath reports whether fd is the file at path.
func samePath(fd int, path string) bool {
	var a, b unix.Stat_t
	return unix.Fstat(fd, &a) == nil && unix.Lstat(path, &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino
}

// mkdirAll creates dir and the directories above it that are missing, mode 0755, and returns the topmost
// one it created.
func mkdirAll(dir string) (string, error) {
	top := dir
	for d := filepath.Dir(dir); d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		top = d
	}
	return top, os.MkdirAll(dir, 0o755)
}

// errLockRemoved is checkLockFile's answer for a lock file that its holder removed after we opened it.
var errLockRemoved = errors.New("lock file removed by its holder")

// checkLockFile refuses a lock file that is not a plain file of root's or ours with one link: a planted
// one could be held by its owner for ever.
func checkLockFile(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 0 {
		return errLockRemoved
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return fmt.Errorf("lock %s: not a plain file with a single link; remove it", path)
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("refusing to lock %s: it belongs to uid %d: %w", path, st.Uid, safepath.ErrShared)
	}
	return nil
}

// lockHolder is the pid the holder of the lock at path wrote into it, or "".
func lockHolder(path string) string {
	data, err := smallfile.Read(path)
	if err != nil {
		return ""
	}
	pid := strings.TrimSpace(string(data))
	if _, err := strconv.Atoi(pid); err != nil {
		return ""
	}
	return pid
}

func describeHolder(pid string) string {
	if pid == "" {
		return ""
	}
	return " (pid " + pid + ")"
}
