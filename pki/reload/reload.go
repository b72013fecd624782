// Package reload keeps the parsed content of files that other programs renew in place (certificates, CA
// bundles, ServiceAccount tokens) and parses them again when they change on disk, so that a renewal needs no
// restart.
//
// It does not watch the files (no inotify): Get stats them at most once per CheckInterval, which bounds the
// cost of a handshake storm. It is not for configuration whose meaning changes while a daemon runs, and it
// never writes files (see pki.WriteFile for that).
package reload

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/pki/smallfile"
	"k8s.io/klog/v2"
)

// CheckInterval bounds how often the files are stat'ed. A renewed file is in use within it.
const CheckInterval = time.Second

// stamp identifies one version of a file on disk. Kubernetes projected volumes and cert-manager swap files
// through symlinks, and renewal tools rewrite in place or rename a new file over the old one: each changes
// at least one of these.
type stamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func (s stamp) equal(o stamp) bool { return s.mod.Equal(o.mod) && s.size == o.size && s.ino == o.ino }

func stampOf(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	return stamp{mod: fi.ModTime(), size: fi.Size(), ino: Inode(fi)}, nil
}

// Inode returns the inode number of fi, or 0 where the platform has none.
func Inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}

// Files holds the value parsed from a set of files. A change that does not parse (a certificate written
// before its key, a half-written bundle) keeps the last good value, is logged, and is retried at the next
// check, so that a rotation in progress never takes a daemon down.
type Files[T any] struct {
	what  string
	paths []string
	parse func(data [][]byte) (T, error)

	mu        sync.Mutex
	value     T
	stamps    []stamp
	lastCheck time.Time
	pending   error // why the files on disk are not the loaded version; nil when they are
}

// LoadError is files that could not be read (Paths nil) or parsed. Its text starts with What, the label the
// files were given; a caller whose label suits its logs can say otherwise at start-up from the other fields.
type LoadError struct {
	What  string
	Paths []string // the files that did not parse
	Err   error
}

func (e *LoadError) Error() string {
	if e.Paths != nil {
		return fmt.Sprintf("%s (%v): %v", e.What, e.Paths, e.Err)
	}
	return e.What + ": " + e.Err.Error()
}

func (e *LoadError) Unwrap() error { return e.Err }

// New reads and parses the files once; an error here (a missing or broken file) names what and is the
// caller's to report at start-up. parse gets the files' contents in the order of paths.
func New[T any](what string, parse func(data [][]byte) (T, error), paths ...string) (*Files[T], error) {
	f := &Files[T]{what: what, paths: paths, parse: parse}
	v, stamps, err := f.load()
	if err != nil {
		return nil, err
	}
	f.value, f.stamps, f.lastCheck = v, stamps, time.Now()
	return f, nil
}

// load stats the files before reading them, so that a change during the read shows at the next check.
func (f *Files[T]) load() (T, []stamp, error) {
	var zero T
	stamps := make([]stamp, len(f.paths))
	for i, p := range f.paths {
		s, err := stampOf(p)
		if err != nil {
			return zero, nil, &LoadError{What: f.what, Err: err}
		}
		stamps[i] = s
	}
	data := make([][]byte, len(f.paths))
	for i, p := range f.paths {
		b, err := smallfile.Read(p)
		if err != nil {
			return zero, nil, &LoadError{What: f.what, Err: err}
		}
		data[i] = b
	}
	v, err := f.parse(data)
	if err != nil {
		return zero, nil, &LoadError{What: f.what, Paths: f.paths, Err: err}
	}
	return v, stamps, nil
}

// Get returns the current value, parsed again first if a file changed since the last check.
func (f *Files[T]) Get() T {
	v, _ := f.State()
	return v
}

// State returns the value in use, after the check Get does, and why the files on disk are not that version:
// a *LoadError for a changed file that does not load or a file that cannot be stat'ed (the next restart
// would fail on it), nil once the files on disk are the version in use. Monitoring reads it, since nothing
// else fails while the last good version serves.
func (f *Files[T]) State() (T, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if now.Sub(f.lastCheck) < CheckInterval {
		return f.value, f.pending
	}
	f.lastCheck = now
	f.pending = f.check()
	return f.value, f.pending
}

// check loads the files again if one changed since they were loaded, and returns why the files on disk are
// not the loaded version.
func (f *Files[T]) check() error {
	changed, err := f.changed()
	if err != nil {
		klog.ErrorS(err, "Cannot check file for changes; keeping the loaded version", "what", f.what)
		return err
	}
	if !changed {
		return nil
	}
	v, stamps, err := f.load()
	if err != nil {
		klog.ErrorS(err, "Changed file is not usable yet; keeping the loaded version", "what", f.what)
		return err
	}
	f.value, f.stamps = v, stamps
	klog.InfoS("Reloaded from disk", "what", f.what, "files", f.paths)
	return nil
}

// changed reports whether a file no longer has its loaded stamp. A file that cannot be stat'ed is an error:
// the loaded version stays in use.
func (f *Files[T]) changed() (bool, error) {
	for i, p := range f.paths {
		s, err := stampOf(p)
		if err != nil {
			return false, &LoadError{What: f.what, Err: err}
		}
		if !s.equal(f.stamps[i]) {
			return true, nil
		}
	}
	return false, nil
}
