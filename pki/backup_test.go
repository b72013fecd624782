package pki

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestBackupNeverReplacesABackup: runs that back up the same file in the same second, at the same moment,
// each get a backup of their own. A check for the name followed by a write would let two of them take the
// same name, and the second would replace the first's backup.
func TestBackupNeverReplacesABackup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kube-apiserver.yaml")
	if err := os.WriteFile(path, []byte("current"), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	const runs = 16
	got := make([]string, runs)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			b, err := Backup(path, "", []byte(fmt.Sprint("run ", i)), 0o600, now)
			if err != nil {
				t.Error(err)
			}
			got[i] = b
		}()
	}
	close(start)
	wg.Wait()
	seen := map[string]bool{}
	for i, b := range got {
		if seen[b] {
			t.Fatalf("two runs were given the backup %s", b)
		}
		seen[b] = true
		data, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprint("run ", i); string(data) != want {
			t.Errorf("%s holds %q, want %q: another run replaced it", b, data, want)
		}
		if st, err := os.Stat(b); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", b, st.Mode().Perm(), err)
		}
	}
	if stale, _ := filepath.Glob(filepath.Join(dir, "*.tmp-*")); len(stale) > 0 {
		t.Errorf("temporary files left behind: %v", stale)
	}
}
