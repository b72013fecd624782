//go:build integration

package sshdial

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/crypto/ssh"
)

// IdentitiesOnly and IdentityAgent from ssh_config, against an agent holding more unrelated keys than sshd's
// MaxAuthTries (6) allows: as with OpenSSH, IdentitiesOnly keeps them out and the login works; without it
// sshd hangs up after six ("Too many authentication failures"), which is a refused login that ends the
// command naming the keys offered, not a failure to retry.
func TestIdentitiesOnlyAndIdentityAgent(t *testing.T) {
	dir := t.TempDir()
	setHome(t, dir) // no default identity files
	t.Setenv("SSH_AUTH_SOCK", "")
	f := newFixture(t)
	var unrelated []string
	for i := range 6 {
		k, _ := harness.SSHKeyPair(t, dir, fmt.Sprintf("unrelated%d", i), "")
		unrelated = append(unrelated, k)
	}
	full := harness.SSHAgent(t, unrelated...)
	own := harness.SSHAgent(t, f.key)
	be := backend(t)
	config := func(t *testing.T, lines ...string) string {
		c := filepath.Join(t.TempDir(), "ssh_config")
		os.WriteFile(c, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  UserKnownHostsFile %s\n  GlobalKnownHostsFile none\n  %s\n",
			f.sshd.Port, localUser(), f.knownHosts, strings.Join(lines, "\n  "))), 0o600)
		return c
	}
	cfg := func(sshConfig string) Config {
		return Config{Destination: "target", ConfigFile: sshConfig, ConnectTimeout: 5 * time.Second}
	}
	logsIn := func(t *testing.T, sshConfig string) {
		t.Helper()
		bothConnect(t, sshConfig, cfg(sshConfig), be)
	}

	t.Run("IdentitiesOnly offers only the agent keys of the identity files", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", full)
		logsIn(t, config(t, "IdentityFile "+f.key, "IdentitiesOnly yes"))
	})

	t.Run("too many authentication failures is a refused login", func(t *testing.T) {
		sc := config(t, "IdentityFile "+f.key, "IdentityAgent "+full)
		if ok, out := opensshConnects(t, sc, "yes"); ok || !strings.Contains(out, "Too many authentication failures") {
			t.Fatalf("OpenSSH logged in: %v, want too many authentication failures: %s", ok, out)
		}
		_, done := start(t, cfg(sc))
		err := waitErr(t, done)
		var ae *AuthError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), "Too many authentication failures") {
			t.Fatalf("err = %v, want an AuthError for too many authentication failures", err)
		}
		if fp := ssh.FingerprintSHA256(publicKeyOf(t, unrelated[0])); !strings.Contains(err.Error(), "agent key ED25519 "+fp) {
			t.Errorf("error does not name the agent key %s: %v", fp, err)
		}
	})

	t.Run("IdentityAgent none leaves $SSH_AUTH_SOCK alone", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", full)
		logsIn(t, config(t, "IdentityFile "+f.key, "IdentityAgent none"))
	})

	t.Run("IdentityAgent names the agent", func(t *testing.T) {
		logsIn(t, config(t, "IdentityAgent "+own))
	})

	t.Run("IdentityAgent SSH_AUTH_SOCK and $VAR name the variable", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", own)
		logsIn(t, config(t, "IdentityAgent SSH_AUTH_SOCK"))
		t.Setenv("SSH_AUTH_SOCK", full)
		t.Setenv("KONNECT_TEST_AGENT", own)
		logsIn(t, config(t, "IdentityAgent $KONNECT_TEST_AGENT"))
	})
}
