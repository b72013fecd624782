//go:build integration

package sshdial

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/konnect-dev/konnect/test/harness"
)

// viaCommand is a fixture whose ssh_config entry "pc" has a HostName:Port where nothing listens, so that only
// its ProxyCommand reaches the real sshd.
func (f *fixture) viaCommand(t *testing.T, command string) Config {
	t.Helper()
	return f.viaCommandWith(t, command, "")
}

// viaCommandWith is viaCommand with more lines (each ending with a newline) in the entry.
func (f *fixture) viaCommandWith(t *testing.T, command, more string) Config {
	t.Helper()
	dead := harness.ClosedAddr(t)
	host, port, _ := net.SplitHostPort(dead)
	cfgFile := writeSSHConfig(t, fmt.Sprintf("Host pc\n  HostName %s\n  Port %s\n  User %s\n  ProxyCommand %s\n%s", host, port, localUser(), command, more))
	// Host keys are checked under HostName:Port, as OpenSSH checks them behind a ProxyCommand.
	if err := os.WriteFile(f.knownHosts, []byte(fmt.Sprintf("[%s]:%s %s\n", host, port, f.sshd.HostKeyLine)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := f.config()
	cfg.Destination, cfg.ConfigFile = "pc", cfgFile
	return cfg
}

// netcatCommand is the test binary as a ProxyCommand to addr (see testNetcat), logging to log.
func netcatCommand(t *testing.T, log, addr string, extra string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("env SSHDIAL_TEST_NETCAT=%s %s %s %s %s", log, self, host, port, extra)
}

// netcatRuns reads the pids and arguments that testNetcat logged, one per run.
func netcatRuns(t *testing.T, log string) (pids []int, args []string) {
	t.Helper()
	data, _ := os.ReadFile(log)
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		pid, rest, _ := strings.Cut(line, " ")
		n, err := strconv.Atoi(pid)
		if err != nil {
			t.Fatalf("netcat log line %q", line)
		}
		pids, args = append(pids, n), append(args, rest)
	}
	return pids, args
}

// gone reports whether pid has exited and been reaped: a zombie still has its /proc entry.
func gone(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return errors.Is(err, os.ErrNotExist)
}

// A ProxyCommand is run with the user's shell and its stdio carries the SSH connection; its tokens are
// expanded; each reconnect runs a new command and the old one is reaped; when Run ends the command is
// killed (this one ignores SIGHUP and its stdin's end) and reaped before Run returns.
func TestProxyCommandPlain(t *testing.T) {
	f := newFixture(t)
	log := filepath.Join(f.dir, "netcat.log")
	cfg := f.viaCommand(t, netcatCommand(t, log, f.sshd.Addr(), "%h %p %r %n %%"))
	_, deadPort, _ := net.SplitHostPort(func() string { p, _ := resolve(cfg); return p.hops[0].addr() }())
	be := backend(t)

	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitReady(t, d, done)
	if got := get(t, d, be, "/pc"); got != "hello from backend /pc" {
		t.Fatalf("body = %q", got)
	}
	pids, args := netcatRuns(t, log)
	if len(pids) != 1 {
		t.Fatalf("ProxyCommand ran %d times, want 1: %v", len(pids), args)
	}
	if want := fmt.Sprintf("127.0.0.1 %s %s pc %%", deadPort, localUser()); !strings.HasSuffix(args[0], want) {
		t.Fatalf("ProxyCommand arguments %q, want them to end with %q", args[0], want)
	}

	// The command dies: the connection is lost, a new command carries the next one, the old one is reaped.
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := harness.Poll("a second ProxyCommand and a connection through it", 20*time.Second, 50*time.Millisecond, func() error {
		if p, _ := netcatRuns(t, log); len(p) < 2 {
			return fmt.Errorf("%d runs", len(p))
		}
		return d.Ready()
	}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, d, be, "/again"); got != "hello from backend /again" {
		t.Fatalf("body = %q", got)
	}
	if err := harness.Poll("the killed ProxyCommand reaped", 5*time.Second, 20*time.Millisecond, func() error {
		if !gone(pids[0]) {
			return fmt.Errorf("pid %d still has a /proc entry", pids[0])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	pids, _ = netcatRuns(t, log)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel")
	}
	for _, pid := range pids {
		if !gone(pid) {
			t.Errorf("ProxyCommand pid %d left behind (running or a zombie) after Run returned", pid)
		}
	}
}

// ProxyCommand ssh -W through a jump sshd, with the real OpenSSH client.
func TestProxyCommandSSHW(t *testing.T) {
	harness.RequireSSH(t, "ssh")
	f := newFixture(t)
	jump := harness.StartSSHD(t, mustRead(t, f.key+".pub"))
	jumpKnown := filepath.Join(f.dir, "jump_known_hosts")
	if err := os.WriteFile(jumpKnown, []byte(jump.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("ssh -F none -i %s -o IdentitiesOnly=yes -o IdentityAgent=none -o BatchMode=yes -o UserKnownHostsFile=%s "+
		"-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -l %%r -p %d -W %%h:%d %s",
		f.key, jumpKnown, jump.Port, f.sshd.Port, jump.Host)
	cfg := f.viaCommand(t, cmd)
	d, done := start(t, cfg)
	waitReady(t, d, done)
	if got := get(t, d, backend(t), "/w"); got != "hello from backend /w" {
		t.Fatalf("body = %q", got)
	}
	if !strings.Contains(jump.Log(), "Accepted publickey") {
		t.Fatalf("the jump sshd saw no login:\n%s", jump.Log())
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A ProxyCommand that exits at once ends Run at start-up with an error that names it, its exit status and
// the end of its stderr.
func TestProxyCommandExitsAtOnce(t *testing.T) {
	f := newFixture(t)
	cfg := f.viaCommand(t, `sh -c 'echo "bastion says no" >&2; exit 3'`)
	var mu sync.Mutex
	var logged []string
	cfg.Log = funcr.New(func(prefix, args string) { mu.Lock(); logged = append(logged, args); mu.Unlock() }, funcr.Options{})
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	err = d.Run(ctx)
	if err == nil || time.Since(t0) > 10*time.Second {
		t.Fatalf("Run = %v after %s, want an error at once", err, time.Since(t0))
	}
	t.Log(err)
	for _, want := range []string{"ProxyCommand", "exit status 3", "bastion says no"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	// Its stderr lines are logged as they come, as ssh shows them.
	mu.Lock()
	defer mu.Unlock()
	if log := strings.Join(logged, "\n"); !strings.Contains(log, `"ProxyCommand stderr"`) || !strings.Contains(log, "bastion says no") {
		t.Errorf("the command's stderr was not logged: %s", log)
	}
}

// A ProxyCommand that connects to something other than an SSH server ends Run at start-up with an error
// naming the command and what answered.
func TestProxyCommandNotSSH(t *testing.T) {
	f := newFixture(t)
	addr, _ := notSSH(t, "http")
	cfg := f.viaCommand(t, netcatCommand(t, filepath.Join(f.dir, "netcat.log"), addr, ""))
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = d.Run(ctx)
	for _, w := range []string{"ProxyCommand", "is not an SSH server", "HTTP/1.1 400"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Run = %v, want an error saying %q", err, w)
		}
	}
}

// With -J, the first jump host is reached through its own ProxyCommand, as ssh -J reaches it.
func TestProxyCommandOfFirstJumpHost(t *testing.T) {
	f := newFixture(t)
	jump := harness.StartSSHD(t, mustRead(t, f.key+".pub"))
	log := filepath.Join(f.dir, "netcat.log")
	dead := harness.ClosedAddr(t)
	host, port, _ := net.SplitHostPort(dead)
	cfgFile := writeSSHConfig(t, fmt.Sprintf("Host jumppc\n  HostName %s\n  Port %s\n  User %s\n  ProxyCommand %s\n",
		host, port, localUser(), netcatCommand(t, log, jump.Addr(), "%n")))
	known := fmt.Sprintf("[%s]:%s %s\n%s\n", host, port, jump.HostKeyLine, f.sshd.KnownHostsLine())
	if err := os.WriteFile(f.knownHosts, []byte(known), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := f.config()
	cfg.ConfigFile, cfg.JumpHosts = cfgFile, []string{"jumppc"}
	d, done := start(t, cfg)
	waitReady(t, d, done)
	if got := get(t, d, backend(t), "/j"); got != "hello from backend /j" {
		t.Fatalf("body = %q", got)
	}
	if _, args := netcatRuns(t, log); len(args) != 1 || !strings.HasSuffix(args[0], " jumppc") {
		t.Fatalf("ProxyCommand runs %q, want one for jumppc", args)
	}
	if !strings.Contains(jump.Log(), "Accepted publickey") {
		t.Fatalf("the jump sshd saw no login:\n%s", jump.Log())
	}
}
