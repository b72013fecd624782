package reload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func parseText(data [][]byte) (string, error) {
	s := strings.TrimSpace(string(data[0]))
	if s == "" || strings.HasPrefix(s, "bad") {
		return "", errors.New("not usable")
	}
	return s, nil
}

func TestFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if _, err := New("thing", parseText, path); err == nil || !strings.Contains(err.Error(), "thing") {
		t.Fatalf("missing file: err %v, want one naming what", err)
	}
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("bad")
	if _, err := New("thing", parseText, path); err == nil {
		t.Fatal("unparsable file accepted")
	}
	write("one")
	f, err := New("thing", parseText, path)
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * CheckInterval)
		for f.Get() != want {
			if time.Now().After(deadline) {
				t.Fatalf("Get() = %q, want %q", f.Get(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	write("two, longer")
	waitFor("two, longer")
	write("bad, keeps the last good value")
	time.Sleep(2 * CheckInterval)
	if got := f.Get(); got != "two, longer" {
		t.Fatalf("after a broken change: %q", got)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * CheckInterval)
	if got := f.Get(); got != "two, longer" {
		t.Fatalf("after removal: %q", got)
	}
	write("three")
	waitFor("three")
}

// LoadError reads as the errors it replaced: "what: cause", and "what ([paths]): cause" for a parse.
func TestLoadErrorText(t *testing.T) {
	cause := errors.New("no PEM data")
	if got, want := (&LoadError{What: "CA bundle /ca.crt", Err: cause}).Error(), fmt.Errorf("%s: %w", "CA bundle /ca.crt", cause).Error(); got != want {
		t.Errorf("unread: %q, want %q", got, want)
	}
	paths := []string{"/a.crt", "/a.key"}
	if got, want := (&LoadError{What: "pair", Paths: paths, Err: cause}).Error(), fmt.Errorf("%s (%v): %w", "pair", paths, cause).Error(); got != want {
		t.Errorf("unparsed: %q, want %q", got, want)
	}
	if !errors.Is(&LoadError{Err: cause}, cause) {
		t.Error("LoadError does not unwrap to its cause")
	}
}

// State tells a monitor what Get hides: the files on disk are not the version in use, from a changed file
// that does not load or a file that is gone until a good version loads.
func TestStatePending(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("one")
	f, err := New("thing", parseText, path)
	if err != nil {
		t.Fatal(err)
	}
	// state waits out the check interval, so that each call checks the disk.
	state := func() (string, error) {
		time.Sleep(CheckInterval + 10*time.Millisecond)
		return f.State()
	}
	if v, err := state(); v != "one" || err != nil {
		t.Fatalf("unchanged: %q, %v; want one, nil", v, err)
	}
	write("bad, a renewal that does not parse")
	var le *LoadError
	for i := 0; i < 2; i++ { // and again at the next check: it stays pending until the file is fixed
		if v, err := state(); v != "one" || !errors.As(err, &le) || le.What != "thing" || le.Paths == nil {
			t.Fatalf("broken change, check %d: %q, %v; want one and a LoadError naming thing and its files", i, v, err)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if v, err := state(); v != "one" || !errors.As(err, &le) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file removed: %q, %v; want one and not-exist", v, err)
	}
	write("two")
	if v, err := state(); v != "two" || err != nil {
		t.Fatalf("good renewal: %q, %v; want two, nil", v, err)
	}
	if v, err := state(); v != "two" || err != nil {
		t.Fatalf("unchanged after the renewal: %q, %v; want two, nil", v, err)
	}
}
