package pki

import (
	"os"
	"strings"
	"testing"
)

// TestCheckExpirationListsAroundUnreadable: one corrupt certificate (or kubeconfig) hides none of the
// others. Every readable certificate is listed with its expiry, each unreadable one is a row with its error
// and no expiry, and the error returned names every unreadable file, so that the command still fails.
func TestCheckExpirationListsAroundUnreadable(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	if _, err := EnsureKubeconfig(cfg, "https://198.18.0.1:6443"); err != nil {
		t.Fatal(err)
	}
	dir := cfg.PKIDir()
	corrupt := map[string]string{
		KonnectivityServer: specByName(t, KonnectivityServer).CertFile(dir),
		KubeconfigFile:     cfg.KubeconfigPath(),
	}
	for _, file := range corrupt {
		if err := os.WriteFile(file, []byte("junk"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	exp, err := CheckExpiration(cfg)
	if err == nil {
		t.Fatal("no error for the corrupt files")
	}
	for _, file := range corrupt {
		if !strings.Contains(err.Error(), file) {
			t.Errorf("the error does not name %s: %v", file, err)
		}
	}
	want := map[string]bool{KubeconfigFile: true}
	for _, s := range Specs() {
		if exists(s.CertFile(dir)) {
			want[s.Name] = true
		}
	}
	if len(exp) != len(want) {
		t.Fatalf("%d rows, want %d (%v): %+v", len(exp), len(want), want, exp)
	}
	for _, e := range exp {
		if !want[e.Name] {
			t.Errorf("unexpected row %+v", e)
		}
		if file, bad := corrupt[e.Name]; bad {
			if e.File != file || !strings.Contains(e.Error, file) || !e.NotAfter.IsZero() || e.Residual != "" {
				t.Errorf("unreadable %s: %+v", e.Name, e)
			}
			continue
		}
		if e.Error != "" || e.NotAfter.IsZero() || e.ResidualSeconds <= 0 || e.Issuer == "" {
			t.Errorf("readable %s: %+v", e.Name, e)
		}
	}
}
