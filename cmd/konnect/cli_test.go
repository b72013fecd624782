package main

import (
	"bytes"
	"strings"
	"testing"
)

// konnect runs the whole command tree with args and returns stdout, stderr and the error.
func konnect(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root, err := newRootCommand()
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err = root.Execute()
	return out.String(), errOut.String(), err
}

func TestVersionFlag(t *testing.T) {
	out, _, err := konnect(t, "--version")
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := konnect(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	if out != want || !strings.HasPrefix(out, "konnect ") {
		t.Errorf("konnect --version printed %q, konnect version %q", out, want)
	}
}
