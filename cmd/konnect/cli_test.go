package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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

// An unknown subcommand of a group is reported as such, with the group's subcommands, also when the flags of
// those follow it, which the group itself does not have: "unknown flag" would send the user after the flag.
func TestUnknownSubcommandBeforeItsFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"init", "phase", "bogus"}, []string{`unknown command "bogus" for "konnect init phase"`, "\n  certs ", "\n  kubeconfig ", "\n  egress ", "\n  kubeadm ", "\n  flags ", "\n  manifests "}},
		{[]string{"init", "phase", "bogus", "--dir", dir}, []string{`unknown command "bogus" for "konnect init phase"`, "\n  certs ", "\n  manifests "}},
		{[]string{"init", "phase", "bogus", "--dir", dir, "--control-plane-address", "198.18.0.1"}, []string{`unknown command "bogus" for "konnect init phase"`}},
		{[]string{"certs", "bogus", "--dir", dir}, []string{`unknown command "bogus" for "konnect certs"`, "\n  renew "}},
	} {
		_, _, err := konnect(t, tc.args...)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("konnect %s: %v, want %q in it", strings.Join(tc.args, " "), err, w)
			}
		}
	}
	// A flag of no subcommand is still the flag's error, and a subcommand's own flag errors are its own.
	for _, args := range [][]string{{"init", "phase", "--bogus"}, {"init", "phase", "egress", "--bogus"}, {"init", "phase", "certs", "ca", "--bogus"}} {
		if _, _, err := konnect(t, args...); err == nil || !strings.Contains(err.Error(), "unknown flag: --bogus") {
			t.Errorf("konnect %s: %v", strings.Join(args, " "), err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("wrote into %s: %v", dir, entries)
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

// complete asks cobra's completion command for the values of a flag and returns them without descriptions.
func complete(t *testing.T, args ...string) []string {
	t.Helper()
	out, _, err := konnect(t, append([]string{cobra.ShellCompRequestCmd}, args...)...)
	if err != nil {
		t.Fatalf("__complete %s: %v", strings.Join(args, " "), err)
	}
	var vals []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(line, ":") { // the directive
			continue
		}
		v, _, _ := strings.Cut(line, "\t")
		vals = append(vals, v)
	}
	return vals
}

func TestFlagCompletion(t *testing.T) {
	algs := []string{}
	for _, a := range pki.KeyAlgorithms() {
		algs = append(algs, string(a))
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"init", "--mode", ""}, []string{"grpc", "http-connect"}},
		{[]string{"server", "--mode", ""}, []string{"grpc", "http-connect"}},
		{[]string{"doctor", "dial", "--mode", ""}, []string{"grpc", "http-connect"}},
		{[]string{"init", "--transport", ""}, []string{"uds", "tcp"}},
		{[]string{"init", "--key-algorithm", ""}, algs},
		{[]string{"init", "phase", "certs", "--key-algorithm", ""}, algs},
		{[]string{"certs", "webhook", "--key-algorithm", ""}, algs},
		{[]string{"certs", "apiservice", "--key-algorithm", ""}, algs},
		{[]string{"init", "--agent-auth", ""}, []string{"token", "mtls"}},
		{[]string{"certs", "rotate-ca", "--step", ""}, []string{"1", "2", "3"}},
	} {
		if got := complete(t, tc.args...); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("konnect %s: completes %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}

	kc := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: prod
  context: {cluster: c, user: u}
- name: staging
  context: {cluster: c, user: u}
current-context: prod
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"kubeconfig", "set-proxy", "--kubeconfig", kc, "--context", ""},
		{"proxy", "--kubeconfig", kc, "--context", ""},
	} {
		if got := complete(t, args...); strings.Join(got, " ") != "prod staging" {
			t.Errorf("konnect %s: completes %q, want prod staging", strings.Join(args, " "), got)
		}
	}
	t.Setenv("KUBECONFIG", kc)
	if got := complete(t, "kubeconfig", "set-proxy", "--context", ""); strings.Join(got, " ") != "prod staging" {
		t.Errorf("--context with $KUBECONFIG: completes %q, want prod staging", got)
	}
}

// Completion goes by flag name, so every flag of that name anywhere must take those values: its help says so.
func TestCompletedFlagsTakeTheirValues(t *testing.T) {
	root, err := newRootCommand()
	if err != nil {
		t.Fatal(err)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			values, ok := flagValues[f.Name]
			if !ok {
				return
			}
			for _, v := range values {
				v, _, _ = strings.Cut(v, "\t")
				if !strings.Contains(f.Usage, v) {
					t.Errorf("%s --%s completes %q, which its help does not name: %q", c.CommandPath(), f.Name, v, f.Usage)
				}
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
