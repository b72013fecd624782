//go:build integration

package sshdial

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/crypto/ssh"
)

// impostor runs an sshd with a host key of its own that accepts the fixture's client key, so that only the
// host key check stands between konnect and forwarding through it. addr is "" for a free port.
func impostor(t *testing.T, f *fixture, addr string) *harness.SSHD {
	t.Helper()
	pub, err := os.ReadFile(f.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	s := harness.StartSSHDWith(t, harness.SSHDOptions{Addr: addr}, strings.TrimSpace(string(pub)))
	if s.HostKeyLine == f.sshd.HostKeyLine {
		t.Fatal("the impostor has the real server's host key")
	}
	return s
}

// wantChangedKey checks that err is the changed-key refusal for the key that impostor presented.
func wantChangedKey(t *testing.T, err error, impostor *harness.SSHD) {
	t.Helper()
	var hk *HostKeyError
	if !errors.As(err, &hk) || !hk.Changed {
		t.Fatalf("err = %v, want a changed-key HostKeyError", err)
	}
	if fp := ssh.FingerprintSHA256(parsePub(t, impostor.HostKeyLine)); hk.Fingerprint != fp {
		t.Errorf("refused key %s, want the impostor's %s", hk.Fingerprint, fp)
	}
}

// wantNothingThrough checks that the impostor let no client log in and forwarded nothing. (That konnect
// reached it shows in the refused key's fingerprint.)
func wantNothingThrough(t *testing.T, impostor *harness.SSHD) {
	t.Helper()
	log := impostor.Log()
	if strings.Contains(log, "Accepted publickey") || strings.Contains(log, "ctype direct-tcpip") {
		t.Errorf("a client logged in to the impostor; log:\n%s", log)
	}
}

// TestChangedHostKeyRefusedOnEveryConnection checks what --ssh-connections' help and the README promise:
// the host key is checked on every SSH connection, not only the first. A reconnection that finds another
// key on the same address, and a second connection that does, are refused with the changed-key error, Run
// ends, and nothing is forwarded through the server with the other key, which would accept the login.
func TestChangedHostKeyRefusedOnEveryConnection(t *testing.T) {
	t.Run("reconnection", func(t *testing.T) {
		f := newFixture(t)
		echoSrv := harness.StartEcho(t)
		cfg := f.config()
		cfg.ConnectTimeout = 10 * time.Second // the waiting dial below outlasts the impostor's start
		d, done := start(t, cfg)
		waitReady(t, d, done)
		c, err := d.DialContext(context.Background(), "tcp", echoSrv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := echo(c, "before"); err != nil {
			t.Fatal(err)
		}
		c.Close()

		f.sshd.Stop()
		waitDown(t, d)
		// A dial made now waits for the reconnection; the impostor must not get it.
		dialed := make(chan error, 1)
		go func() {
			c, err := d.DialContext(context.Background(), "tcp", echoSrv.Addr)
			if err == nil {
				echo(c, "through the impostor")
				c.Close()
			}
			dialed <- err
		}()
		harness.EventuallyTrue(t, 5*time.Second, "the dial to wait for the reconnection", func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.waiting == 1
		})
		imp := impostor(t, f, f.sshd.Addr())
		select {
		case err := <-dialed:
			var hk *HostKeyError
			if err == nil {
				wantNothingThrough(t, imp)
				t.Fatal("a dial made during the outage went through the impostor")
			} else if !errors.Is(err, ErrStopped) && !errors.As(err, &hk) {
				t.Errorf("the waiting dial: %v, want it ended by the refusal", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting dial did not end within 10s of the impostor's start")
		}
		wantChangedKey(t, waitErr(t, done), imp)
		wantNothingThrough(t, imp)
		if n := echoSrv.Accepted.Load(); n != 1 {
			t.Errorf("the backend accepted %d connections, want only the one before the restart", n)
		}
	})

	t.Run("second connection", func(t *testing.T) {
		f := newFixture(t)
		imp := impostor(t, f, "")
		// The address konnect dials sends its first connection to the real server, the others to the
		// impostor, as a DNS or load balancer change would.
		var n atomic.Int64
		front := harness.Serve(t, func(c net.Conn) {
			to := imp.Addr()
			if n.Add(1) == 1 {
				to = f.sshd.Addr()
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { io.Copy(up, c); up.Close() }()
			io.Copy(c, up)
		})
		cfg := f.config()
		cfg.Destination = front.Addr
		cfg.Connections = 2
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		host, port, _ := net.SplitHostPort(front.Addr)
		line := "[" + host + "]:" + port + " " + f.sshd.HostKeyLine
		if err := os.WriteFile(cfg.KnownHostsFile, []byte(line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		d, done := start(t, cfg)
		var err error
		harness.EventuallyTrue(t, 20*time.Second, "Run to end", func() bool {
			select {
			case err = <-done:
				return true
			default:
			}
			if up, _ := d.Connections(); up == 2 {
				wantNothingThrough(t, imp)
				t.Fatal("both SSH connections are up, the second one to the impostor")
			}
			return false
		})
		wantChangedKey(t, err, imp)
		if !strings.Contains(f.sshd.Log(), "Accepted publickey") {
			t.Errorf("the first connection never logged in to the real server; log:\n%s", f.sshd.Log())
		}
		wantNothingThrough(t, imp)
		if _, err := d.DialContext(context.Background(), "tcp", "127.0.0.1:1"); !errors.Is(err, ErrStopped) {
			t.Errorf("dial after the refusal: %v, want ErrStopped", err)
		}
	})
}
