//go:build integration

package sshdial

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/crypto/ssh/knownhosts"
)

// knownHostsConfig writes an ssh_config that reaches the fixture's sshd as "target" and trusts host keys from
// the given UserKnownHostsFile and GlobalKnownHostsFile values, so that no test reads the machine's
// /etc/ssh.
func knownHostsConfig(t *testing.T, f *fixture, user, global string) string {
	t.Helper()
	c := filepath.Join(t.TempDir(), "ssh_config")
	os.WriteFile(c, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  IdentityFile %s\n  IdentitiesOnly yes\n  IdentityAgent none\n  UserKnownHostsFile %s\n  GlobalKnownHostsFile %s\n",
		f.sshd.Port, localUser(), f.key, user, global)), 0o600)
	return c
}

// bothConnect: OpenSSH's ssh connects with sshConfig, and so does konnect's dialer with cfg, which then
// serves a request to the backend at be.
func bothConnect(t *testing.T, sshConfig string, cfg Config, be string) {
	t.Helper()
	if ok, out := opensshConnects(t, sshConfig, "yes"); !ok {
		t.Fatalf("OpenSSH refused: %s", out)
	}
	d, done := start(t, cfg)
	waitReady(t, d, done)
	get(t, d, be, "/")
}

// opensshConnects runs OpenSSH's client with sshConfig alone and StrictHostKeyChecking set to strict.
func opensshConnects(t *testing.T, sshConfig, strict string) (bool, string) {
	t.Helper()
	harness.RequireSSH(t, "ssh")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ssh", "-F", sshConfig, "-o", "StrictHostKeyChecking="+strict, "-o", "BatchMode=yes", "target", "true").CombinedOutput()
	return err == nil, string(out)
}

// Every UserKnownHostsFile and GlobalKnownHostsFile is read, as OpenSSH reads them: a key in any of them is
// known, a host that one of them pins to another key has changed (--accept-new does not record over it), a
// key @revoked in any of them is refused, and new keys go to the first user file only. Each case is put to
// OpenSSH's client with the same files.
func TestKnownHostsFiles(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	otherKey, _ := harness.SSHKeyPair(t, t.TempDir(), "other", "")
	host := knownhosts.Normalize(f.sshd.Addr())
	otherLine := knownhosts.Line([]string{f.sshd.Addr()}, publicKeyOf(t, otherKey))
	write := func(t *testing.T, name, content string) string {
		p := filepath.Join(t.TempDir(), name)
		if content != "" {
			os.WriteFile(p, []byte(content+"\n"), 0o644)
		}
		return p
	}
	cfg := func(sshConfig string) Config {
		return Config{Destination: "target", ConfigFile: sshConfig, AgentSocket: "none", ConnectTimeout: 5 * time.Second}
	}

	t.Run("a global file that pins another key: changed, even with accept-new", func(t *testing.T) {
		user, global := write(t, "known_hosts", ""), write(t, "ssh_known_hosts", otherLine)
		sc := knownHostsConfig(t, f, user, global)
		if ok, out := opensshConnects(t, sc, "accept-new"); ok || !strings.Contains(out, "REMOTE HOST IDENTIFICATION HAS CHANGED") {
			t.Fatalf("OpenSSH connected: %v, want the changed-key refusal: %s", ok, out)
		}
		c := cfg(sc)
		c.AcceptNew = true
		_, done := start(t, c)
		var hk *HostKeyError
		if err := waitErr(t, done); !errors.As(err, &hk) || !hk.Changed || !strings.Contains(err.Error(), global+":1") ||
			!strings.Contains(err.Error(), "-f "+global) {
			t.Fatalf("err = %v, want a changed-key error naming %s:1", err, global)
		}
		if _, err := os.Stat(user); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the user known_hosts was written: %v", err)
		}
	})

	for _, c := range []struct{ name, user, global string }{
		{"a key in the global file", "", f.sshd.KnownHostsLine()},
		{"a key in the second global file", "", "\n" + f.sshd.KnownHostsLine()},
		{"a key in the second user file", "\n" + f.sshd.KnownHostsLine(), ""},
	} {
		t.Run(c.name+" is known", func(t *testing.T) {
			// A "\n" first puts the line in a second file, after an empty first one.
			files := func(name, content string) string {
				first, second, two := strings.Cut(content, "\n")
				if !two {
					return write(t, name, first)
				}
				return write(t, name+"_empty", first) + " " + write(t, name, second)
			}
			sc := knownHostsConfig(t, f, files("known_hosts", c.user), files("ssh_known_hosts", c.global))
			bothConnect(t, sc, cfg(sc), be)
		})
	}

	t.Run("a key @revoked in the global file is refused", func(t *testing.T) {
		sc := knownHostsConfig(t, f, write(t, "known_hosts", f.sshd.KnownHostsLine()), write(t, "ssh_known_hosts", "@revoked * "+f.sshd.HostKeyLine))
		if ok, out := opensshConnects(t, sc, "yes"); ok {
			t.Fatalf("OpenSSH connected: %s", out)
		}
		_, done := start(t, cfg(sc))
		var hk *HostKeyError
		if err := waitErr(t, done); !errors.As(err, &hk) || !hk.Revoked {
			t.Fatalf("err = %v, want a revoked-key error", err)
		}
	})

	t.Run("accept-new records in the first user file only", func(t *testing.T) {
		first, second := write(t, "known_hosts", ""), write(t, "known_hosts2", "")
		c := cfg(knownHostsConfig(t, f, first+" "+second, "none"))
		c.AcceptNew = true
		d, done := start(t, c)
		waitReady(t, d, done)
		if b, _ := os.ReadFile(first); string(b) != host+" "+f.sshd.HostKeyLine+"\n" {
			t.Errorf("first user file = %q", b)
		}
		if _, err := os.Stat(second); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the second user file was written: %v", err)
		}
	})

	t.Run("the defaults are OpenSSH's", func(t *testing.T) {
		// ssh takes the home directory from the password database, whatever $HOME says: so must konnect.
		t.Setenv("HOME", t.TempDir())
		want := map[string]string{}
		for k, v := range opensshResolves(t, "none", "target") {
			want[k] = strings.Join(v, " ")
		}
		p, err := resolve(Config{Destination: "target", ConfigFile: "none"})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(p.knownHosts, " "); got != want["userknownhostsfile"] {
			t.Errorf("UserKnownHostsFile = %q, OpenSSH's %q", got, want["userknownhostsfile"])
		}
		if got := strings.Join(p.globalKnown, " "); got != want["globalknownhostsfile"] {
			t.Errorf("GlobalKnownHostsFile = %q, OpenSSH's %q", got, want["globalknownhostsfile"])
		}
	})
}

// An @cert-authority line in the global file trusts the host certificates its CA signed.
func TestGlobalKnownHostsCertAuthority(t *testing.T) {
	f := newFixture(t)
	ca, caPub := harness.SSHKeyPair(t, t.TempDir(), "host_ca", "")
	signHostKey(t, f.sshd, ca, "127.0.0.1")
	global := filepath.Join(t.TempDir(), "ssh_known_hosts")
	os.WriteFile(global, []byte("@cert-authority * "+caPub+"\n"), 0o644)
	sc := knownHostsConfig(t, f, filepath.Join(t.TempDir(), "known_hosts"), global)
	bothConnect(t, sc, Config{Destination: "target", ConfigFile: sc, AgentSocket: "none", ConnectTimeout: 5 * time.Second}, backend(t))
}
