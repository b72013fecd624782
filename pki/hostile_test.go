package pki

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki/safepath"
)

// otherUser is "another user": root can give them files and directories without the user existing.
const otherUser = 65534

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making another user's files needs root")
	}
}

// TestEnsureRefusesSharedDirectory: a pki directory, or one above it, that another user owns or that
// everyone may write to, and a kept certificate that others may change, are refused before anything is
// written, naming what another user could change.
func TestEnsureRefusesSharedDirectory(t *testing.T) {
	for _, c := range []struct {
		name string
		// setUp prepares cfg.Dir and returns what the error must name.
		setUp func(t *testing.T, cfg Config) string
		root  bool
	}{
		{name: "directory above writable by everyone", setUp: func(t *testing.T, cfg Config) string {
			must(t, os.Chmod(cfg.Dir, 0o777))
			return cfg.Dir + " is writable by everyone"
		}},
		{name: "kept CA certificate writable by everyone", setUp: func(t *testing.T, cfg Config) string {
			mustEnsure(t, cfg)
			ca := filepath.Join(cfg.PKIDir(), "ca.crt")
			must(t, os.Chmod(ca, 0o666))
			return ca
		}},
		{name: "pki directory of another user", root: true, setUp: func(t *testing.T, cfg Config) string {
			must(t, os.Mkdir(cfg.PKIDir(), 0o700))
			must(t, os.Chown(cfg.PKIDir(), otherUser, otherUser))
			return cfg.PKIDir() + " belongs to uid 65534"
		}},
		{name: "directory above of another user", root: true, setUp: func(t *testing.T, cfg Config) string {
			must(t, os.Chown(cfg.Dir, otherUser, otherUser))
			return cfg.Dir + " belongs to uid 65534"
		}},
		{name: "pki directory writable by another group", root: true, setUp: func(t *testing.T, cfg Config) string {
			must(t, os.Mkdir(cfg.PKIDir(), 0o700))
			must(t, os.Chmod(cfg.PKIDir(), 0o770))
			must(t, os.Chown(cfg.PKIDir(), 0, otherUser))
			return "writable by group 65534"
		}},
		{name: "kept CA key of another user", root: true, setUp: func(t *testing.T, cfg Config) string {
			mustEnsure(t, cfg)
			key := filepath.Join(cfg.PKIDir(), "front-proxy-ca.key")
			must(t, os.Chown(key, otherUser, otherUser))
			return key
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.root {
				needRoot(t)
			}
			cfg := testConfig(t)
			want := c.setUp(t, cfg)
			before := snapshot(t, cfg.Dir)
			for _, dryRun := range []bool{true, false} {
				cfg.DryRun = dryRun
				_, err := Ensure(cfg)
				if !errors.Is(err, safepath.ErrShared) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "nothing written") {
					t.Fatalf("dry run %v: %v, want a refusal naming %q", dryRun, err, want)
				}
			}
			if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
				t.Errorf("refused, yet changed %v", changed)
			}
			_, err := Renew(cfg, All)
			if !errors.Is(err, safepath.ErrShared) {
				t.Errorf("renew: %v, want a refusal", err)
			}
		})
	}
}

// TestEnsureRefusesPlantedSymlink is the review's attack: another user plants front-proxy-client.key as a
// symlink to a file outside the directory, and init writes a key over that file. The link is refused,
// naming it, and the file it points to keeps its content; so is a link of ours whose target another user
// could change. A link of ours to a sound file is still written through (see TestWriteFileThroughSymlink).
func TestEnsureRefusesPlantedSymlink(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name  string
		plant func(t *testing.T, link, victim string)
		want  string
	}{
		{"another user's symlink", func(t *testing.T, link, victim string) {
			must(t, os.Symlink(victim, link))
			must(t, os.Lchown(link, otherUser, otherUser))
		}, "belongs to uid 65534"},
		{"our symlink to another user's file", func(t *testing.T, link, victim string) {
			must(t, os.Chown(victim, otherUser, otherUser))
			must(t, os.Symlink(victim, link))
		}, "belongs to uid 65534"},
		{"our symlink into another user's directory", func(t *testing.T, link, victim string) {
			must(t, os.Chown(filepath.Dir(victim), otherUser, otherUser))
			must(t, os.Symlink(victim, link))
		}, "belongs to uid 65534"},
		{"our symlink to a file everyone may write to", func(t *testing.T, link, victim string) {
			must(t, os.Chmod(victim, 0o666))
			must(t, os.Symlink(victim, link))
		}, "writable by everyone"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			must(t, os.Mkdir(cfg.PKIDir(), 0o700))
			outside := filepath.Join(t.TempDir(), "outside")
			must(t, os.Mkdir(outside, 0o755))
			victim := filepath.Join(outside, "victim")
			must(t, os.WriteFile(victim, []byte("precious\n"), 0o644))
			link := filepath.Join(cfg.PKIDir(), "front-proxy-client.key")
			c.plant(t, link, victim)
			_, err := Ensure(cfg)
			if !errors.Is(err, safepath.ErrShared) || !strings.Contains(err.Error(), link) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Ensure: %v, want a refusal naming %s and saying %q", err, link, c.want)
			}
			// WriteFile, the one writer, refuses it as well, for callers that do not go through Ensure.
			if _, err := WriteFile(link, []byte("key"), KeyMode, DirMode); !errors.Is(err, safepath.ErrShared) || !strings.Contains(err.Error(), link) {
				t.Errorf("WriteFile: %v", err)
			}
			if data, _ := os.ReadFile(victim); string(data) != "precious\n" {
				t.Errorf("the symlink's target was overwritten: %q", data)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
