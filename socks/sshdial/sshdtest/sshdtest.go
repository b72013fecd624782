// Package sshdtest runs a real OpenSSH sshd on loopback for tests, with its own config, host key and
// authorized keys in a temporary directory. It also generates keys with ssh-keygen and runs ssh-agent.
// It is for tests only.
package sshdtest

import (
	"bufio"
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

	"github.com/konnect-dev/konnect/test/harness"
)

// SSHD is where Debian's openssh-server installs the daemon.
const SSHD = "/usr/sbin/sshd"

// Server is one running sshd.
type Server struct {
	Port        int
	Dir         string
	HostKeyFile string // private host key
	HostKeyLine string // "ssh-ed25519 AAAA..." (public)
	LogFile     string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	t      testing.TB
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// KnownHostsLine is the known_hosts line that trusts this server under the address it is dialled by.
func (s *Server) KnownHostsLine() string {
	return fmt.Sprintf("[127.0.0.1]:%d %s", s.Port, s.HostKeyLine)
}

// Require fails the test when an OpenSSH program is missing: CI installs them, so a missing one is an error.
func Require(t testing.TB, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is required for this test (install openssh-server and openssh-client): %v", p, err)
		}
	}
}

// KeyPair generates an ed25519 key with ssh-keygen in dir and returns the private key path and the public
// key line. passphrase may be empty.
func KeyPair(t testing.TB, dir, name, passphrase string) (string, string) {
	t.Helper()
	Require(t, "ssh-keygen")
	path := filepath.Join(dir, name)
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen %s: %v: %s", name, err, out)
	}
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return path, strings.TrimSpace(string(pub))
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int { return harness.FreePort(t) }

// Start runs sshd on a free loopback port, accepting the given public key lines for the current user (root
// included). It is stopped when the test ends.
func Start(t testing.TB, authorizedKeys ...string) *Server {
	t.Helper()
	Require(t, SSHD)
	dir := t.TempDir()
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatalf("sshd privilege separation directory: %v", err)
	}
	hostKey, hostPub := KeyPair(t, dir, "host_ed25519", "")
	fields := strings.Fields(hostPub)
	s := &Server{
		Port:        FreePort(t),
		Dir:         dir,
		HostKeyFile: hostKey,
		HostKeyLine: fields[0] + " " + fields[1],
		LogFile:     filepath.Join(dir, "sshd.log"),
		t:           t,
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), []byte(strings.Join(authorizedKeys, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.writeConfig()
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) writeConfig() {
	cfg := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
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
`, s.Port, s.HostKeyFile, filepath.Join(s.Dir, "authorized_keys"), filepath.Join(s.Dir, "sshd.pid"))
	if err := os.WriteFile(filepath.Join(s.Dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// Restart starts sshd (again) on the same port with the same keys, and waits until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(SSHD, "-D", "-f", filepath.Join(s.Dir, "sshd_config"), "-E", s.LogFile)
	// A file, not a pipe: per-connection children inherit it, and Wait would block on an open pipe.
	stderr, err := os.OpenFile(filepath.Join(s.Dir, "sshd.stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	// If the test binary dies (a timeout panic skips cleanups), sshd goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start sshd: %v", err)
	}
	s.cmd = cmd
	exited := make(chan struct{})
	s.exited = exited
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "SSH-2.0-") {
				return
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(s.LogFile)
			s.cmd = nil
			errOut, _ := os.ReadFile(stderr.Name())
			s.t.Fatalf("sshd exited: %s %s", errOut, log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("sshd on %s did not answer within 10s: %v", s.Addr(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills sshd and its per-connection children, so that established sessions drop as well.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	pid := s.cmd.Process.Pid
	// Freeze the listener first so that it forks no new child while its children are collected.
	s.cmd.Process.Signal(syscall.SIGSTOP)
	// sshd forks a child per connection; those keep serving after the listener dies unless killed too.
	for _, child := range harness.Descendants(pid) {
		if p, err := os.FindProcess(child); err == nil {
			p.Kill()
		}
	}
	s.cmd.Process.Kill()
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		s.t.Errorf("sshd %d did not exit after SIGKILL", pid)
	}
	s.cmd = nil
}

// Pids returns the pids of the sshd listener and of all its per-connection children.
func (s *Server) Pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return append([]int{s.cmd.Process.Pid}, harness.Descendants(s.cmd.Process.Pid)...)
}

// CPUTime returns the user plus system CPU time a process has used so far, from /proc.
func CPUTime(pid int) time.Duration {
	p, _ := harness.Process(pid)
	return p.CPU
}

// Log returns sshd's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.LogFile)
	return string(b)
}

// Agent runs ssh-agent on a socket in a temporary directory, loads the given private keys with ssh-add, and
// returns the socket path. It is killed when the test ends.
func Agent(t testing.TB, keys ...string) string {
	t.Helper()
	Require(t, "ssh-agent", "ssh-add")
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cmd := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ssh-agent: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ssh-agent socket %s did not appear", sock)
		}
		time.Sleep(20 * time.Millisecond)
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
