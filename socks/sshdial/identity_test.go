//go:build integration

package sshdial

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/crypto/ssh"
)

// nobody is a user other than the one running the tests (root), as on Debian.
const nobody = 65534

// opensshLogsIn reports whether OpenSSH's own client, as the user uid (0: this user), logs in to srv with
// key (-i) and known_hosts, and nothing else.
func opensshLogsIn(t *testing.T, srv *harness.SSHD, key, knownHosts string, uid int) (bool, string) {
	t.Helper()
	harness.RequireSSH(t, "ssh", "setpriv")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	argv := []string{"ssh", "-F", "none", "-o", "UserKnownHostsFile=" + knownHosts, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-i", key, "-p", strconv.Itoa(srv.Port), "root@" + srv.Host, "true"}
	if uid != 0 {
		id := strconv.Itoa(uid)
		argv = append([]string{"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent"}
	out, err := cmd.CombinedOutput()
	return err == nil, string(out)
}

// sharedDir is a directory other users may enter, for files that a test reads as another user.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "konnect-keys-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// An identity file others may read is refused as OpenSSH refuses it ("UNPROTECTED PRIVATE KEY FILE"):
// OpenSSH checks only files the running user owns, for any permission bit of group or others. Each case
// is put to OpenSSH's client too, and both must agree.
func TestUnprotectedKeyRefusedLikeOpenSSH(t *testing.T) {
	dir := sharedDir(t)
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		mode    os.FileMode
		owner   int // uid of the file's owner; -1: the running user
		asUser  int // who runs the client; 0: the running user (root)
		refused bool
	}{
		{"0600", 0o600, -1, 0, false},
		{"0400", 0o400, -1, 0, false},
		{"0644", 0o644, -1, 0, true},
		{"0640 group may read", 0o640, -1, 0, true},
		{"0604 others may read", 0o604, -1, 0, true},
		{"0610 group may execute", 0o610, -1, 0, true},
		// Not the user's file, so not the user's to fix: OpenSSH uses it whatever its mode.
		{"0644 owned by another user", 0o644, nobody, 0, false},
		// root's own key, used by another user who can read it.
		{"0644 owned by root, used by another user", 0o644, 0, nobody, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
			if err := os.WriteFile(f, pem, 0o600); err != nil {
				t.Fatal(err)
			}
			if c.owner >= 0 {
				if err := os.Chown(f, c.owner, c.owner); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(f, c.mode); err != nil {
				t.Fatal(err)
			}
			ok, out := opensshLogsIn(t, srv, f, kh, c.asUser)
			if ok == c.refused {
				t.Fatalf("OpenSSH logged in: %v, want %v: %s", ok, !c.refused, out)
			}
			if c.refused && !strings.Contains(out, "UNPROTECTED PRIVATE KEY FILE") {
				t.Fatalf("OpenSSH refused for another reason: %s", out)
			}
			if c.asUser != 0 {
				// konnect runs as root here: apply its rule for the other user.
				fi, err := os.Stat(f)
				if err != nil {
					t.Fatal(err)
				}
				if safepath.OpenToOthers(fi, c.asUser) != c.refused {
					t.Fatalf("konnect's rule refuses %s for uid %d: %v, want %v", c.name, c.asUser, !c.refused, c.refused)
				}
				return
			}
			cfg := Config{Destination: srv.Addr(), IdentityFiles: []string{f}, ConfigFile: "none", KnownHostsFile: kh,
				AgentSocket: "none", ConnectTimeout: 5 * time.Second}
			if !c.refused {
				d, done := start(t, cfg)
				waitReady(t, d, done)
				return
			}
			_, err := New(cfg)
			var uk *UnprotectedKeyError
			if !errors.As(err, &uk) {
				t.Fatalf("New = %v, want UnprotectedKeyError", err)
			}
			mode := "0" + strconv.FormatUint(uint64(c.mode), 8)
			for _, want := range []string{"UNPROTECTED PRIVATE KEY FILE", f, mode, "AllowUnprotectedKeys"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q: %v", want, err)
				}
			}
			// The override.
			cfg.AllowUnprotectedKeys = true
			d, done := start(t, cfg)
			waitReady(t, d, done)
		})
	}

	t.Run("ssh_config IdentityFile", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "id_open")
		os.WriteFile(f, pem, 0o644)
		os.Chmod(f, 0o644)
		sshConfig := filepath.Join(t.TempDir(), "config")
		os.WriteFile(sshConfig, []byte("Host target\n  HostName 127.0.0.1\n  Port "+strconv.Itoa(srv.Port)+"\n  IdentityFile "+f+"\n"), 0o600)
		_, err := New(Config{Destination: "target", ConfigFile: sshConfig, KnownHostsFile: kh, AgentSocket: "none"})
		var uk *UnprotectedKeyError
		if !errors.As(err, &uk) || !strings.Contains(err.Error(), "IdentityFile") || !strings.Contains(err.Error(), f) {
			t.Fatalf("New = %v, want UnprotectedKeyError naming the config file's IdentityFile %s", err, f)
		}
		// An IdentityFile that does not exist is skipped, as OpenSSH skips it: -i still works.
		os.WriteFile(sshConfig, []byte("Host target\n  HostName 127.0.0.1\n  Port "+strconv.Itoa(srv.Port)+"\n  IdentityFile "+f+".absent\n"), 0o600)
		d, done := start(t, Config{Destination: "target", IdentityFiles: []string{key}, ConfigFile: sshConfig, KnownHostsFile: kh,
			AgentSocket: "none", ConnectTimeout: 5 * time.Second})
		waitReady(t, d, done)
	})

	t.Run("default key", func(t *testing.T) {
		// OpenSSH ignores an unprotected default key (with its warning) and tries the others; when it was the
		// only one, there is nothing to log in with, and the start fails saying why.
		home := t.TempDir()
		setHome(t, home)
		os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
		def := filepath.Join(home, ".ssh", "id_ed25519")
		os.WriteFile(def, pem, 0o600)
		os.Chmod(def, 0o644)
		_, err := New(Config{Destination: srv.Addr(), ConfigFile: "none", KnownHostsFile: kh, AgentSocket: "none"})
		var ni *NoIdentityError
		if !errors.As(err, &ni) || !strings.Contains(err.Error(), def+" (permissions 0644") {
			t.Fatalf("New = %v, want NoIdentityError naming %s and its permissions", err, def)
		}
		os.Chmod(def, 0o600)
		d, done := start(t, Config{Destination: srv.Addr(), ConfigFile: "none", KnownHostsFile: kh, AgentSocket: "none", ConnectTimeout: 5 * time.Second})
		waitReady(t, d, done)
	})
}

