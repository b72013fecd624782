package sshflags

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/socks/sshdial"
)

// TestNames: every sshdial error that names a Config field reads with the SSH flag that sets it, also
// wrapped, as `konnect socks` and `konnect proxy --via` print it.
func TestNames(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&sshdial.StartError{Target: "root@127.0.0.1:1", Err: syscall.ECONNREFUSED},
			"cannot connect to root@127.0.0.1:1: connection refused; check the host and port, or pass --retry-first to keep trying until the server answers"},
		{&sshdial.UnprotectedKeyError{File: "/k", Mode: 0o644},
			"UNPROTECTED PRIVATE KEY FILE: permissions 0644 for identity file /k are too open: a private key must not be accessible by others; run chmod 600 /k, or pass --allow-unprotected-key"},
		{&sshdial.HostKeyError{Host: "h", KeyType: "ssh-ed25519", Fingerprint: "SHA256:x", KnownHostsFile: "/kh", Line: "h ssh-ed25519 AAAA"},
			"host key for h is not known: ssh-ed25519 SHA256:x. Verify this fingerprint with the server's administrator, then add this line to /kh (or run once with --accept-new):\nh ssh-ed25519 AAAA"},
		{fmt.Errorf("ssh: %w", &sshdial.HostKeyError{Host: "h", KeyType: "ssh-ed25519", Fingerprint: "SHA256:x", Unrecorded: fmt.Errorf("refusing to write /kh: %w", safepath.ErrShared)}),
			"ssh: host key for h is not known: ssh-ed25519 SHA256:x, and --accept-new cannot record it: refusing to write /kh: " + safepath.ErrShared.Error()},
	} {
		got := Names.Error(tc.err)
		if got.Error() != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
		if strings.ContainsAny(got.Error(), "{}") || !errors.Is(got, tc.err) {
			t.Errorf("%q: lost what it wraps or left a placeholder", got)
		}
	}
	if Names.Error(fs.ErrNotExist) != fs.ErrNotExist {
		t.Error("an error naming no field came back changed")
	}
}
