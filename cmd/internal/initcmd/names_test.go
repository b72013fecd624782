package initcmd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/field"
)

// TestFieldFlags: every Config field that the libraries behind init and certs name has a flag.
func TestFieldFlags(t *testing.T) {
	for _, tc := range []struct {
		err  *field.Error
		want string
	}{
		{field.Errorf("{Mode} x"), "--mode x"},
		{field.Errorf("{Transport} x"), "--transport x"},
		{field.Errorf("run with {Force}"), "run with --force"},
		{field.Errorf("give {Dir} x"), "give --dir x"},
		{field.Errorf("a run without {DryRun} finishes it"), "a run without --dry-run finishes it"},
		{field.Errorf("{Service} x"), "--service x"},
		{field.Errorf("{Namespace} x"), "--namespace x"},
		{field.Errorf("{Group} x"), "--group x"},
		{field.Errorf("{Versions} x"), "--version x"},
		{field.Errorf("{ServiceAccount} x"), "--service-account x"},
	} {
		if got := fieldFlags.Error(tc.err).Error(); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.err.Fields(), got, tc.want)
		}
	}
}

// The advice of pki's refusals names init's and certs' flags, as the commands print it.
func TestRefusalsNameFlags(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, initArgs(dir)...)

	// A kubeconfig that points elsewhere is kept unless --force says otherwise; --force says so in the output.
	other := initArgs(dir)
	for i, a := range other {
		if a == "https://198.18.0.1:6443" {
			other[i] = "https://198.18.0.9:6443"
		}
	}
	kubeconfig := filepath.Join(dir, pki.KubeconfigFile)
	if _, err := run(t, other...); err == nil || !strings.Contains(err.Error(), kubeconfig+` points at server "https://198.18.0.1:6443", not "https://198.18.0.9:6443" (run with --force to rewrite it)`) {
		t.Errorf("init with another --apiserver-url: %v", err)
	}
	if out := mustRun(t, append(other, "--force")...); !strings.Contains(out, "rewritten with --force") {
		t.Errorf("init --force with another --apiserver-url does not say why it rewrote the kubeconfig:\n%s", out)
	}

	// A leaf that fails its checks is renewed only with --force.
	if _, err := run(t, append(other, "--control-plane-address", "198.18.0.2")...); err == nil ||
		!strings.Contains(err.Error(), "pki: nothing written: ") || !strings.Contains(err.Error(), "(run with --force to renew it)") {
		t.Errorf("init with a new address: %v", err)
	}

	// A serving certificate's name with a control plane's directory.
	if _, err := run(t, "certs", "renew", pki.APIServiceServing, "--dir", dir); err == nil || !strings.Contains(err.Error(), "give --dir the directory konnect certs apiservice") {
		t.Errorf("certs renew %s --dir CONTROL-PLANE-DIR: %v", pki.APIServiceServing, err)
	}
}

// certs apiservice names its flags in manifests.APIService's refusals. (It checks --service and --namespace
// itself before, so the library's refusals of those two are named in TestFieldFlags only.)
func TestAPIServiceRefusalsNameFlags(t *testing.T) {
	base := map[string]string{"--service": "api", "--namespace": "pizza", "--group": "restaurant.example.com", "--version": "v1alpha1"}
	for _, tc := range []struct {
		flag, value, want string
	}{
		{"--group", "Bad_Group", `--group "Bad_Group": `},
		{"--version", "1.0", `--version "1.0": `},
		{"--version", "v1,v1", `--version "v1": given twice`},
		{"--service-account", "Bad_SA", `--service-account "Bad_SA": `},
	} {
		args := []string{"certs", "apiservice", "--out", filepath.Join(t.TempDir(), "x")}
		for f, v := range base {
			if f != tc.flag {
				args = append(args, f, v)
			}
		}
		args = append(args, tc.flag, tc.value)
		if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: %v, want %q", tc.flag, tc.value, err, tc.want)
		}
	}
}
