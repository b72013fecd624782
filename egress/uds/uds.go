// Package uds binds Unix-domain sockets the one way konnect does, for the tunnel server's frontend
// (kube-apiserver's egress) and for konnect proxy's --unix-socket.
//
// The policy: the socket's directory is created with a restrictive mode, or refused when another user could
// swap the socket in it or in a directory above it; a file that is not a socket is never replaced; a socket
// that answers belongs to a running server and is refused; a stale one (nobody answers) is replaced only when
// asked. The mode is set with chmod
// right after bind, never by changing the umask: the umask is process-wide and would race with other
// goroutines creating files. Until the chmod the socket has the umask's mode, which without group or other
// write bits lets nobody else connect.
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

	"k8s.io/klog/v2"
)

var (
	// ErrStale is returned, wrapped, for a stale socket in the way when Options.ReplaceStale is not set.
	ErrStale = errors.New("a stale socket is in the way")
	// ErrSharedDir is returned, wrapped, when Options.SharedDir is not set, for a directory on the socket's
	// path that another user could change: one that everyone may write to, or one of another user's.
	ErrSharedDir = errors.New("another user could replace the socket")
)

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
	if err := os.Chmod(path, o.Mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// ensureDir creates dir with mode, after checking that no directory above it could be used to swap the
// socket, or checks an existing one and those above it likewise, unless shared says they may be. It returns
// the topmost directory it created, or "".
func ensureDir(dir string, mode fs.FileMode, shared bool) (created string, err error) {
	if !shared {
		if err := checkDirs(dir); err != nil {
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
		if err := os.Chmod(dir, mode); err != nil {
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

// checkDirs refuses dir when it, or a directory above it, would let another user replace the socket or
// the directories on its path: one that everyone may write to without the sticky bit (which keeps others
// from renaming what is not theirs, as in /tmp), or one that belongs to a user other than root and us.
// Directories that do not exist yet are skipped: ensureDir creates them.
func checkDirs(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Errorf("directory %s: %w", d, err)
		case fi.Mode().Perm()&0o002 != 0 && fi.Mode()&fs.ModeSticky == 0:
			return fmt.Errorf("directory %s is writable by everyone without the sticky bit: %w", d, ErrSharedDir)
		default:
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
				return fmt.Errorf("directory %s belongs to uid %d: %w", d, st.Uid, ErrSharedDir)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
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
