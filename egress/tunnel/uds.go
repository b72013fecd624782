package tunnel

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/pki/reload"
	"k8s.io/klog/v2"
)

const (
	// socketMode lets kube-apiserver reach the socket as the owner or through the group; nobody else.
	socketMode = 0o660
	// socketDirMode is used when konnect creates the socket's directory.
	socketDirMode = 0o750
)

// listenUDS binds the frontend socket. A socket file that nobody answers on is stale (a server that died) and
// is replaced when replaceStale is set; a socket that answers belongs to a running server and is refused, as
// is any file that is not a socket.
func listenUDS(path string, replaceStale bool) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := ensureSocketDir(dir); err != nil {
		return nil, err
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("--uds-name %s: %w", path, err)
	case fi.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("--uds-name %s: exists and is not a socket; refusing to replace it", path)
	default:
		c, derr := net.DialTimeout("unix", path, time.Second)
		if derr == nil {
			c.Close()
			return nil, fmt.Errorf("--uds-name %s: another server is listening on this socket; stop it first", path)
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("--uds-name %s: cannot tell whether the existing socket is in use: %w", path, derr)
		}
		if !replaceStale {
			return nil, fmt.Errorf("--uds-name %s: a stale socket is in the way; remove it or pass --delete-existing-uds-file", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("--uds-name %s: remove stale socket: %w", path, err)
		}
		klog.InfoS("Replaced a stale frontend socket", "path", path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("--uds-name %s: listen: %w", path, err)
	}
	// chmod after bind instead of changing the umask: the umask is process-wide and would race with other
	// goroutines creating files. Until the chmod the socket has the umask's mode, which without group or
	// other write bits lets nobody else connect.
	if err := os.Chmod(path, socketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--uds-name %s: chmod: %w", path, err)
	}
	return ln, nil
}

// ensureSocketDir creates dir with a restrictive mode, or checks that an existing one cannot be used to swap
// the socket under kube-apiserver (writable by others without the sticky bit).
func ensureSocketDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, socketDirMode); err != nil {
			return fmt.Errorf("--uds-name: create directory %s: %w", dir, err)
		}
		// MkdirAll applies the umask; set the mode we meant.
		if err := os.Chmod(dir, socketDirMode); err != nil {
			return fmt.Errorf("--uds-name: chmod directory %s: %w", dir, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("--uds-name: directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("--uds-name: %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o002 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("--uds-name: directory %s is writable by everyone; anyone could replace the socket", dir)
	}
	return nil
}

// socketPresent reports whether path is still the socket this server bound (same inode), for readiness.
func socketPresent(path string, ino uint64) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("frontend socket: %w", err)
	}
	if fi.Mode()&fs.ModeSocket == 0 || reload.Inode(fi) != ino {
		return fmt.Errorf("frontend socket %s was replaced by something else", path)
	}
	return nil
}
