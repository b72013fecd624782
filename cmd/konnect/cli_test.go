package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki"
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

// A mistyped subcommand of any command group gets the nearest names, as one of the root does.
func TestMistypedSubcommandIsSuggested(t *testing.T) {
	for _, tc := range []struct{ args, want []string }{
		{[]string{"certs", "renw"}, []string{"renew"}},
		{[]string{"certs", "rotateca"}, []string{"rotate-ca"}},
		{[]string{"doctor", "stauts"}, []string{"status"}},
		{[]string{"init", "phse"}, []string{"phase"}},
		{[]string{"init", "phase", "cert"}, []string{"certs"}},
		{[]string{"kubeconfig", "set-prxy"}, []string{"set-proxy"}},
		{[]string{"sever"}, []string{"server"}},
	} {
		_, _, err := konnect(t, tc.args...)
		if err == nil {
			t.Errorf("konnect %s: no error", strings.Join(tc.args, " "))
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "unknown command") || !strings.Contains(msg, "Did you mean this?") {
			t.Errorf("konnect %s: %q, want an unknown command with suggestions", strings.Join(tc.args, " "), msg)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, "\t"+w) {
				t.Errorf("konnect %s: %q does not suggest %s", strings.Join(tc.args, " "), msg, w)
			}
		}
	}
	// Commands without subcommands keep their own argument checks.
	if _, _, err := konnect(t, "version", "extra"); err == nil || strings.Contains(err.Error(), "Did you mean") {
		t.Errorf("konnect version extra: %v", err)
	}
}

func TestRenewWithoutNameListsTheNames(t *testing.T) {
	_, _, err := konnect(t, "certs", "renew", "--dir", t.TempDir())
	if err == nil {
		t.Fatal("certs renew with no name: no error")
	}
	names := []string{pki.All}
	for _, s := range pki.Specs() {
		names = append(names, s.Name)
	}
	for _, s := range pki.ServingSpecs("NAME", "NS", pki.ServingFromNext) {
		names = append(names, s.Name)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), "  "+n+" ") {
			t.Errorf("certs renew with no name does not list %s:\n%s", n, err)
		}
	}
}
