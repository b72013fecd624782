package sshdial

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestParseDestination(t *testing.T) {
	for _, tc := range []struct {
		in         string
		user, host string
		port       int
		err        bool
	}{
		{"bastion", "", "bastion", 0, false},
		{"alice@bastion", "alice", "bastion", 0, false},
		{"alice@bastion:2222", "alice", "bastion", 2222, false},
		{"ssh://alice@bastion:2222", "alice", "bastion", 2222, false},
		{"ssh://[::1]:22", "", "::1", 22, false},
		{"[::1]:2200", "", "::1", 2200, false},
		{"[fe80::1]", "", "fe80::1", 0, false},
		{"a@b@host", "a@b", "host", 0, false},
		{"", "", "", 0, true},
		{"alice@", "", "", 0, true},
		{"-oProxyCommand=x", "", "", 0, true},
		{"host:0", "", "", 0, true},
		{"host:99999", "", "", 0, true},
		{"ssh://host/path", "", "", 0, true},
		{"ho st", "", "", 0, true},
	} {
		u, h, p, err := ParseDestination(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("%q: err = %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if !tc.err && (u != tc.user || h != tc.host || p != tc.port) {
			t.Errorf("%q = (%q, %q, %d), want (%q, %q, %d)", tc.in, u, h, p, tc.user, tc.host, tc.port)
		}
	}
}

func TestResolveWithSSHConfig(t *testing.T) {
	dir := t.TempDir()
	setHome(t, dir)
	cfgFile := filepath.Join(dir, "config")
	os.WriteFile(cfgFile, []byte(`Host bastion
  HostName 192.0.2.10
  User ops
  Port 2222
  IdentityFile ~/.ssh/bastion_key
  ServerAliveInterval 7
  ProxyJump jumpy

Host jumpy
  HostName 192.0.2.1
  User jumper

Host v6only
  AddressFamily inet6

Host badfamily
  AddressFamily ipv9

Host *
  ServerAliveCountMax 5
`), 0o600)
	key := filepath.Join(dir, "k")
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(key, pem.EncodeToMemory(block), 0o600)
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("x"), 0o600)
	knownDir := filepath.Join(dir, "known")
	os.Mkdir(knownDir, 0o700)

	for _, tc := range []struct {
		name  string
		cfg   Config
		check func(t *testing.T, p *plan)
		err   string
	}{
		{"config file applies", Config{Destination: "bastion", ConfigFile: cfgFile}, func(t *testing.T, p *plan) {
			if len(p.hops) != 2 {
				t.Fatalf("hops %v", p.hops)
			}
			if j := p.hops[0]; j.hostName != "192.0.2.1" || j.user != "jumper" || j.port != 22 {
				t.Errorf("jump %+v", j)
			}
			tg := p.hops[1]
			if tg.hostName != "192.0.2.10" || tg.user != "ops" || tg.port != 2222 {
				t.Errorf("target %+v", tg)
			}
			if want := []string{filepath.Join(dir, ".ssh", "bastion_key")}; !reflect.DeepEqual(tg.identity, want) {
				t.Errorf("identity %v, want %v", tg.identity, want)
			}
			if p.aliveInterval != 7*time.Second || p.aliveCountMax != 5 {
				t.Errorf("keepalive %s x%d", p.aliveInterval, p.aliveCountMax)
			}
			if want := []string{filepath.Join(dir, ".ssh", "known_hosts"), filepath.Join(dir, ".ssh", "known_hosts2")}; !reflect.DeepEqual(p.knownHosts, want) {
				t.Errorf("known_hosts %v, want %v", p.knownHosts, want)
			}
			if !reflect.DeepEqual(p.globalKnown, defaultGlobalKnownHosts) {
				t.Errorf("global known_hosts %v, want %v", p.globalKnown, defaultGlobalKnownHosts)
			}
		}, ""},
		{"command line wins", Config{Destination: "root@bastion:2200", User: "cli", Port: 2300, JumpHosts: []string{"none"}, ConfigFile: cfgFile}, func(t *testing.T, p *plan) {
			if len(p.hops) != 1 {
				t.Fatalf("hops %v: -J none must drop ProxyJump", p.hops)
			}
			if tg := p.hops[0]; tg.user != "cli" || tg.port != 2300 {
				t.Errorf("target %+v", tg)
			}
		}, ""},
		{"destination user and port over the config", Config{Destination: "root@bastion:2200", ConfigFile: cfgFile, JumpHosts: []string{"j1:23", "u@j2"}}, func(t *testing.T, p *plan) {
			if len(p.hops) != 3 || p.hops[0].addr() != "j1:23" || p.hops[1].user != "u" {
				t.Fatalf("hops %v", p.hops)
			}
			if tg := p.hops[2]; tg.user != "root" || tg.port != 2200 {
				t.Errorf("target %+v", tg)
			}
		}, ""},
		{"no config file", Config{Destination: "bastion", ConfigFile: "none"}, func(t *testing.T, p *plan) {
			if tg := p.hops[0]; tg.hostName != "bastion" || tg.port != 22 || len(p.defaultIDs) != 3 {
				t.Errorf("target %+v, defaults %v", tg, p.defaultIDs)
			}
			if p.aliveInterval != defaultAliveInterval || p.connectTimeout != DefaultConnectTimeout {
				t.Errorf("defaults not applied: %+v", p)
			}
		}, ""},
		{"address family any by default", Config{Destination: "bastion", ConfigFile: cfgFile}, func(t *testing.T, p *plan) {
			if p.network != "tcp" {
				t.Errorf("network %q, want tcp", p.network)
			}
		}, ""},
		{"address family from the config file", Config{Destination: "v6only", ConfigFile: cfgFile}, func(t *testing.T, p *plan) {
			if p.network != "tcp6" {
				t.Errorf("network %q, want tcp6 (AddressFamily inet6)", p.network)
			}
		}, ""},
		{"address family from the command line wins", Config{Destination: "v6only", ConfigFile: cfgFile, AddressFamily: "inet"}, func(t *testing.T, p *plan) {
			if p.network != "tcp4" {
				t.Errorf("network %q, want tcp4 (-4 over the file's inet6)", p.network)
			}
		}, ""},
		{"address family unknown in the config file", Config{Destination: "badfamily", ConfigFile: cfgFile}, nil, `the SSH config file's AddressFamily for badfamily: address family "ipv9" is not any, inet or inet6`},
		{"address family unknown", Config{Destination: "h", ConfigFile: "none", AddressFamily: "inet5"}, nil, `AddressFamily: address family "inet5"`},
		{"explicit identity must exist", Config{Destination: "h", ConfigFile: "none", IdentityFiles: []string{filepath.Join(dir, "absent")}}, nil, "identity file"},
		{"explicit identity", Config{Destination: "h", ConfigFile: "none", IdentityFiles: []string{key}}, func(t *testing.T, p *plan) {
			if !reflect.DeepEqual(p.identityFiles, []string{key}) {
				t.Errorf("identity %v", p.identityFiles)
			}
		}, ""},
		{"host a bad IPv4 address", Config{Destination: "999.1.1.1", ConfigFile: "none"}, nil, `host "999.1.1.1" looks like an IP address but is not a valid one`},
		// Every connection would fail on these, and reconnecting would not help: they fail the start.
		{"explicit identity not a key", Config{Destination: "h", ConfigFile: "none", IdentityFiles: []string{garbage}}, nil, "identity file " + garbage + " is not a private key"},
		{"explicit identity a directory", Config{Destination: "h", ConfigFile: "none", IdentityFiles: []string{dir}}, nil, "is not a file"},
		{"known_hosts a directory", Config{Destination: "h", ConfigFile: "none", KnownHostsFile: knownDir}, nil, "known_hosts " + knownDir + " is not a file"},
		{"known_hosts another device", Config{Destination: "h", ConfigFile: "none", KnownHostsFile: "/dev/zero"}, nil, "known_hosts /dev/zero is not a file"},
		{"known_hosts the null device", Config{Destination: "h", ConfigFile: "none", KnownHostsFile: "/dev/null"}, func(t *testing.T, p *plan) {
			if !reflect.DeepEqual(p.knownHosts, []string{"/dev/null"}) {
				t.Errorf("known_hosts %v, want /dev/null", p.knownHosts)
			}
		}, ""},
		{"missing explicit config file", Config{Destination: "h", ConfigFile: filepath.Join(dir, "nope")}, nil, "ssh config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := resolve(tc.cfg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, p)
		})
	}
}

