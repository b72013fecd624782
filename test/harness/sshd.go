package harness

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SSHDPath is where Debian's openssh-server installs the daemon.
const SSHDPath = "/usr/sbin/sshd"

// SSHD is a real OpenSSH sshd with its own config, host key and authorized keys in Dir.
type SSHD struct {
	Host        string
	Port        int
	Dir         string
	HostKeyFile string // private host key
	HostKeyLine string // "ssh-ed25519 AAAA..." (public)
	Proc        *Proc  // the listener; its log is sshd's

	from string
	t    testing.TB
	mu   sync.Mutex
}

// SSHDOptions puts sshd in a network namespace; the zero value serves on a free loopback port.
type SSHDOptions struct {
	Addr  string // host:port to listen on
	Netns string // namespace sshd runs in
	From  string // namespace the readiness check dials from
	Dir   string // config, keys and log; t.TempDir() when empty
	Keep  bool   // leave sshd running after the test, for debugging
}

// StartSSHD runs sshd on a free loopback port, accepting the given public key lines for the current user
// (root included). It is stopped when the test ends.
func StartSSHD(t testing.TB, authorizedKeys ...string) *SSHD {
	t.Helper()
	return StartSSHDWith(t, SSHDOptions{}, authorizedKeys...)
}

// StartSSHDWith is StartSSHD with options.
func StartSSHDWith(t testing.TB, o SSHDOptions, authorizedKeys ...string) *SSHD {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.Addr == "" {
		o.Addr = ClosedAddr(t)
	}
	s, err := NewSSHD(o, authorizedKeys...)
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	if !o.Keep {
		t.Cleanup(s.Stop)
	}
	return s
}

// NewSSHD is StartSSHDWith for a program that is not a test (the bench tool): o.Dir and o.Addr are
// required, errors are returned, and the caller stops sshd.
func NewSSHD(o SSHDOptions, authorizedKeys ...string) (*SSHD, error) {
	if err := requireSSH(SSHDPath); err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, fmt.Errorf("sshd address: %w", err)
	}
	// /run/sshd is sshd's privilege separation directory, without which it refuses to start.
	for _, d := range []string{o.Dir, "/run/sshd"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	hostKey, hostPub, err := GenerateSSHKey(o.Dir, "host_ed25519", "")
	if err != nil {
		return nil, err
	}
	fields := strings.Fields(hostPub)
	s := &SSHD{Host: host, Dir: o.Dir, HostKeyFile: hostKey, HostKeyLine: fields[0] + " " + fields[1], from: o.From}
	s.Port, _ = strconv.Atoi(port)
	authorized, config := filepath.Join(o.Dir, "authorized_keys"), filepath.Join(o.Dir, "sshd_config")
	if err := os.WriteFile(authorized, []byte(strings.Join(authorizedKeys, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}
	// LogLevel DEBUG1 records the key exchange and ciphers each client negotiated, and nothing per packet.
	cfg := fmt.Sprintf(`Port %s
ListenAddress %s
HostKey %s
AuthorizedKeysFile %s
PidFile %s
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AllowTcpForwarding yes
MaxStartups 200:30:400
MaxSessions 200
LogLevel DEBUG1
`, port, host, hostKey, authorized, filepath.Join(o.Dir, "sshd.pid"))
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	// -D keeps sshd in the foreground, so that Proc owns it; -e logs to stderr, which is the log file.
	s.Proc = &Proc{Name: "sshd", LogPath: filepath.Join(o.Dir, "sshd.log"), Argv: []string{SSHDPath, "-D", "-e", "-f", config}, Keep: o.Keep}
	if o.Netns != "" {
		s.Proc.Via = NetnsExec(o.Netns)
	}
	if err := s.Launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// Addr is "host:port".
func (s *SSHD) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// KnownHostsLine is the known_hosts line that trusts this server under the address it is dialled by.
func (s *SSHD) KnownHostsLine() string {
	if s.Port == 22 {
		return s.Host + " " + s.HostKeyLine
	}
	return fmt.Sprintf("[%s]:%d %s", s.Host, s.Port, s.HostKeyLine)
}

// Restart starts sshd (again) on the same address with the same keys, and waits until it answers.
func (s *SSHD) Restart() {
	s.t.Helper()
	if err := s.Launch(); err != nil {
		s.t.Fatal(err)
	}
}

// Launch is Restart with the error returned.
func (s *SSHD) Launch() error {
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.Proc.Launch(); err != nil {
		return err
	}
	return Poll("sshd's banner on "+s.Addr(), 30*time.Second, 50*time.Millisecond, func() error {
		if err := s.Proc.Exited(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := DialIn(ctx, s.from, s.Addr())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.HasPrefix(line, "SSH-2.0-") {
			return fmt.Errorf("banner %q", line)
		}
		return nil
	})
}

// Stop kills sshd and its per-connection children, so that established sessions drop as well.
func (s *SSHD) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Proc.done == nil || !s.Proc.Running() {
		return
	}
	pid := s.Proc.Pid()
	// Freeze the listener first so that it forks no new child while its children are collected.
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	// Each per-connection child runs in a session of its own, out of reach of the group's SIGKILL.
	for _, child := range Descendants(pid) {
		_ = syscall.Kill(child, syscall.SIGKILL)
	}
	s.Proc.Kill()
}

// Pids returns the pids of the sshd listener and of all its per-connection children.
func (s *SSHD) Pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Proc.done == nil || !s.Proc.Running() {
		return nil
	}
	return append([]int{s.Proc.Pid()}, Descendants(s.Proc.Pid())...)
}

// Log returns sshd's log so far.
func (s *SSHD) Log() string { return s.Proc.Log() }

// RequireSSH fails the test when an OpenSSH program is missing: CI installs them, so a missing one is an
// error.
func RequireSSH(t testing.TB, progs ...string) {
	t.Helper()
	if err := requireSSH(progs...); err != nil {
		t.Fatal(err)
	}
}

func requireSSH(progs ...string) error {
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s is required (install openssh-server and openssh-client): %w", p, err)
		}
	}
	return nil
}

// SSHKeyPair generates an ed25519 key with ssh-keygen in dir and returns the private key path and the
// public key line. passphrase may be empty.
func SSHKeyPair(t testing.TB, dir, name, passphrase string) (string, string) {
	t.Helper()
	path, pub, err := GenerateSSHKey(dir, name, passphrase)
	if err != nil {
		t.Fatal(err)
	}
	return path, pub
}

// GenerateSSHKey is SSHKeyPair with the error returned.
func GenerateSSHKey(dir, name, passphrase string) (path, pub string, err error) {
	if err := requireSSH("ssh-keygen"); err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, name)
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", path).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("ssh-keygen %s: %v: %s", name, err, out)
	}
	b, err := os.ReadFile(path + ".pub")
	if err != nil {
		return "", "", err
	}
	return path, strings.TrimSpace(string(b)), nil
}

// SSHAgent runs ssh-agent on a socket in a temporary directory, loads the given private keys with ssh-add,
// and returns the socket path. It is killed when the test ends.
func SSHAgent(t testing.TB, keys ...string) string {
	t.Helper()
	RequireSSH(t, "ssh-agent", "ssh-add")
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	p := Start(t, dir, "ssh-agent", nil, "ssh-agent", "-D", "-a", sock)
	err := Poll("ssh-agent's socket "+sock, 5*time.Second, 20*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		add := exec.Command("ssh-add", k)
		add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
		if out, err := add.CombinedOutput(); err != nil {
			t.Fatalf("ssh-add %s: %v: %s", k, err, out)
		}
	}
	return sock
}