// A refused login names every identity offered: files by path and fingerprint, agent keys by fingerprint
// and comment, as ssh-add -l shows them, and the error reads cleanly (no "ssh: ssh:", no library prefix).
func TestAuthErrorNamesIdentities(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	setHome(t, dir)
	wrongFile, _ := harness.SSHKeyPair(t, dir, "id_wrong_file", "")
	wrongAgent, _ := harness.SSHKeyPair(t, dir, "wrong-agent-key@laptop", "")
	cfg := f.config()
	cfg.IdentityFiles = []string{wrongFile}
	cfg.AgentSocket = harness.SSHAgent(t, wrongAgent)
	_, done := start(t, cfg)
	err := waitErr(t, done)
	var ae *AuthError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want AuthError", err)
	}
	fp := func(priv string) string { return ssh.FingerprintSHA256(publicKeyOf(t, priv)) }
	for _, want := range []string{
		"root@" + f.sshd.Addr(),
		wrongFile + " (ED25519 " + fp(wrongFile) + ")",
		"agent key ED25519 " + fp(wrongAgent) + " (wrong-agent-key@laptop)",
		"publickey",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	for _, bad := range []string{"ssh: ssh:", "handshake failed"} {
		if strings.Contains(err.Error(), bad) {
			t.Errorf("error reads %q: %v", bad, err)
		}
	}
}

// A skipped identity file (here the absent default ~/.ssh/id_ed25519) shifts no name: the refused login
// names the file whose key was offered.
func TestAuthErrorNamesTheOfferedFile(t *testing.T) {
	f := newFixture(t)
	home := t.TempDir()
	setHome(t, home)
	if err := os.Mkdir(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	ecdsa, _ := harness.SSHKeyPair(t, filepath.Join(home, ".ssh"), "id_ecdsa", "")
	cfg := f.config()
	cfg.IdentityFiles = nil
	_, done := start(t, cfg)
	err := waitErr(t, done)
	var ae *AuthError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want AuthError", err)
	}
	want := ecdsa + " (ED25519 " + ssh.FingerprintSHA256(publicKeyOf(t, ecdsa)) + ")"
	if len(ae.Offered) != 1 || ae.Offered[0] != want {
		t.Errorf("Offered = %q, want [%q]", ae.Offered, want)
	}
}
