// Package smallfile reads the small files konnect takes its configuration and credentials from:
// certificates, keys, CA bundles, kubeconfigs, tokens, password files, manifests, SSH keys and
// known_hosts. Such a file is named by a flag or kept in a directory an operator manages, so a mistake or a
// hostile path must fail at once with the file named, never hang the program or fill its memory: a FIFO
// (whose open blocks until a writer comes), a device such as /dev/zero (endless), or a huge file.
package smallfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxSize bounds what Read reads. The largest file konnect reads is a CA bundle: a distribution's full set of
// public roots is about 220 KiB, and a kubeconfig with a handful of embedded certificates, a manifest or
// a known_hosts of a few thousand hosts stays below 1 MiB. 4 MiB leaves room for all of them many times
// over, while a wrong file costs at most that much memory.
const MaxSize = 4 << 20

// ErrNotRegular is returned, wrapped, for a path that names no regular file (after following symlinks).
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is matched (errors.Is) by the error for a file larger than the bound of its read.
var ErrTooLarge = errors.New("file too large")

// tooLarge is the error for path, larger than max bytes: "PATH: larger than 4 MiB".
type tooLarge struct {
	path string
	max  int64
}

func (e *tooLarge) Error() string        { return fmt.Sprintf("%s: larger than %d MiB", e.path, e.max>>20) }
func (e *tooLarge) Is(target error) bool { return target == ErrTooLarge }

// Read returns the content of the regular file at path (a symlink to one is followed), or nothing for the
// null device (/dev/null). It opens path
// without blocking, so that a FIFO cannot hang it, and refuses anything but a regular file
// ("PATH: not a regular file (a fifo)") and a file larger than MaxSize ("PATH: larger than 4 MiB"). Errors
// of open keep their type (*fs.PathError): os.IsNotExist and errors.Is(err, fs.ErrNotExist) still tell a
// missing file. Every error names path.
func Read(path string) ([]byte, error) {
	data, _, err := ReadInfo(path)
	return data, err
}

// ReadInfo is Read, also returning the FileInfo of the file it read, for a check of its owner or mode that
// applies to what was read rather than to what path names a moment later.
func ReadInfo(path string) ([]byte, fs.FileInfo, error) {
	return readInfo(path, MaxSize)
}

// ReadUpTo is Read with a bound of max bytes instead of MaxSize, for a file that may rightly be larger: a
// fleet's known_hosts (tens of thousands of hosts, several keys each) can pass 4 MiB.
func ReadUpTo(path string, max int64) ([]byte, error) {
	data, _, err := readInfo(path, max)
	return data, err
}

func readInfo(path string, max int64) ([]byte, fs.FileInfo, error) {
	// O_NONBLOCK: open(2) of a FIFO with no writer returns at once instead of waiting for one. It changes
	// nothing for a regular file, whose reads never block on it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	// The open file's type and size, not path's: path may name something else by now.
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if err := check(path, fi, max); err != nil {
		return nil, nil, err
	}
	// Read one byte past the bound: a file that grew since the Stat is refused as well.
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if int64(len(data)) > max {
		return nil, nil, &tooLarge{path, max}
	}
	return data, fi, nil
}

// Check refuses, without opening it, a path that Read would refuse for its type or size: for a command that
// checks its flags before it reads the files they name. A missing file is the error of os.Stat.
func Check(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	return check(path, fi, MaxSize)
}

func check(path string, fi fs.FileInfo, max int64) error {
	if !fi.Mode().IsRegular() && !IsNull(fi) {
		return fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, kind(fi.Mode()))
	}
	if fi.Size() > max {
		return &tooLarge{path, max}
	}
	return nil
}

// IsNull says whether fi is the null device (by its device number, whatever its name), which reads as an
// empty file: "/dev/null" is the usual way to say "no file" to ssh (-F /dev/null, UserKnownHostsFile
// /dev/null) and to other tools.
func IsNull(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && unix.Major(uint64(st.Rdev)) == 1 && unix.Minor(uint64(st.Rdev)) == 3
}

// kind names the type of a file that is not regular.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a fifo"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	default:
		return "type " + m.Type().String()
	}
}
