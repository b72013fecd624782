//go:build unix

package sshdial

import (
	"io/fs"
	"os"
	"syscall"
)

// fileOwner returns the owner of the file fi describes.
func fileOwner(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// currentUID is the real user id, the one OpenSSH compares a key file's owner with.
func currentUID() int { return os.Getuid() }
