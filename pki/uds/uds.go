// Package uds binds Unix-domain sockets the one way konnect does, for the tunnel server's frontend
// (kube-apiserver's egress) and for konnect proxy's --unix-socket.
//
// The policy: the socket's directory is created with a restrictive mode, or refused when another user could
// swap the socket in it or in a directory above it (the rule of pki/safepath); a file that is not a socket is
// never replaced; a socket that answers belongs to a running server and is refused; a stale one (nobody
// answers) is replaced only when asked. Two processes binding in one directory at once take turns (a lock on
// the directory), so that neither removes the socket the other has just bound. The mode is set with chmod
// right after bind, never by changing the umask: the umask is process-wide and would race with other
// goroutines creating files. Until the chmod the socket has the umask's mode, which without group or other
// write bits lets nobody else connect. Neither chmod follows a symlink, which someone who may write to a
// shared directory could put in the socket's place.
//
// Errors name the path, not a flag: the caller knows which flag the path came from.
package uds

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/pki/safepath"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

var (
	// ErrStale is returned, wrapped, for a stale socket in the way when Options.ReplaceStale is not set.
	ErrStale = errors.New("a stale socket is in the way")
	// ErrSharedDir is returned, wrapped, when Options.SharedDir is not set, for a directory on the socket's
	// path that another user could change: one that everyone may write to, or one of another user's.
	ErrSharedDir = safepath.ErrShared
)

// lockWait bounds how long Listen waits for another process that binds in the same directory.
var lockWait = 5 * time.Second

// CheckDir is the check Listen makes on a socket's directory, for callers that hand the path to another
// program, as konnect init does when it renders the server's pod: the error wraps ErrSharedDir.
func CheckDir(dir string) error { return safepath.CheckDir(dir) }

// Options say how to bind.
type Options struct {
	// Mode is the socket's mode, e.g. 0o600 for its owner only.
	Mode fs.FileMode
	// DirMode is the mode of the socket's directory when Listen creates it.
	DirMode fs.FileMode
	// ReplaceStale removes a socket file that nobody answers on.
	ReplaceStale bool
	// SharedDir accepts a directory that everyone may write to without the sticky bit, such as an emptyDir
	// volume that containers of one pod share: anyone who can write there could replace the socket.
	SharedDir bool
}

// maxPath is the longest socket path the kernel takes (sun_path, less its terminating NUL).
var maxPath = len(syscall.RawSockaddrUnix{}.Path) - 1

// CheckPath refuses a socket path that kube-apiserver cannot dial, which its egress selector configuration
// refuses too: a relative path (resolved against the working directory of whoever binds or dials it, which
// kube-apiserver and the server do not share) or one longer than a socket's path may be. konnect init
// checks the path it writes there, and konnect server the one it binds, with this one rule. The error
// names the path, not a flag.
func CheckPath(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("unix socket path %q must be absolute", path)
	}
	if len(path) > maxPath {
		return fmt.Errorf("unix socket path %q is %d bytes long, more than the %d a unix socket allows", path, len(path), maxPath)
	}
	return nil
}

// Listen binds path by the package's policy. Directories it created are removed again when it fails.
func Listen(path string, o Options) (_ *net.UnixListener, err error) {
	if len(path) > maxPath {
		return nil, fmt.Errorf("%s is %d bytes long, and a Unix socket's path may have at most %d", path, len(path), maxPath)
	}
	created, err := ensureDir(filepath.Dir(path), o.DirMode, o.SharedDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && created != "" {
			removeCreated(filepath.Dir(path), created)
		}
	}()
	unlock, err := lockDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer unlock()
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case fi.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("%s exists and is not a socket; refusing to replace it", path)
	default:
		c, derr := net.DialTimeout("unix", path, time.Second)
		if derr == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use by a running server (another server is listening on this socket); stop it first", path)
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%s: cannot tell whether the existing socket is in use: %w", path, derr)
		}
		if !o.ReplaceStale {
			return nil, fmt.Errorf("%s: %w", path, ErrStale)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
		klog.InfoS("Replaced a stale socket", "path", path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := chmodSocket(path, o.Mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// beforeChmod runs between bind and chmod; tests put a symlink in the socket's place there.
var beforeChmod = func(string) {}

// chmodSocket sets the mode of the socket at path without following a symlink: the file is opened by path
// (O_PATH, not following a link) and changed through /proc/self/fd, as glibc does for fchmodat with
// AT_SYMLINK_NOFOLLOW, which Linux's own fchmodat lacks.
func chmodSocket(path string, mode fs.FileMode) error {
	beforeChmod(path)
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("%s is no longer the socket just bound: something replaced it", path)
	}
	return os.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), mode)
}

// lockDir takes an exclusive lock on dir (flock on the directory itself, so that no file is added to it),
// waiting at most lockWait for another process that binds there.
func lockDir(dir string) (unlock func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lock directory %s: %w", dir, err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			unix.Close(fd)
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("lock directory %s: another process has held its lock for %s", dir, lockWait)
			}
			return nil, fmt.Errorf("lock directory %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ensureDir creates dir with mode, after checking that no directory above it could be used to swap the
// socket, or checks an existing one and those above it likewise, unless shared says they may be. It returns
// the topmost directory it created, or "".
func ensureDir(dir string, mode fs.FileMode, shared bool) (created string, err error) {
	if !shared {
		if err := safepath.CheckDir(dir); err != nil {
			return "", err
		}
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		created = dir
		for d := filepath.Dir(dir); d != filepath.Dir(d); d = filepath.Dir(d) {
			if _, err := os.Stat(d); err == nil {
				break
			}
			created = d
		}
		if err := os.MkdirAll(dir, mode); err != nil {
			return "", fmt.Errorf("create directory %s: %w", dir, err)
		}
		// MkdirAll applies the umask; set the mode we meant.
		if err := chmodDir(dir, mode); err != nil {
			removeCreated(dir, created)
			return "", fmt.Errorf("chmod directory %s: %w", dir, err)
		}
		return created, nil
	}
	if err != nil {
		return "", fmt.Errorf("directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	return "", nil
}

// chmodDir sets the mode of the directory just made at dir, refusing a symlink put in its place.
func chmodDir(dir string, mode fs.FileMode) error {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Chmod(mode)
}

// removeCreated removes dir and the directories above it up to created, those that ensureDir made, as long
// as they are empty.
func removeCreated(dir, created string) {
	for d := dir; ; d = filepath.Dir(d) {
		if os.Remove(d) != nil || d == created || d == filepath.Dir(d) {
			return
		}
	}
}
