//go:build integration

package reliability

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/konnect-dev/konnect/test/harness"
)

// sshd is a real OpenSSH server on loopback with its own host key and one authorised client key.
type sshd struct {
	port       int
	clientKey  string // private key file of the authorised client
	knownHosts string // known_hosts file trusting the host key
}

// startSSHD runs OpenSSH's sshd on a free loopback port, trusting one client key of its own.
func startSSHD(t *testing.T) *sshd {
	t.Helper()
	requireRoot(t)
	dir := shortDir(t)
	clientKey, clientPub := harness.SSHKeyPair(t, dir, "client_key", "")
	srv := harness.StartSSHD(t, clientPub)
	s := &sshd{port: srv.Port, clientKey: clientKey, knownHosts: filepath.Join(dir, "known_hosts")}
	writeFile(t, s.knownHosts, srv.KnownHostsLine()+"\n")
	return s
}

// socksArgs runs konnect socks through s with the given local listener and health port.
func (s *sshd) socksArgs(listen string, health int, extra ...string) []string {
	return append([]string{"socks", "-F", "none", "--known-hosts", s.knownHosts, "-i", s.clientKey,
		"-p", strconv.Itoa(s.port), "-l", "root", "-D", listen,
		"--health-listen", "127.0.0.1:" + strconv.Itoa(health)}, append(extra, "127.0.0.1")...)
}
