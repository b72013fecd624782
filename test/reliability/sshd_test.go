package reliability

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sshd is a real OpenSSH server on loopback with its own host key and one authorised client key.
type sshd struct {
	port       int
	hostPub    string // "ssh-ed25519 AAAA..." of the host key
	clientKey  string // private key file of the authorised client
	knownHosts string // known_hosts file trusting the host key
}

func sshKeygen(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
}

// startSSHD runs /usr/sbin/sshd in the foreground with its own configuration, on a free loopback port.
func startSSHD(t *testing.T) *sshd {
	t.Helper()
	requireRoot(t)
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		t.Fatalf("OpenSSH server missing (apt-get install openssh-server): %v", err)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	sshKeygen(t, filepath.Join(dir, "host_key"))
	sshKeygen(t, filepath.Join(dir, "client_key"))
	pub, err := os.ReadFile(filepath.Join(dir, "client_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "authorized_keys"), string(pub))
	hostPub, err := os.ReadFile(filepath.Join(dir, "host_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	s := &sshd{port: freePort(t), hostPub: strings.TrimSpace(string(hostPub)), clientKey: filepath.Join(dir, "client_key"),
		knownHosts: filepath.Join(dir, "known_hosts")}
	writeFile(t, s.knownHosts, fmt.Sprintf("[127.0.0.1]:%d %s\n", s.port, s.hostPub))
	cfg := filepath.Join(dir, "sshd_config")
	writeFile(t, cfg, fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s
AuthorizedKeysFile %s
StrictModes no
PidFile %s
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
`, s.port, filepath.Join(dir, "host_key"), filepath.Join(dir, "authorized_keys"), filepath.Join(dir, "sshd.pid")))
	cmd := exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", cfg)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sshd log:\n%s", tail(logs.String(), 3000))
		}
	})
	eventually(t, 10*time.Second, "sshd listening", func() error {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	return s
}

// socksArgs runs konnect socks through s with the given local listener and health port.
func (s *sshd) socksArgs(listen string, health int, extra ...string) []string {
	return append([]string{"socks", "-F", "none", "--known-hosts", s.knownHosts, "-i", s.clientKey,
		"-p", strconv.Itoa(s.port), "-l", "root", "-D", listen,
		"--health-listen", "127.0.0.1:" + strconv.Itoa(health)}, append(extra, "127.0.0.1")...)
}
