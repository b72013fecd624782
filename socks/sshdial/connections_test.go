//go:build integration

package sshdial

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// echo sends one line on c and reads it back, within 5s.
func echo(c net.Conn, line string) error {
	if _, err := fmt.Fprintln(c, line); err != nil {
		return err
	}
	type result struct {
		s   string
		err error
	}
	got := make(chan result, 1)
	go func() {
		s, err := bufio.NewReader(c).ReadString('\n')
		got <- result{s, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			return r.err
		}
		if strings.TrimSpace(r.s) != line {
			return fmt.Errorf("echo %q, got %q", line, r.s)
		}
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("no echo of %q within 5s", line)
	}
}

func waitConnections(t *testing.T, d *Dialer, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		up, total := d.Connections()
		if up == want && total == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d SSH connections up after 20s, want %d: %v", up, total, want, d.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sessionOf(t *testing.T, c net.Conn) *session {
	t.Helper()
	cc, ok := c.(*countedConn)
	if !ok {
		t.Fatalf("dialled connection is a %T, not counted", c)
	}
	return cc.s
}

// killServerSide SIGKILLs the sshd processes that hold the server end of the TCP connection whose client end
// is local, so that this one SSH connection dies as it would if its sshd crashed.
func killServerSide(t *testing.T, pids []int, local net.Addr) {
	t.Helper()
	port := local.(*net.TCPAddr).Port
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	// The server end's remote address is our local one: 127.0.0.1 is 0100007F, the port is hex. Only an
	// established socket (state 01) counts: an earlier connection from the same port may linger in
	// TIME_WAIT, which no process holds (inode 0).
	remote := fmt.Sprintf("0100007F:%04X", port)
	inode := ""
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && f[2] == remote && f[3] == "01" && f[9] != "0" {
			inode = f[9]
		}
	}
	if inode == "" {
		t.Fatalf("no server-side socket for client port %d in /proc/net/tcp", port)
	}
	killed := 0
	for _, pid := range pids[1:] { // not the listener
		fds, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name())); l == "socket:["+inode+"]" {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed++
				break
			}
		}
	}
	if killed == 0 {
		t.Fatalf("no sshd process holds socket %s", inode)
	}
}

// TestConnectionsSpreadAndSurvive runs three SSH connections to a real sshd: dials spread evenly over them,
// killing the sshd of one breaks only the streams it carried, and that connection comes back on its own and
// takes the next dials.
func TestConnectionsSpreadAndSurvive(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Connections = 3
	d, _ := start(t, cfg)
	waitConnections(t, d, 3)
	target := harness.StartEcho(t).Addr

	var conns []net.Conn
	perSession := map[*session][]net.Conn{}
	for i := range 6 {
		c, err := d.DialContext(context.Background(), "tcp", target)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		if err := echo(c, fmt.Sprint("hello ", i)); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		conns = append(conns, c)
		s := sessionOf(t, c)
		perSession[s] = append(perSession[s], c)
	}
	if len(perSession) != 3 {
		t.Fatalf("6 streams went over %d SSH connections, want 3", len(perSession))
	}
	for s, cs := range perSession {
		if len(cs) != 2 || s.open.Load() != 2 {
			t.Fatalf("an SSH connection carries %d streams (counted %d), want 2 each", len(cs), s.open.Load())
		}
	}

	victim := sessionOf(t, conns[0])
	killServerSide(t, f.sshd.Pids(), victim.client.LocalAddr())
	for i, c := range conns {
		err := echo(c, fmt.Sprint("again ", i))
		if sessionOf(t, c) == victim {
			if err == nil {
				t.Errorf("stream %d on the killed SSH connection still works", i)
			}
			continue
		}
		if err != nil {
			t.Errorf("stream %d on a healthy SSH connection broke: %v", i, err)
		}
	}

	// The lost connection reconnects on its own; the others were never down.
	deadline := time.Now().Add(20 * time.Second)
	for {
		d.mu.Lock()
		replaced := d.live == 3
		for _, sl := range d.slots {
			replaced = replaced && sl.sess != victim
		}
		d.mu.Unlock()
		if replaced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed SSH connection was not replaced within 20s: %v", d.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, err := d.DialContext(context.Background(), "tcp", target)
	if err != nil {
		t.Fatalf("dial after reconnect: %v", err)
	}
	defer c.Close()
	if err := echo(c, "after reconnect"); err != nil {
		t.Fatal(err)
	}
	if s := sessionOf(t, c); perSession[s] != nil {
		t.Errorf("the dial after reconnect went to a connection with %d streams, not the new empty one", s.open.Load())
	}
	for i, c := range conns {
		if sessionOf(t, c) != victim {
			if err := echo(c, fmt.Sprint("still ", i)); err != nil {
				t.Errorf("stream %d: %v", i, err)
			}
		}
	}
}

// TestConnectionsClosedStreamsAreUncounted checks that closing dialled connections gives their SSH
// connection back its share, so that the spread follows the live load and not the history.
func TestConnectionsClosedStreamsAreUncounted(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Connections = 2
	d, _ := start(t, cfg)
	waitConnections(t, d, 2)
	target := harness.StartEcho(t).Addr
	dial := func() net.Conn {
		c, err := d.DialContext(context.Background(), "tcp", target)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	if sessionOf(t, a) == sessionOf(t, b) {
		t.Fatal("two dials went to the same SSH connection while the other was idle")
	}
	busy := sessionOf(t, b)
	a.Close()
	a.Close() // closing twice counts once
	c := dial()
	defer c.Close()
	defer b.Close()
	if sessionOf(t, c) == busy {
		t.Errorf("a dial went to the SSH connection carrying a stream while the other carried none")
	}
	if n := busy.open.Load(); n != 1 {
		t.Errorf("busy connection counts %d streams, want 1", n)
	}
}

// TestConnectionsReconnectAfterSSHDRestart checks that when sshd restarts and every connection is lost,
// each one reconnects on its own.
func TestConnectionsReconnectAfterSSHDRestart(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Connections = 2
	d, _ := start(t, cfg)
	waitConnections(t, d, 2)
	sessions := func() map[*session]bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		m := map[*session]bool{}
		for _, sl := range d.slots {
			if sl.sess != nil {
				m[sl.sess] = true
			}
		}
		return m
	}
	before := sessions()
	f.sshd.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for {
		now := sessions()
		fresh := 0
		for s := range now {
			if !before[s] {
				fresh++
			}
		}
		if fresh == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 SSH connections re-established after an sshd restart", fresh)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := get(t, d, backend(t), "/x"); got != "hello from backend /x" {
		t.Fatalf("after reconnect: %q", got)
	}
}
