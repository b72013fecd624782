package pki

import (
	"os"
	"path/filepath"
	"testing"
)

// leaveTemp makes the temporary file that a write of path killed before its rename leaves: the name
// os.CreateTemp gives it with pattern, mode 0600, holding data.
func leaveTemp(t *testing.T, path, pattern string) string {
	t.Helper()
	f, err := os.CreateTemp(filepath.Dir(path), pattern)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("-----BEGIN PRIVATE KEY-----\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// TestRemoveStaleTempsTakesOnlyItsOwn: the temporary files of a write and of a backup beside the file are
// removed, and only regular files of ours whose names konnect's writes make: a symlink (and what it points to), a directory, another user's file and other names are kept.
func TestRemoveStaleTempsTakesOnlyItsOwn(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.key")
	if err := os.WriteFile(path, []byte("key"), KeyMode); err != nil {
		t.Fatal(err)
	}
	ours := []string{
		leaveTemp(t, path, tempPattern(path)),
		leaveTemp(t, path, tempPattern(".ca.key.konnect-backup-20261128T120000Z")),
	}
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	keep := []string{
		filepath.Join(dir, ".ca.key.tmp-111"), // a symlink
		filepath.Join(dir, ".ca.key.tmp-222"), // a directory
		filepath.Join(dir, ".ca.key.tmp-mine"),
		filepath.Join(dir, ".ca.key.tmp-"),
		filepath.Join(dir, "ca.key.tmp-333"),
		filepath.Join(dir, ".ca.key.tmp-444.bak"),
		filepath.Join(dir, "..ca.key.konnect-backup-yesterday.tmp-555"),
		outside,
	}
	if err := os.Symlink(outside, keep[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(keep[1], 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range keep[2:7] {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		theirs := filepath.Join(dir, ".ca.key.tmp-666")
		if err := os.WriteFile(theirs, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		keep = append(keep, theirs)
	}

	RemoveStaleTemps(path)
	for _, p := range ours {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left by a killed write is still there: %v", p, err)
		}
	}
	for _, p := range append(keep, path) {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("not konnect's temporary file, but removed: %v", err)
		}
	}
}