// TestNewRefusesTooManyConnections: Config.Connections is bounded by MaxConnections.
func TestNewRefusesTooManyConnections(t *testing.T) {
	if _, err := New(Config{Destination: "host", ConfigFile: "none", Connections: MaxConnections + 1}); err == nil {
		t.Error("New accepted more than MaxConnections")
	}
}

// setHome makes dir the home directory of the running user's passwd entry as konnect finds it (homeDir),
// for the rest of the test.
func setHome(t *testing.T, dir string) {
	t.Helper()
	prev := passwdHome
	passwdHome = func() (string, error) { return dir, nil }
	t.Cleanup(func() { passwdHome = prev })
}

// TestHomeIsThePasswdEntrys: as OpenSSH, konnect takes "~" from the running user's passwd entry, whatever
// $HOME says: for ~/.ssh/config, the default known_hosts and identity files, and ~ and %d in the config
// file's paths. $HOME counts only when there is no entry.
func TestHomeIsThePasswdEntrys(t *testing.T) {
	elsewhere := t.TempDir()
	t.Setenv("HOME", elsewhere)

	t.Run("the running user's entry", func(t *testing.T) {
		u, err := user.Current()
		if err != nil || u.HomeDir == "" || u.HomeDir == elsewhere {
			t.Skipf("no passwd entry with a home directory: %v", err)
		}
		p, err := resolve(Config{Destination: "h", ConfigFile: "none"})
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(u.HomeDir, ".ssh", "id_ed25519"); len(p.defaultIDs) == 0 || p.defaultIDs[0] != want {
			t.Errorf("default identity files %q, want %s first", p.defaultIDs, want)
		}
		if want := filepath.Join(u.HomeDir, ".ssh", "known_hosts"); len(p.knownHosts) == 0 || p.knownHosts[0] != want {
			t.Errorf("known_hosts files %q, want %s first", p.knownHosts, want)
		}
		if got, want := expandPath("~/k %d/k", p.hops[0]), filepath.Join(u.HomeDir, "k")+" "+u.HomeDir+"/k"; got != want {
			t.Errorf("~/k %%d/k expands to %q, want %q", got, want)
		}
	})

	// The SSH config file is the entry's ~/.ssh/config, and the paths in it are the entry's too.
	t.Run("the SSH config file", func(t *testing.T) {
		home := t.TempDir()
		setHome(t, home)
		for dir, user := range map[string]string{home: "from-passwd-home", elsewhere: "from-HOME"} {
			if err := os.MkdirAll(filepath.Join(dir, ".ssh"), 0o700); err != nil {
				t.Fatal(err)
			}
			conf := "Host h\n  User " + user + "\n  IdentityFile ~/.ssh/id_h\n  CertificateFile %d/.ssh/id_h-cert.pub\n"
			if err := os.WriteFile(filepath.Join(dir, ".ssh", "config"), []byte(conf), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		p, err := resolve(Config{Destination: "h"})
		if err != nil {
			t.Fatal(err)
		}
		h := p.hops[0]
		if h.user != "from-passwd-home" {
			t.Errorf("user %q: the SSH config file read is not the passwd entry's home's", h.user)
		}
		if want := []string{filepath.Join(home, ".ssh", "id_h")}; !slices.Equal(h.identity, want) {
			t.Errorf("IdentityFile ~/.ssh/id_h is %q, want %q", h.identity, want)
		}
		if want := []string{filepath.Join(home, ".ssh", "id_h-cert.pub")}; !slices.Equal(h.certificates, want) {
			t.Errorf("CertificateFile %%d/.ssh/id_h-cert.pub is %q, want %q", h.certificates, want)
		}
	})

	t.Run("no entry", func(t *testing.T) {
		prev := passwdHome
		passwdHome = func() (string, error) { return "", errors.New("no passwd entry") }
		t.Cleanup(func() { passwdHome = prev })
		p, err := resolve(Config{Destination: "h", ConfigFile: "none"})
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(elsewhere, ".ssh", "id_ed25519"); len(p.defaultIDs) == 0 || p.defaultIDs[0] != want {
			t.Errorf("default identity files %q, want %s ($HOME's) first", p.defaultIDs, want)
		}
	})
}
