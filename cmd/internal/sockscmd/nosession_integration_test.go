//go:build integration

package sockscmd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/proxy"
)

// TestSocksOpensNoSession checks what -N's help and the README promise: konnect never runs a remote
// command, it only forwards. sshd runs a marker-writing ForceCommand for any session that asks for a
// command or shell, and at LogLevel DEBUG1 it logs the type of every channel a client opens: after traffic
// went through the proxy, the log must show direct-tcpip channels and no session channel, and the marker
// must be absent. OpenSSH's own `ssh host true` against the same sshd then shows that both would have
// seen a session.
func TestSocksOpensNoSession(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "remote-command-ran")
	// Keepalives every 100ms, so that they too are among what sshd sees.
	e := startEnv(t, func(o *Options) { o.SSH.ServerAliveInterval = 100 * time.Millisecond }, "ForceCommand touch "+marker)
	echoSrv := harness.StartEcho(t)

	d, err := proxy.SOCKS5("tcp", e.proxy.SOCKSAddr().String(), nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c, err := d.Dial("tcp", echoSrv.Addr)
		if err != nil {
			t.Fatalf("dial %d through konnect socks: %v", i, err)
		}
		line := fmt.Sprint("forwarded ", i)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = fmt.Fprintln(c, line)
		buf := make([]byte, len(line)+1)
		if err == nil {
			_, err = io.ReadFull(c, buf)
		}
		c.Close()
		if err != nil || string(buf) != line+"\n" {
			t.Fatalf("echo %d through konnect socks: %v, got %q", i, err, buf)
		}
	}
	if n := echoSrv.Accepted.Load(); n != 3 {
		t.Fatalf("the backend accepted %d connections, want 3", n)
	}

	const forward, session = "ctype direct-tcpip", "ctype session"
	harness.EventuallyTrue(t, 5*time.Second, "sshd to log the forwarded channels and a keepalive", func() bool {
		log := e.sshd.Log()
		return strings.Count(log, forward) == 3 && strings.Contains(log, "rtype keepalive@openssh.com")
	})
	if strings.Contains(e.sshd.Log(), session) {
		t.Errorf("konnect opened a session channel; sshd log:\n%s", e.sshd.Log())
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ForceCommand ran (stat %s: %v): konnect ran a remote command", marker, err)
	}
	if t.Failed() {
		return
	}

	// The control: a client that does run a command is seen by both checks.
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ssh", "-F", "none", "-i", e.key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "UserKnownHostsFile="+e.knownHosts, "-o", "GlobalKnownHostsFile=/dev/null", "-p", strconv.Itoa(e.sshd.Port),
		"-l", u.Username, e.sshd.Host, "true").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh host true: %v: %s", err, out)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the ForceCommand did not run for ssh host true, so it proves nothing: %v", err)
	}
	if !strings.Contains(e.sshd.Log(), session) {
		t.Errorf("sshd did not log %q for ssh host true, so its absence proves nothing; log:\n%s", session, e.sshd.Log())
	}
}
