package initcmd

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// keyCounter notes, for each line written, how many key files existed in its directory at that moment.
type keyCounter struct {
	dir   string
	buf   bytes.Buffer
	lines []string
	keys  []int
}

func (w *keyCounter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	keys, _ := filepath.Glob(filepath.Join(w.dir, "*.key"))
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			break
		}
		w.lines = append(w.lines, strings.TrimSuffix(line, "\n"))
		w.keys = append(w.keys, len(keys))
	}
	return len(p), nil
}

// init reports each certificate as it writes it, not all of them at the end: with RSA-4096 keys a run takes
// seconds, and should not be silent until it is over.
func TestInitReportsAsItGoes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "D")
	w := &keyCounter{dir: filepath.Join(dir, "pki")}
	root := &cobra.Command{Use: "konnect", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(NewInitCommand())
	root.SetOut(w)
	root.SetErr(w)
	root.SetArgs(initArgs(dir, "--key-algorithm", "ecdsa-p256"))
	if err := root.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(w.lines, "\n"))
	}
	keys, _ := filepath.Glob(filepath.Join(dir, "pki", "*.key"))
	if len(keys) < 5 {
		t.Fatalf("init wrote %d keys", len(keys))
	}
	for i, line := range w.lines {
		if line == "[created] "+filepath.Join(dir, "pki", "ca.{crt,key}") {
			if w.keys[i] != 1 {
				t.Errorf("%q printed when %d of %d keys existed, want 1: the line comes once ca.key is written", line, w.keys[i], len(keys))
			}
			return
		}
	}
	t.Fatalf("no line for ca.{crt,key}:\n%s", strings.Join(w.lines, "\n"))
}
