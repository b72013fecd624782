//go:build integration

package sshdial

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fdpassScript is a ProxyCommand for ProxyUseFdpass yes, as OpenSSH's users write them: it appends its pid
// to its first argument, connects to the second and third, passes the connected socket back over its stdout
// with SCM_RIGHTS and exits; with "stay" as the fourth it stays instead of exiting.
const fdpassScript = `import os, socket, sys, time
log, host, port, mode = sys.argv[1:5]
with open(log, "a") as f:
    f.write("%d\n" % os.getpid())
s = socket.create_connection((host, int(port)))
socket.send_fds(socket.socket(fileno=1), [b"\0"], [s.fileno()])
if mode == "stay":
    time.sleep(60)
`

// fdpassCommand is python3 running fdpassScript to addr, logging its pid to log.
func fdpassCommand(t *testing.T, dir, log, addr, mode string) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not found")
	}
	script := filepath.Join(dir, "fdpass.py")
	if err := os.WriteFile(script, []byte(fdpassScript), 0o600); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("python3 %s %s %s %s %s", script, log, host, port, mode)
}

// fdpassPids are the pids fdpassScript logged, one per run.
func fdpassPids(t *testing.T, log string) []int {
	t.Helper()
	data, _ := os.ReadFile(log)
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("fdpass log %q", data)
		}
		pids = append(pids, pid)
	}
	return pids
}

// With ProxyUseFdpass yes, the socket the ProxyCommand passes back over its stdout is the SSH connection, as
// with OpenSSH: the command has exited and been reaped before the SSH connection is up, and the session
// carries connections to a loopback server.
func TestProxyUseFdpass(t *testing.T) {
	f := newFixture(t)
	log := filepath.Join(f.dir, "fdpass.log")
	cfg := f.viaCommandWith(t, fdpassCommand(t, f.dir, log, f.sshd.Addr(), "pass"), "  ProxyUseFdpass yes\n")
	d, done := start(t, cfg)
	waitReady(t, d, done)
	be := backend(t)
	for _, path := range []string{"/fd", "/again"} {
		if got := get(t, d, be, path); got != "hello from backend "+path {
			t.Fatalf("body = %q", got)
		}
	}
	pids := fdpassPids(t, log)
	if len(pids) != 1 {
		t.Fatalf("ProxyCommand ran %d times, want 1", len(pids))
	}
	if !gone(pids[0]) {
		t.Errorf("ProxyCommand pid %d is still there (running or a zombie) with the connection up", pids[0])
	}
	if !strings.Contains(f.sshd.Log(), "Accepted publickey") {
		t.Fatalf("sshd saw no login:\n%s", f.sshd.Log())
	}
}

// A ProxyUseFdpass command that exits without passing a socket ends Run at start-up with an error that names
// ProxyUseFdpass, the command, its exit status and the end of its stderr.
func TestProxyUseFdpassNoSocket(t *testing.T) {
	f := newFixture(t)
	cfg := f.viaCommandWith(t, `sh -c 'echo "no socket here" >&2; exit 3'`, "  ProxyUseFdpass yes\n")
	err := runFails(t, cfg, 20*time.Second)
	for _, want := range []string{"ProxyUseFdpass yes", strconv.Quote(`sh -c 'echo "no socket here" >&2; exit 3'`), "passed back no connection", "exit status 3", "no socket here"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
}

// A ProxyUseFdpass command that talks SSH through its stdout rather than passing a socket (a plain
// ProxyCommand by mistake) ends Run at start-up with an error saying what it wrote; it is killed and reaped
// (this one ignores SIGHUP and its stdin's end).
func TestProxyUseFdpassStdioCommand(t *testing.T) {
	f := newFixture(t)
	log := filepath.Join(f.dir, "netcat.log")
	cfg := f.viaCommandWith(t, netcatCommand(t, log, f.sshd.Addr(), ""), "  ProxyUseFdpass yes\n")
	err := runFails(t, cfg, 20*time.Second)
	for _, want := range []string{"ProxyUseFdpass yes", "SSHDIAL_TEST_NETCAT", `wrote to its stdout "S", not a descriptor`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	pids, _ := netcatRuns(t, log)
	for _, pid := range pids {
		if !gone(pid) {
			t.Errorf("ProxyCommand pid %d left behind (running or a zombie) after Run returned", pid)
		}
	}
}

// A ProxyUseFdpass command that passes a socket and does not exit, which ssh would wait for without end, is
// killed and reaped when the connect timeout ends, with an error that says so.
func TestProxyUseFdpassCommandStays(t *testing.T) {
	f := newFixture(t)
	log := filepath.Join(f.dir, "fdpass.log")
	cfg := f.viaCommandWith(t, fdpassCommand(t, f.dir, log, f.sshd.Addr(), "stay"), "  ProxyUseFdpass yes\n")
	// Long enough for python3 to start on a busy machine; a run that does not connect in time is retried.
	cfg.ConnectTimeout = 3 * time.Second
	err := runFails(t, cfg, 40*time.Second)
	for _, want := range []string{"ProxyUseFdpass yes", "fdpass.py", "passed back a connection but did not exit", "killed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	pids := fdpassPids(t, log)
	if len(pids) == 0 {
		t.Fatal("the ProxyCommand never ran")
	}
	for _, pid := range pids {
		if !gone(pid) {
			t.Errorf("ProxyCommand pid %d left behind (running or a zombie) after Run returned", pid)
		}
	}
}

// runFails runs a Dialer of cfg, which must end with an error of its own within limit, and returns it.
func runFails(t *testing.T, cfg Config, limit time.Duration) error {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	err = d.Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run = %v, want an error before the test's deadline", err)
	}
	t.Log(err)
	return err
}
