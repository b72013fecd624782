//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

const sshPort = 22

// sshd is a real OpenSSH server in cp, reachable from lap on 198.18.1.1:22.
type sshd struct {
	dir        string
	clientKey  string // private key whose public half is authorized for root
	knownHosts string // a known_hosts file that trusts sshd's host key
	p          *proc
}

func (c *cluster) startSSHD(t *testing.T) *sshd {
	t.Helper()
	dir := filepath.Join(c.dir, "sshd-"+randHex(2))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// sshd refuses to start without its privilege-separation directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hostKey := filepath.Join(dir, "host_ed25519")
	clientKey := filepath.Join(dir, "id_ed25519")
	for _, k := range []string{hostKey, clientKey} {
		if out, err := harness.Run(ctx, "", bins.sshKeygen, "-q", "-t", "ed25519", "-N", "", "-C", "e2e", "-f", k); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	pub, err := os.ReadFile(clientKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	authorized := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authorized, pub, 0o600); err != nil {
		t.Fatal(err)
	}
	hostPub, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(hostPub))
	knownHosts := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(knownHosts, []byte(fmt.Sprintf("%s %s %s\n", cpLapAddr, fields[0], fields[1])), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`Port %d
ListenAddress %s
HostKey %s
AuthorizedKeysFile %s
PidFile %s
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
LogLevel VERBOSE
`, sshPort, cpLapAddr, hostKey, authorized, filepath.Join(dir, "sshd.pid"))), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &sshd{dir: dir, clientKey: clientKey, knownHosts: knownHosts}
	// -D: stay in the foreground, so that the harness owns the process; -e: log to stderr.
	s.p = startProcT(t, "sshd", c.tp.ns(nsCP), c.logDir, bins.sshd, "-D", "-e", "-f", config)
	err = harness.Poll("sshd banner from lap", 30*time.Second, 200*time.Millisecond, func() error {
		if err := s.p.Exited(); err != nil {
			return err
		}
		conn, err := harness.DialIn(ctx, c.tp.ns(nsLap), net.JoinHostPort(cpLapAddr, fmt.Sprint(sshPort)))
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, "SSH-2.0-") {
			return fmt.Errorf("banner %q", line)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sshArgs are the konnect flags that log in to this sshd as root with the
// test's key, trusting only its host key and reading no SSH config.
func (s *sshd) sshArgs() []string {
	return []string{"-F", "none", "-i", s.clientKey, "--known-hosts", s.knownHosts, "-l", "root"}
}
