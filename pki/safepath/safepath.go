// Package safepath decides whether a path on this host is one that only root and the running user can
// change: the one rule behind "never write through a path another user controls", for konnect's keys,
// manifests and kubeconfigs (pki.WriteFile) and for its Unix sockets (pki/uds).
//
// A user can change what a path leads to when they own, or may write to, a directory that the path is
// looked up in, or own a symlink that it follows. So the path is resolved one name at a time, as the kernel
// resolves it, and every directory looked in and every link followed must belong to root or to the running
// user, and must not be writable by everyone (unless the sticky bit, as on /tmp, keeps others from renaming
// what is not theirs) or by a group other than root's or the user's own.
//
// Once a path passes, nobody but root and the user can change where it leads, so acting on it after the
// check does not race with anyone. The package reads only; it creates, changes and removes nothing. Its
// errors name what failed on the way (a directory, a link) but not the path asked about: callers prefix it.
package safepath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrShared is returned, wrapped, for a path that another user could change.
var ErrShared = errors.New("another user could change it")

// maxLinks bounds the symlinks followed, as the kernel's 40 (ELOOP).
const maxLinks = 40

// CheckDir refuses dir when another user could change what is in it: when it, or a directory above it, or
// one that a symlink on its path leads to, fails the rule (see the package comment). Directories that do
// not exist yet are not checked: the caller creates them, with its own owner and mode.
func CheckDir(dir string) error {
	_, _, err := resolve(dir)
	return err
}

// Resolve returns the file that a write to path lands in, and refuses what another user could redirect:
//   - path itself when it is no symlink, after checking its directory with CheckDir;
//   - when path is a symlink, the file it leads to, written through as an editor does (a certificate shared
//     by several directories, a kubeconfig kept with one's dotfiles), but only when every link on the way
//     belongs to root or the user, the file it leads to does too and no other user may write to it, and
//     the directories of both pass CheckDir. A link that leads nowhere, or to a directory, is refused.
//
// A missing parent directory is no error: the caller creates it.
func Resolve(path string) (string, error) {
	p, fi, err := resolve(path)
	if err != nil {
		return "", err
	}
	if lfi, err := os.Lstat(path); err != nil || lfi.Mode()&fs.ModeSymlink == 0 {
		return path, nil
	}
	if fi.IsDir() {
		return "", fmt.Errorf("it is a symlink to the directory %s, not to a file", p)
	}
	if why := othersCanChange(fi); why != "" {
		return "", fmt.Errorf("it is a symlink to %s, which %s: %w", p, why, ErrShared)
	}
	return p, nil
}

// CheckFile refuses an existing file that another user could change, through its path (see Resolve) or
// its owner and mode: for a file whose content konnect trusts, such as a CA certificate it keeps. A file
// that does not exist passes.
func CheckFile(path string) error {
	p, fi, err := resolve(path)
	if err != nil || fi == nil {
		return err
	}
	if why := othersCanChange(fi); why != "" {
		if lfi, err := os.Lstat(path); err == nil && lfi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("it is a symlink to %s, which %s: %w", p, why, ErrShared)
		}
		return fmt.Errorf("it %s: %w", why, ErrShared)
	}
	return nil
}

// resolve walks path from the root one name at a time, checking each directory it looks a name up in and
// each symlink it follows, also one at the end. It returns the resolved
// path and the FileInfo of what it names, or the first refusal. A missing name ends the walk with a nil
// FileInfo and the rest of the path appended unresolved, unless the name came from a symlink's target:
// that link leads nowhere, which is an error.
func resolve(path string) (string, fs.FileInfo, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", nil, err
	}
	rest := splitPath(abs)
	cur := "/"
	links := 0
	fromLink := 0 // how many names at the front of rest came from symlinks' targets
	for {
		// cur is a resolved directory: names are looked up in it.
		fi, err := os.Stat(cur)
		if err != nil {
			return "", nil, fmt.Errorf("directory %s: %w", cur, err)
		}
		if why := othersCanChange(fi); why != "" {
			return "", nil, fmt.Errorf("directory %s %s: %w", cur, why, ErrShared)
		}
		for {
			if len(rest) == 0 {
				return cur, fi, nil
			}
			name := rest[0]
			rest = rest[1:]
			linked := fromLink > 0
			if linked {
				fromLink--
			}
			switch name {
			case ".":
				continue
			case "..":
				// cur has no symlinks in it, so its parent is where ".." leads.
				cur = filepath.Dir(cur)
				continue
			}
			next := filepath.Join(cur, name)
			lfi, err := os.Lstat(next)
			switch {
			case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
				if linked {
					return "", nil, fmt.Errorf("a symlink on the way leads to %s, which does not exist", filepath.Join(append([]string{next}, rest[:fromLink]...)...))
				}
				return filepath.Join(append([]string{next}, rest...)...), nil, nil
			case err != nil:
				return "", nil, err
			}
			if lfi.Mode()&fs.ModeSymlink != 0 {
				if owner := ownerOf(lfi); !trustedOwner(owner) {
					return "", nil, fmt.Errorf("the symlink %s belongs to uid %d: %w", next, owner, ErrShared)
				}
				if links++; links > maxLinks {
					return "", nil, syscall.ELOOP
				}
				target, err := os.Readlink(next)
				if err != nil {
					return "", nil, err
				}
				parts := splitPath(target)
				rest = append(parts, rest...)
				fromLink += len(parts)
				if filepath.IsAbs(target) {
					cur = "/"
					break // check the root again
				}
				continue
			}
			if lfi.IsDir() {
				cur = next
				break // checked at the top of the outer loop
			}
			if len(rest) > 0 {
				return "", nil, fmt.Errorf("%s: %w", next, syscall.ENOTDIR)
			}
			return next, lfi, nil
		}
	}
}

func splitPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, string(filepath.Separator)) {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// othersCanChange says how a user other than root and us could change the file or directory of fi, or "".
func othersCanChange(fi fs.FileInfo) string {
	owner := ownerOf(fi)
	if !trustedOwner(owner) {
		return fmt.Sprintf("belongs to uid %d", owner)
	}
	mode := fi.Mode()
	// The sticky bit keeps others from renaming or removing what is not theirs in a directory.
	sticky := fi.IsDir() && mode&fs.ModeSticky != 0
	switch {
	case sticky:
	case mode.Perm()&0o002 != 0:
		if fi.IsDir() {
			return "is writable by everyone without the sticky bit"
		}
		return "is writable by everyone"
	case mode.Perm()&0o020 != 0:
		if gid := groupOf(fi); gid != 0 && gid != os.Getegid() {
			return fmt.Sprintf("is writable by group %d", gid)
		}
	}
	return ""
}

// OpenToOthers is OpenSSH's rule for a file that holds a secret (sshkey_perm_ok): it belongs to uid and its
// mode grants group or others any access. A file of someone else's (root's key read by root's service) is
// not uid's to fix and passes.
func OpenToOthers(fi fs.FileInfo, uid int) bool {
	return ownerOf(fi) == uid && fi.Mode().Perm()&0o077 != 0
}

func trustedOwner(uid int) bool { return uid == 0 || uid == os.Geteuid() }

func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return os.Geteuid()
}

func groupOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Gid)
	}
	return os.Getegid()
}
