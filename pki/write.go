package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// File modes of what this package writes.
const (
	KeyMode  fs.FileMode = 0o600
	CertMode fs.FileMode = 0o644
	DirMode  fs.FileMode = 0o700
)

// tempPattern names WriteFile's temporary files for path.
func tempPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

// RemoveStaleTemps deletes the temporary files that a WriteFile of path, killed before its rename, left
// beside it; for a key or a kubeconfig they hold key material.
func RemoveStaleTemps(path string) {
	if target, err := resolveLink(path); err == nil {
		path = target
	}
	stale, _ := filepath.Glob(filepath.Join(filepath.Dir(path), tempPattern(path)))
	for _, p := range stale {
		_ = os.Remove(p)
	}
}

// WriteFile writes data to path atomically: a temporary file in the same directory is written, synced,
// renamed over path, and the directory is synced, so that a crash leaves either the old file or the new
// one. A file that already holds exactly data (with mode perm) is not touched; changed reports whether
// anything was written. Missing parent directories are created with mode dirPerm. A symlink at path is
// written through, as an editor would: replaced by a file, it would leave the file it points to (a
// certificate shared by several directories, a kubeconfig kept with one's dotfiles) as it was.
func WriteFile(path string, data []byte, perm, dirPerm fs.FileMode) (changed bool, err error) {
	if path, err = resolveLink(path); err != nil {
		return false, err
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() == perm {
			return false, nil
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return false, fmt.Errorf("create directory for %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	// Chmod before writing so that key material is never readable by others, not even briefly.
	if err = f.Chmod(perm); err != nil {
		f.Close()
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if _, err = f.Write(data); err != nil {
		f.Close()
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return false, fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err = syncDir(dir); err != nil {
		return true, fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	return true, nil
}

// resolveLink returns the file that a symlink at path leads to, or path itself when it is no symlink.
func resolveLink(path string) (string, error) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return path, nil
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("write %s: a symlink whose target cannot be resolved: %w", path, err)
	}
	return target, nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}

// exists reports whether path exists; errors other than "not found" count as existing so that the caller's
// later read reports them with the file name.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil || !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR)
}
