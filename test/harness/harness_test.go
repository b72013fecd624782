package harness

import (
	"io"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestProc: a started process is seen in /proc as the test's child with its arguments, logs to its file,
// and is gone after Stop.
func TestProc(t *testing.T) {
	p := Start(t, t.TempDir(), "sh", []string{"HARNESS_WORD=hello"}, "/bin/sh", "-c", `echo "$HARNESS_WORD"; exec sleep 30`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := Process(p.Pid())
		if p.Log() == "hello\n" && slices.Equal(info.Args, []string{"sleep", "30"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log %q, args %q", p.Log(), info.Args)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !slices.Contains(Descendants(os.Getpid()), p.Pid()) {
		t.Error("the process is not among the test's descendants")
	}
	if info, _ := Process(p.Pid()); info.RSSKiB <= 0 {
		t.Errorf("RSS %d KiB", info.RSSKiB)
	}
	_ = p.Stop(syscall.SIGTERM, 30*time.Second)
	if p.Running() {
		t.Fatal("still running after Stop")
	}
	if _, ok := Process(p.Pid()); ok {
		t.Error("still in /proc after Stop")
	}
	if code, ok := p.Wait(time.Second); !ok || code != -1 {
		t.Errorf("Wait: code %d, ok %v; want -1 (killed by a signal)", code, ok)
	}
}

// TestEcho: the echo backend returns what it is sent and counts connections.
func TestEcho(t *testing.T) {
	e := StartEcho(t)
	c, err := net.Dial("tcp", e.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if n := e.Accepted.Load(); n != 1 {
		t.Errorf("accepted %d, want 1", n)
	}
}

// TestFreePortsOutsideEphemeralRange: a chosen port must not be one the kernel could hand to an outgoing
// connection before the program under test binds it, and no port is chosen twice.
func TestFreePortsOutsideEphemeralRange(t *testing.T) {
	lo, hi := portsBelowEphemeral()
	seen := map[int]bool{}
	for range 20 {
		for _, p := range FreePorts(t, 5) {
			if seen[p] {
				t.Errorf("port %d chosen twice", p)
			}
			seen[p] = true
			if hi-lo >= 1000 && (p < lo || p >= hi) {
				t.Errorf("port %d is outside [%d, %d), below the ephemeral range", p, lo, hi)
			}
		}
	}
	// Many outgoing connections at once, as the parallel tests make: none takes a chosen port.
	e := StartEcho(t)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 200 {
		c, err := net.Dial("tcp", e.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if p := c.LocalAddr().(*net.TCPAddr).Port; seen[p] {
			t.Errorf("an outgoing connection took chosen port %d", p)
		}
	}
}
