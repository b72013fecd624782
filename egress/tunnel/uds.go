package tunnel

import (
	"fmt"
	"io/fs"
	"net"
	"os"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/reload"
	"github.com/konnect-dev/konnect/pki/uds"
)

const (
	// socketMode lets kube-apiserver reach the socket as the owner or through the group; nobody else.
	socketMode = 0o660
	// socketDirMode is used when konnect creates the socket's directory.
	socketDirMode = 0o750
)

// listenUDS binds the frontend socket by package uds's policy. A stale socket is replaced when replaceStale
// is set; otherwise the error is uds.ErrStale. sharedDir accepts a directory that everyone may write to.
func listenUDS(path string, replaceStale, sharedDir bool) (*net.UnixListener, error) {
	ln, err := uds.Listen(path, uds.Options{Mode: socketMode, DirMode: socketDirMode, ReplaceStale: replaceStale, SharedDir: sharedDir})
	if err != nil {
		return nil, field.Errorf("{UDSName}: %w", err)
	}
	return ln, nil
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
