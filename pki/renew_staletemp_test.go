package pki

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRenewRemovesStaleTemps: a renewal killed between a write's temporary file and its rename leaves the
// temporary file, which may hold a key. The next renewal removes those of every file of the directory, also
// of files it does not write itself (a CA key, the kubeconfig with its client key, a backup), and a dry run
// removes nothing.
func TestRenewRemovesStaleTemps(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	if _, err := EnsureKubeconfig(cfg, "https://198.18.0.1:6443"); err != nil {
		t.Fatal(err)
	}
	dir := cfg.PKIDir()
	caKey := specByName(t, CA).KeyFile(dir)
	leaf := specByName(t, FrontProxyClient).CertFile(dir)
	serverKey := specByName(t, KonnectivityServer).KeyFile(dir)
	stale := []string{
		leaveTemp(t, caKey, tempPattern(caKey)),
		leaveTemp(t, leaf, tempPattern(leaf)),
		leaveTemp(t, cfg.KubeconfigPath(), tempPattern(cfg.KubeconfigPath())),
		// What Backup beside the file leaves: the temporary file of .NAME.konnect-backup-STAMP.
		leaveTemp(t, serverKey, tempPattern("."+filepath.Base(serverKey)+".konnect-backup-20261128T120000Z-1")),
	}

	dry := cfg
	dry.DryRun = true
	if _, err := Renew(dry, FrontProxyClient); err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("dry run: %v", err)
		}
	}

	if _, err := Renew(cfg, FrontProxyClient); err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left by a killed run is still there: %v", p, err)
		}
	}
}
