package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/pki/interrupt"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"golang.org/x/sys/unix"
)

// File modes of what this package writes.
const (
	KeyMode  fs.FileMode = 0o600
	CertMode fs.FileMode = 0o644
	DirMode  fs.FileMode = 0o700
)

// tempPattern names WriteFile's temporary files for path.
func tempPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

// RemoveStaleTemps deletes the temporary files that a WriteFile of path, or a Backup of it beside its
// target, killed before its rename or link left beside it; for a key or a kubeconfig they hold key material.
// Only what konnect's writes make is taken: a name made by tempPattern (.NAME.tmp-DIGITS, or
// ..NAME.konnect-backup-STAMP.tmp-DIGITS for a backup), on a regular file of the user running konnect. A
// symlink, a directory, another user's file, or any other name is left alone. The caller holds the lock of
// the directory (Lock), so that no write in flight is taken for a killed one.
func RemoveStaleTemps(path string) {
	// Beside a symlink's target only where WriteFile would write: never in a directory of another user's.
	path, err := safepath.Resolve(path)
	if err != nil {
		return
	}
	dir := filepath.Dir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	write, backup := staleTempNames(filepath.Base(path))
	for _, e := range entries {
		if !write.MatchString(e.Name()) && !backup.MatchString(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
			continue
		}
		_ = os.Remove(p) // unlinks the name: never follows a symlink
	}
}

// staleTempNames match the names of the temporary files that WriteFile (tempPattern: os.CreateTemp puts
// decimal digits for its star) and Backup beside the target leave for a file named base.
func staleTempNames(base string) (write, backup *regexp.Regexp) {
	q := regexp.QuoteMeta(base)
	return regexp.MustCompile(`^\.` + q + `\.tmp-[0-9]+$`),
		regexp.MustCompile(`^\.\.` + q + `\.konnect-backup-[0-9]{8}T[0-9]{6}Z(-[0-9]+)?\.tmp-[0-9]+$`)
}

// WriteFile writes data to path atomically: a temporary file in the same directory is written, synced,
// renamed over path, and the directory is synced, so that a crash leaves either the old file or the new
// one. A file that already holds exactly data (with mode perm) is not touched; changed reports whether
// anything was written. Missing parent directories are created with mode dirPerm. A symlink at path is
// written through, as an editor would: replaced by a file, it would leave the file it points to (a
// certificate shared by several directories, a kubeconfig kept with one's dotfiles) as it was.
//
// Nothing is written where another user could redirect it (safepath.Resolve): a directory on the way that
// they own or may write to, or a symlink that is theirs or leads to a file or directory they could change.
// The error names path and wraps safepath.ErrShared.
func WriteFile(path string, data []byte, perm, dirPerm fs.FileMode) (changed bool, err error) {
	target, err := safepath.Resolve(path)
	if errors.Is(err, safepath.ErrShared) {
		return false, fmt.Errorf("refusing to write %s: %w", path, err)
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	path = target
	if old, err := smallfile.Read(path); err == nil && bytes.Equal(old, data) {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() == perm {
			return false, nil
		}
	}
	if err := writeTemp(path, data, perm, dirPerm, os.Rename); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err = syncDir(filepath.Dir(path)); err != nil {
		return true, fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	return true, nil
}

// createFile writes data to path as WriteFile does, but never replaces a file: a hard link makes the
// written file appear whole under path, or fails with fs.ErrExist. path is not resolved.
func createFile(path string, data []byte, perm, dirPerm fs.FileMode) error {
	if err := writeTemp(path, data, perm, dirPerm, os.Link); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// writeTemp writes data, synced and with mode perm, to a temporary file beside path and hands it to place
// (os.Rename or os.Link) to give it path's name. The temporary file is gone when it returns, and on an
// interruption at any moment.
func writeTemp(path string, data []byte, perm, dirPerm fs.FileMode, place func(tmp, path string) error) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	// Registered before the file exists, and the file made under the undo's lock, so that an interruption
	// at any moment removes it.
	var undoMu sync.Mutex
	tmp := ""
	defer interrupt.Undo(func() {
		undoMu.Lock()
		defer undoMu.Unlock()
		if tmp != "" {
			_ = os.Remove(tmp)
		}
	})()
	undoMu.Lock()
	f, err := os.CreateTemp(dir, tempPattern(path))
	if err == nil {
		tmp = f.Name()
	}
	undoMu.Unlock()
	if err != nil {
		return err
	}
	// After a rename tmp names nothing, after a link the same file as path: either way it goes.
	defer os.Remove(tmp)
	// Chmod before writing so that key material is never readable by others, not even briefly.
	if err = f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err = f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync: %w", err)
	}
	if err = f.Close(); err != nil {
		return err
	}
	return place(tmp, path)
}

// Backup keeps data, the content of path before konnect replaces it, as NAME.konnect-backup-TIMESTAMP
// (numbered if that exists) with mode perm, in dir, or when dir is empty beside path's target (a symlink is
// followed as WriteFile follows it) with a leading dot: so that kubelet never runs a backup in its
// static-pod directory as a second pod, and kubectl apply -k never sees one. It returns the backup's path.
func Backup(path, dir string, data []byte, perm fs.FileMode, now time.Time) (string, error) {
	target, err := safepath.Resolve(path)
	if err != nil {
		return "", fmt.Errorf("backup of %s: %w", path, err)
	}
	name := filepath.Base(target) + ".konnect-backup-" + now.UTC().Format("20060102T150405Z")
	if dir == "" {
		dir, name = filepath.Dir(target), "."+name
	}
	for i := 0; i < 100; i++ {
		backup := filepath.Join(dir, name)
		if i > 0 {
			backup += "-" + strconv.Itoa(i)
		}
		// Never where another user could redirect it, as WriteFile; the link below never follows a symlink.
		if _, err := safepath.Resolve(backup); err != nil {
			return "", fmt.Errorf("backup of %s: refusing to write %s: %w", path, backup, err)
		}
		err := createFile(backup, data, perm, DirMode)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("backup of %s: %w", path, err)
		}
		return backup, nil
	}
	return "", fmt.Errorf("backup of %s: too many backups named %s in %s", path, name, dir)
}

// checkTrusted refuses dir, and those of files that exist, when another user could change them
// (safepath.CheckDir and CheckFile): konnect keeps CA keys in dir and trusts the certificates it reads back.
// There is no flag to accept it: whoever can change a CA certificate there is trusted by kube-apiserver, or
// can read its key. The error lists every problem.
func checkTrusted(dir string, files ...string) error {
	var errs []error
	if err := safepath.CheckDir(dir); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", dir, err))
	}
	for _, f := range files {
		if err := safepath.CheckFile(f); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w (konnect writes and trusts keys and certificates only where no user but root and the one running it can change them: chown and chmod go-w what is named)", errors.Join(errs...))
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
