//go:build integration

package sshdial

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// userCertificate signs key's public half with the CA for the running user, into out.
func userCertificate(t *testing.T, ca, key, out string) {
	t.Helper()
	if b, err := exec.Command("ssh-keygen", "-q", "-s", ca, "-I", "test-user", "-n", localUser(), "-V", "-5m:+1h", key+".pub").CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -s: %v: %s", err, b)
	}
	if out != key+"-cert.pub" {
		if err := os.Rename(key+"-cert.pub", out); err != nil {
			t.Fatal(err)
		}
	}
}

// User certificates: against an sshd that trusts only a user CA (TrustedUserCAKeys, AuthorizedKeysFile
// none), an identity file logs in with the certificate beside it (FILE-cert.pub) or named by ssh_config's
// CertificateFile, as with OpenSSH; the key alone is refused.
func TestUserCertificates(t *testing.T) {
	dir := t.TempDir()
	setHome(t, dir)
	t.Setenv("SSH_AUTH_SOCK", "")
	f := newFixture(t)
	ca, caPub := harness.SSHKeyPair(t, dir, "user_ca", "")
	caFile := filepath.Join(dir, "user_ca.pub")
	conf := filepath.Join(f.sshd.Dir, "sshd_config")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	// sshd takes the first value of a keyword: the fixture's AuthorizedKeysFile is replaced, not followed.
	old := "AuthorizedKeysFile " + filepath.Join(f.sshd.Dir, "authorized_keys")
	if !strings.Contains(string(b), old) {
		t.Fatalf("sshd_config has no %q", old)
	}
	b = []byte(strings.Replace(string(b), old, "AuthorizedKeysFile none\nTrustedUserCAKeys "+caFile, 1))
	os.WriteFile(conf, b, 0o600)
	os.WriteFile(caFile, []byte(caPub+"\n"), 0o644)
	f.sshd.Restart()
	be := backend(t)

	t.Run("FILE-cert.pub beside the identity file", func(t *testing.T) {
		key, _ := harness.SSHKeyPair(t, t.TempDir(), "ucl", "")
		userCertificate(t, ca, key, key+"-cert.pub")
		if ok, out := opensshLogsIn(t, f.sshd, key, f.knownHosts, 0); !ok {
			t.Fatalf("OpenSSH refused: %s", out)
		}
		cfg := f.config()
		cfg.IdentityFiles = []string{key}
		d, done := start(t, cfg)
		waitReady(t, d, done)
		get(t, d, be, "/")
	})

	t.Run("ssh_config CertificateFile", func(t *testing.T) {
		key, _ := harness.SSHKeyPair(t, t.TempDir(), "ucl", "")
		cert := filepath.Join(t.TempDir(), "ucl.crt")
		userCertificate(t, ca, key, cert)
		sc := filepath.Join(t.TempDir(), "ssh_config")
		os.WriteFile(sc, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  IdentityFile %s\n  CertificateFile %s\n  IdentitiesOnly yes\n  IdentityAgent none\n  UserKnownHostsFile %s\n  GlobalKnownHostsFile none\n",
			f.sshd.Port, localUser(), key, cert, f.knownHosts)), 0o600)
		bothConnect(t, sc, Config{Destination: "target", ConfigFile: sc, ConnectTimeout: 5 * time.Second}, be)
	})

	t.Run("the key without its certificate is refused", func(t *testing.T) {
		key, _ := harness.SSHKeyPair(t, t.TempDir(), "ucl", "")
		if ok, out := opensshLogsIn(t, f.sshd, key, f.knownHosts, 0); ok {
			t.Fatalf("OpenSSH logged in: %s", out)
		}
		cfg := f.config()
		cfg.IdentityFiles = []string{key}
		_, done := start(t, cfg)
		var ae *AuthError
		if err := waitErr(t, done); !errors.As(err, &ae) {
			t.Fatalf("err = %v, want AuthError", err)
		}
	})
	if !strings.Contains(f.sshd.Log(), "ED25519-CERT") {
		t.Errorf("sshd logged no certificate login:\n%s", f.sshd.Log())
	}
}
