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

	"golang.org/x/crypto/ssh/knownhosts"
)

// HostKeyAlias MyAlias is looked up and recorded as "myalias", as OpenSSH does (ssh -G prints it in lower
// case), and known_hosts names match whatever their case, as OpenSSH's match_hostname matches them: konnect
// trusts each known_hosts file exactly when the real ssh does, and ssh trusts what konnect records, hashed
// or not.
func TestHostKeyAliasCaseAsOpenSSH(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	entry := fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  HostKeyAlias MyAlias\n  IdentityFile %s\n  IdentitiesOnly yes\n", f.sshd.Port, f.key)
	sshConfig := filepath.Join(f.dir, "config")
	hashedConfig := filepath.Join(f.dir, "config-hashed")
	os.WriteFile(sshConfig, []byte(entry), 0o600)
	os.WriteFile(hashedConfig, []byte(entry+"  HashKnownHosts yes\n"), 0o600)
	if got := opensshResolves(t, sshConfig, "target")["hostkeyalias"]; len(got) != 1 || got[0] != "myalias" {
		t.Fatalf("ssh -G says hostkeyalias %q, want myalias", got)
	}
	key := f.sshd.HostKeyLine
	cfg := Config{Destination: "target", ConfigFile: sshConfig, AgentSocket: "none", ConnectTimeout: 5 * time.Second}

	for _, c := range []struct {
		name, line string
		trusted    bool
	}{
		{"as written", "MyAlias " + key, true},
		{"in lower case", "myalias " + key, true},
		{"in upper case", "MYALIAS " + key, true},
		{"in a list with a wildcard", "other,MY*S " + key, true},
		{"hashed in lower case", knownhosts.HashHostname("myalias") + " " + key, true},
		{"hashed as written", knownhosts.HashHostname("MyAlias") + " " + key, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := cfg
			cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
			os.WriteFile(cfg.KnownHostsFile, []byte(c.line+"\n"), 0o600)
			if ok, out := opensshAccepts(t, sshConfig, cfg.KnownHostsFile, "target"); ok != c.trusted {
				t.Fatalf("OpenSSH trusted=%v, want %v: %s", ok, c.trusted, out)
			}
			d, done := start(t, cfg)
			if !c.trusted {
				var hk *HostKeyError
				if err := waitErr(t, done); !errors.As(err, &hk) || hk.Host != "myalias" {
					t.Fatalf("err = %v, want an unknown-host error for myalias", err)
				}
				return
			}
			waitReady(t, d, done)
			get(t, d, be, "/")
		})
	}

	for _, c := range []struct {
		name, config string
		hashed       bool
	}{{"recorded", sshConfig, false}, {"recorded hashed", hashedConfig, true}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := cfg
			cfg.ConfigFile, cfg.AcceptNew = c.config, true
			cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
			d, done := start(t, cfg)
			waitReady(t, d, done)
			b, _ := os.ReadFile(cfg.KnownHostsFile)
			if name, _, _ := strings.Cut(string(b), " "); strings.HasPrefix(name, "|1|") != c.hashed || !c.hashed && name != "myalias" {
				t.Fatalf("known_hosts = %q, want a line for myalias (hashed: %v)", b, c.hashed)
			}
			if ok, out := opensshAccepts(t, sshConfig, cfg.KnownHostsFile, "target"); !ok {
				t.Errorf("OpenSSH refuses the line konnect recorded, %q: %s", b, out)
			}
		})
	}
}
