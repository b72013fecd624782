package smallfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readPromptly runs Read in a goroutine, so that a read that blocks (a FIFO's open) fails the test instead of
// hanging it.
func readPromptly(t *testing.T, path string) ([]byte, error) {
	t.Helper()
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		data, err := Read(path)
		done <- result{data, err}
	}()
	select {
	case r := <-done:
		return r.data, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("Read(%s) still blocks after 5s", path)
		return nil, nil
	}
}

func TestReadRefusesFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := readPromptly(t, path)
	if !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Read of a FIFO: %v, want %v", err, ErrNotRegular)
	}
	if want := path + ": not a regular file (a fifo)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if err := Check(path); !errors.Is(err, ErrNotRegular) {
		t.Errorf("Check of a FIFO: %v, want %v", err, ErrNotRegular)
	}
}

// A device is refused by its type, before any read: Check, which only stats, so that this test cannot fill
// memory from /dev/zero when the type check is missing.
func TestCheckRefusesDevice(t *testing.T) {
	if fi, err := os.Stat("/dev/zero"); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		t.Skip("no /dev/zero")
	}
	err := Check("/dev/zero")
	if want := "/dev/zero: not a regular file (a character device)"; err == nil || err.Error() != want {
		t.Fatalf("Check(/dev/zero): %v, want %q", err, want)
	}
}

func TestReadNullDevice(t *testing.T) {
	if fi, err := os.Stat(os.DevNull); err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		t.Skip("no /dev/null")
	}
	if data, err := readPromptly(t, os.DevNull); err != nil || len(data) != 0 {
		t.Fatalf("Read(/dev/null) = %q, %v; want it empty", data, err)
	}
}

func TestReadRefusesDirectory(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "(a directory)") {
		t.Fatalf("Read of a directory: %v", err)
	}
}

func TestReadBound(t *testing.T) {
	dir := t.TempDir()
	// Sparse: no disk space for the 4 MiB.
	atBound, over := filepath.Join(dir, "at"), filepath.Join(dir, "over")
	for path, size := range map[string]int64{atBound: MaxSize, over: MaxSize + 1} {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
	}
	if data, err := readPromptly(t, atBound); err != nil || len(data) != MaxSize {
		t.Errorf("Read of a file of MaxSize: %d bytes, %v", len(data), err)
	}
	_, err := readPromptly(t, over)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Read of a file of MaxSize+1: %v, want %v", err, ErrTooLarge)
	}
	if want := over + ": larger than 4 MiB"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if err := Check(over); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Check of a file of MaxSize+1: %v, want %v", err, ErrTooLarge)
	}
}

// TestReadUpTo: a larger bound takes a file past MaxSize, and still refuses one past itself.
func TestReadUpTo(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, MaxSize+1); err != nil { // sparse
		t.Fatal(err)
	}
	if data, err := ReadUpTo(path, 8<<20); err != nil || len(data) != MaxSize+1 {
		t.Errorf("ReadUpTo 8 MiB of a file of MaxSize+1: %d bytes, %v", len(data), err)
	}
	_, err := ReadUpTo(path, 1<<20)
	if want := path + ": larger than 1 MiB"; !errors.Is(err, ErrTooLarge) || err == nil || err.Error() != want {
		t.Errorf("ReadUpTo 1 MiB of a file of MaxSize+1: %v, want %q", err, want)
	}
}

func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	file, link, empty := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "link.crt"), filepath.Join(dir, "empty")
	want := []byte("-----BEGIN CERTIFICATE-----\n")
	if err := os.WriteFile(file, want, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{file, link} {
		got, fi, err := ReadInfo(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("ReadInfo(%s) = %q, %v; want %q", p, got, err, want)
		} else if fi.Mode().Perm() != 0o644 || !fi.Mode().IsRegular() {
			t.Errorf("ReadInfo(%s): FileInfo of mode %v, want the file's", p, fi.Mode())
		}
		if err := Check(p); err != nil {
			t.Errorf("Check(%s): %v", p, err)
		}
	}
	if got, err := Read(empty); err != nil || len(got) != 0 {
		t.Errorf("Read of an empty file = %q, %v", got, err)
	}
	if _, err := Read(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("Read of a missing file: %v, want one os.IsNotExist tells", err)
	}
}
