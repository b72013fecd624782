package pki

import (
	"strings"
	"testing"
	"time"
)

// TestRenewRefusesCANotAllowedToSign: renew signs only with a CA that init accepts. A certificate in a CA's
// place that may not sign others (a leaf copied over it, or an openssl-made CA whose key usage leaves out
// certSign) would make certificates that do not verify, so renew refuses it as init does, naming the CA
// file, and writes nothing: not the leaves, not the kubeconfig.
func TestRenewRefusesCANotAllowedToSign(t *testing.T) {
	for _, tc := range []struct {
		name    string
		openssl bool
		prep    func(t *testing.T, bin, dir string)
	}{
		{"leaf copied over the CA", false, func(t *testing.T, _, dir string) {
			leaf, ca := specByName(t, FrontProxyClient), specByName(t, CA)
			copyFile(t, leaf.CertFile(dir), ca.CertFile(dir))
			copyFile(t, leaf.KeyFile(dir), ca.KeyFile(dir))
		}},
		{"openssl CA whose key usage leaves out certSign", true, func(t *testing.T, bin, dir string) {
			// The CA's own key, so that only the certificate's extensions are wrong.
			openssl(t, bin, dir, "req", "-x509", "-key", "ca.key", "-out", "ca.crt", "-subj", "/CN=kubernetes", "-days", "3650",
				"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,digitalSignature,keyEncipherment")
		}},
		{"openssl CA without key usage", true, func(t *testing.T, bin, dir string) {
			openssl(t, bin, dir, "req", "-x509", "-config", "/dev/null", "-key", "ca.key", "-out", "ca.crt", "-subj", "/CN=kubernetes",
				"-days", "3650", "-addext", "basicConstraints=critical,CA:TRUE")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bin string
			if tc.openssl {
				bin = opensslOrSkip(t)
			}
			cfg := testConfig(t)
			mustEnsure(t, cfg)
			if _, err := EnsureKubeconfig(cfg, "https://198.18.0.1:6443"); err != nil {
				t.Fatal(err)
			}
			dir := cfg.PKIDir()
			tc.prep(t, bin, dir)
			want := specByName(t, CA).CertFile(dir) + " is not a CA certificate"
			if _, err := Ensure(cfg); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("init: %v, want %q", err, want)
			}
			// Later, so that a renewal that went ahead would change every certificate it touched.
			cfg.Now = func() time.Time { return time.Now().Add(24 * time.Hour) }
			for _, names := range [][]string{{All}, {KonnectivityServer}, {KonnectivityServerClient}, {CA}} {
				before := snapshot(t, cfg.Dir)
				if res, err := Renew(cfg, names...); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Renew(%v) = %+v, %v; want %q", names, res, err, want)
				}
				if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
					t.Errorf("Renew(%v) changed %v", names, changed)
				}
			}
			// The renewals that do not involve the cluster CA still go ahead.
			if _, err := Renew(cfg, FrontProxyClient); err != nil {
				t.Errorf("Renew(%s), signed by another CA: %v", FrontProxyClient, err)
			}
		})
	}
}
