package kubeconfigcmd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// kubeconfigLockWait bounds how long set-proxy waits for another program to finish changing the kubeconfig.
// kubectl holds the lock for milliseconds; a lock held longer was most likely left by a program that was
// killed, and the error says so.
const kubeconfigLockWait = 30 * time.Second

// lockMarker starts what konnect writes into a kubeconfig lock it holds. kubectl leaves its lock empty.
const lockMarker = "konnect kubeconfig set-proxy pid "

// lockKubeconfig takes the lock that kubectl and every client-go program take before they change a
// kubeconfig (clientcmd.ModifyConfig): the file NAME.lock, created with O_EXCL and removed when done, for
// each of names (the kubeconfig as the user named it, and the file a symlink there leads to), in sorted
// order as client-go takes them. So set-proxy and `kubectl config set` take turns, and so do two runs of
// set-proxy, instead of each writing back the file as it read it, with only its own change.
//
// kubectl gives up at once when the lock exists; set-proxy waits, at most wait, calling waiting once with
// the lock it waits for and who holds it. A lock of konnect's whose process has ended is taken over: konnect
// also holds an flock on it while it lives, which the kernel releases however the process ends. An empty
// lock is kubectl's, and is waited for; after wait the error names it, to be removed if no program runs.
// The directories of names must have passed safepath: the lock is created beside each, never through a
// symlink.
func lockKubeconfig(names []string, wait time.Duration, waiting func(lock, holder string)) (release func(), err error) {
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	deadline := time.Now().Add(wait)
	var releases []func()
	release = func() {
		for i := len(releases) - 1; i >= 0; i-- {
			releases[i]()
		}
	}
	for _, name := range names {
		r, err := takeLock(name+".lock", deadline, wait, waiting)
		if err != nil {
			release()
			return nil, err
		}
		releases = append(releases, r)
	}
	return release, nil
}

// takeLock creates lock with O_EXCL, waiting until deadline while another program holds it.
func takeLock(lock string, deadline time.Time, wait time.Duration, waiting func(lock, holder string)) (func(), error) {
	told := false
	for {
		fd, err := unix.Open(lock, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			// Nobody else can hold an flock on a file that did not exist a moment ago. The marker is written
			// after the flock, so that a lock that carries it and has no flock is one whose holder is gone.
			if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
				unix.Close(fd)
				_ = unix.Unlink(lock)
				return nil, fmt.Errorf("lock %s: %w", lock, err)
			}
			_, _ = unix.Write(fd, []byte(lockMarker+strconv.Itoa(os.Getpid())+"\n"))
			return func() {
				// Removed only while it is still ours, and before the flock is let go.
				if samePath(fd, lock) {
					_ = unix.Unlink(lock)
				}
				unix.Close(fd)
			}, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("lock %s: %w", lock, err)
		}
		holder, stale := inspectLock(lock)
		if stale {
			continue // removed; try again at once
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s has been held for more than %s by %s; if no such program is running, one was killed while it changed the kubeconfig: remove %s and run this again", lock, wait, holder, lock)
		}
		if !told && waiting != nil {
			waiting(lock, holder)
			told = true
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inspectLock says who holds an existing lock, and removes it (stale) when it is one of konnect's whose
// process has ended.
func inspectLock(lock string) (holder string, stale bool) {
	const kubectl = "kubectl or another program that changes kubeconfigs"
	fd, err := unix.Open(lock, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return kubectl, false // gone already (the next try creates it), or not ours to judge
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || (st.Uid != 0 && int(st.Uid) != os.Geteuid()) {
		return kubectl, false
	}
	buf := make([]byte, 64)
	n, _ := unix.Pread(fd, buf, 0)
	pid, ok := strings.CutPrefix(string(bytes.TrimSpace(buf[:max(n, 0)])), lockMarker)
	if !ok {
		return kubectl, false
	}
	holder = "konnect (pid " + pid + ")"
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return holder, false // its holder lives
	}
	// Its holder is gone. Removed while we hold its flock, and only if it is still the file at lock, so
	// that two runs that both find it stale cannot remove a fresh lock of a third.
	if samePath(fd, lock) {
		_ = unix.Unlink(lock)
	}
	return holder, true
}

// samePath reports whether fd is the file at path.
func samePath(fd int, path string) bool {
	var a, b unix.Stat_t
	return unix.Fstat(fd, &a) == nil && unix.Lstat(path, &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino
}
