//go:build e2e

package e2e

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/konnect-dev/konnect/test/harness"
)

// sshd is a real OpenSSH server in cp, reachable from lap on 198.18.1.1:22.
type sshd struct {
	clientKey  string // private key whose public half is authorized for root
	knownHosts string // a known_hosts file that trusts sshd's host key
}

func (c *cluster) startSSHD(t *testing.T) *sshd {
	t.Helper()
	dir := filepath.Join(c.dir, "sshd-"+randHex(2))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	clientKey, pub := harness.SSHKeyPair(t, dir, "id_ed25519", "")
	srv := harness.StartSSHDWith(t, harness.SSHDOptions{Addr: net.JoinHostPort(cpLapAddr, "22"),
		Netns: c.tp.ns(nsCP), From: c.tp.ns(nsLap), Dir: dir, Keep: keepEnv}, pub)
	logsMu.Lock()
	allLogs = append(allLogs, &proc{Proc: srv.Proc, ns: c.tp.ns(nsCP)})
	logsMu.Unlock()
	s := &sshd{clientKey: clientKey, knownHosts: filepath.Join(dir, "known_hosts")}
	if err := os.WriteFile(s.knownHosts, []byte(srv.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// sshArgs are the konnect flags that log in to this sshd as root with the
// test's key, trusting only its host key and reading no SSH config.
func (s *sshd) sshArgs() []string {
	return []string{"-F", "none", "-i", s.clientKey, "--known-hosts", s.knownHosts, "-l", "root"}
}
