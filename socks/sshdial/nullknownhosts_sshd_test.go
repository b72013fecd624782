//go:build integration

package sshdial

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/smallfile"
)

// UserKnownHostsFile /dev/null reads as an empty known_hosts and records nothing, as with OpenSSH's ssh, put
// to the same config beside it: StrictHostKeyChecking accept-new (or --accept-new with --known-hosts
// /dev/null) trusts the new host for the connection, yes refuses it. /dev/null is never written or
// replaced: it stays the null device.
func TestKnownHostsNullDevice(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	stillNull := func(t *testing.T) {
		t.Helper()
		fi, err := os.Lstat("/dev/null")
		if err != nil || !smallfile.IsNull(fi) {
			t.Fatalf("/dev/null is no longer the null device: %v %v", fi, err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Nlink != 1 {
			t.Errorf("/dev/null has %d links", st.Nlink)
		}
	}
	cfg := func(sshConfig string) Config {
		return Config{Destination: "target", ConfigFile: sshConfig, AgentSocket: "none", ConnectTimeout: 5 * time.Second}
	}
	sc := knownHostsConfig(t, f, "/dev/null", "/dev/null")

	t.Run("accept-new trusts the host for the connection", func(t *testing.T) {
		if ok, out := opensshConnects(t, sc, "accept-new"); !ok {
			t.Fatalf("OpenSSH refused: %s", out)
		}
		c := cfg(sc)
		c.AcceptNew = true
		d, done := start(t, c)
		waitReady(t, d, done)
		get(t, d, be, "/")
		stillNull(t)
	})
	t.Run("the flag, with accept-new", func(t *testing.T) {
		c := f.config()
		c.KnownHostsFile = "/dev/null"
		c.AcceptNew = true
		d, done := start(t, c)
		waitReady(t, d, done)
		get(t, d, be, "/")
		stillNull(t)
	})
	t.Run("yes refuses the unknown host", func(t *testing.T) {
		if ok, out := opensshConnects(t, sc, "yes"); ok || !strings.Contains(out, "Host key verification failed") {
			t.Fatalf("OpenSSH connected: %v, want a refusal: %s", ok, out)
		}
		_, done := start(t, cfg(sc))
		err := waitErr(t, done)
		var hk *HostKeyError
		if !errors.As(err, &hk) || hk.Changed || hk.Unrecorded != nil {
			t.Fatalf("Run = %v, want an unknown-host HostKeyError", err)
		}
		stillNull(t)
	})
}
