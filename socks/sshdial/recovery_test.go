//go:build integration

package sshdial

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// waitDown waits until the dialer has noticed that its connection is gone.
func waitDown(t *testing.T, d *Dialer) {
	t.Helper()
	harness.EventuallyTrue(t, 15*time.Second, "the dialer to notice the SSH connection is down", func() bool { return d.Ready() != nil })
}

// session returns the session of the dialer's first slot, or nil.
func (d *Dialer) firstSession() *session {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.slots[0].sess
}

// fetch sends one HTTP GET over c and returns the body.
func fetch(t *testing.T, c net.Conn, path string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// After sshd was down long enough for the background backoff to reach several seconds, the first dial made
// once it is back connects at once: it starts an attempt of its own instead of waiting for the next
// background one (autossh users expect the proxy usable within a second of the server's return).
func TestFirstDialAfterLongOutage(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	cfg := f.config()
	cfg.ConnectTimeout = 10 * time.Second
	// Background attempts come after 2-4s, 4-8s, 8-16s, 16-32s: 20s into the outage the next one is at
	// least 4s away, and likely more than 8s.
	cfg.MinBackoff, cfg.MaxBackoff = 4*time.Second, time.Minute
	d, done := start(t, cfg)
	waitReady(t, d, done)
	get(t, d, be, "/before")

	f.sshd.Stop()
	waitDown(t, d)
	time.Sleep(20 * time.Second)
	f.sshd.Restart()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", be)
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("first dial after sshd returned: %v (after %s)", err, took)
	}
	defer c.Close()
	// One SSH handshake on loopback takes tens of milliseconds; 2s leaves room for a loaded machine.
	if took > 2*time.Second {
		t.Fatalf("first dial after sshd returned took %s, want under 2s (a connection attempt at once)", took)
	}
	if got := fetch(t, c, "/after"); got != "hello from backend /after" {
		t.Fatalf("body %q", got)
	}
	t.Logf("first dial after a 20s outage connected in %s", took.Round(time.Millisecond))
}

// Dials that wait for a connection start an attempt at once, whatever the backoff, and share it: fifty
// waiting dials against a server that never answers make one connection attempt, not fifty.
func TestWaitingDialsShareOneAttempt(t *testing.T) {
	// A server that accepts TCP connections and never says a word: each attempt hangs in the handshake
	// until the connect timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	var held sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			held.Add(1)
			go func() { defer held.Done(); <-stop; c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); close(stop); held.Wait() })

	dir := t.TempDir()
	key, _ := harness.SSHKeyPair(t, dir, "id_client", "")
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, nil, 0o600)
	cfg := Config{
		Destination: ln.Addr().String(), IdentityFiles: []string{key}, ConfigFile: "none", KnownHostsFile: kh,
		AgentSocket: "none", ConnectTimeout: 2 * time.Second, RetryFirst: true,
		MinBackoff: time.Hour, MaxBackoff: time.Hour, // the background would not try again within the test
	}
	d, _ := start(t, cfg)
	// The first attempt times out in the handshake; the background then waits an hour.
	harness.EventuallyTrue(t, 10*time.Second, "the first attempt to time out", func() bool {
		err := d.Ready()
		return err != nil && strings.Contains(err.Error(), "no answer within")
	})
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connection attempts before the dials, want 1", n)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 50)
	t0 := time.Now()
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			_, err := d.DialContext(ctx, "tcp", "127.0.0.1:80")
			errs <- err
		}()
	}
	harness.EventuallyTrue(t, time.Second, "a connection attempt made for the waiting dials", func() bool { return accepted.Load() == 2 })
	t.Logf("waiting dials started an attempt %s after they began", time.Since(t0).Round(time.Millisecond))
	wg.Wait()
	close(errs)
	if n := accepted.Load(); n != 2 {
		t.Fatalf("50 waiting dials made %d connection attempts, want 1", n-1)
	}
	for err := range errs {
		var se *ServerError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "SSH server ") {
			t.Fatalf("dial while the server does not answer: %v, want a ServerError naming the SSH server", err)
		}
	}
}

// Start-up mistakes end Run at once instead of retrying for ever: a refused first connection (unless
// RetryFirst), and no identity at all.
func TestStartMistakesEndRun(t *testing.T) {
	t.Run("refused first connection", func(t *testing.T) {
		f := newFixture(t)
		cfg := f.config()
		cfg.Destination = harness.ClosedAddr(t)
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		t0 := time.Now()
		err = d.Run(ctx)
		var se *StartError
		if !errors.As(err, &se) || !errors.Is(err, syscall.ECONNREFUSED) || time.Since(t0) > 5*time.Second {
			t.Fatalf("Run = %v after %s, want a StartError (connection refused) at once", err, time.Since(t0))
		}
		for _, want := range []string{cfg.Destination, "RetryFirst"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not name %q: %v", want, err)
			}
		}
	})

	t.Run("retry-first waits for the server", func(t *testing.T) {
		dir := t.TempDir()
		key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
		addr := harness.ClosedAddr(t)
		kh := filepath.Join(dir, "known_hosts")
		os.WriteFile(kh, nil, 0o600)
		cfg := Config{Destination: addr, IdentityFiles: []string{key}, ConfigFile: "none", KnownHostsFile: kh,
			AgentSocket: "none", ConnectTimeout: 5 * time.Second, RetryFirst: true, AcceptNew: true, MaxBackoff: time.Second}
		d, done := start(t, cfg)
		select {
		case err := <-done:
			t.Fatalf("Run returned %v with RetryFirst", err)
		case <-time.After(3 * time.Second):
		}
		harness.StartSSHDWith(t, harness.SSHDOptions{Addr: addr}, pub)
		waitReady(t, d, done)
		get(t, d, backend(t), "/")
	})

	t.Run("refused after a connection was up is retried", func(t *testing.T) {
		f := newFixture(t)
		d, done := start(t, f.config())
		waitReady(t, d, done)
		f.sshd.Stop()
		select {
		case err := <-done:
			t.Fatalf("Run returned %v when sshd went away after a connection was up", err)
		case <-time.After(3 * time.Second):
		}
		f.sshd.Restart()
		waitReady(t, d, done)
	})

	t.Run("no identity at all", func(t *testing.T) {
		f := newFixture(t)
		home := t.TempDir()
		setHome(t, home)
		t.Setenv("SSH_AUTH_SOCK", "")
		cfg := f.config()
		cfg.IdentityFiles, cfg.AgentSocket = nil, ""
		_, err := New(cfg)
		var ni *NoIdentityError
		if !errors.As(err, &ni) {
			t.Fatalf("New = %v, want NoIdentityError", err)
		}
		for _, want := range []string{"no -i", "SSH_AUTH_SOCK", filepath.Join(home, ".ssh", "id_ed25519"), "ssh-add"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not say %q: %v", want, err)
			}
		}
		// An agent without keys is no identity either.
		t.Setenv("SSH_AUTH_SOCK", harness.SSHAgent(t))
		if _, err := New(cfg); !errors.As(err, &ni) || !strings.Contains(err.Error(), "no key in the ssh-agent") {
			t.Fatalf("New with an empty agent = %v, want NoIdentityError naming the agent", err)
		}
	})
}

// freezeSessions stops (SIGSTOP) every sshd process that serves an established connection, leaving the
// listener free to accept new ones; they are killed with sshd when the test ends. For each connection
// OpenSSH forks a process that holds its socket: stopped, the connection stays open (the kernel still
// acknowledges) but nothing answers, as with a server that hangs or a path that black-holes.
func freezeSessions(t *testing.T, srv *harness.SSHD) {
	t.Helper()
	pids := srv.Pids()
	var stopped []int
	for _, pid := range pids[min(1, len(pids)):] {
		// A child listed a moment ago may have exited since (sshd's child for a probe connection that
		// closed): only the processes still there serve the dialer's connection.
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue
			}
			t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
		stopped = append(stopped, pid)
	}
	t.Cleanup(func() {
		for _, pid := range stopped {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if len(stopped) == 0 {
		t.Fatalf("no sshd process serves a connection (pids %v)", pids)
	}
}

// A frozen server (its session process stopped) is noticed: a dial that would wait on it moves to a fresh
// connection within dialProbeAfter + the keepalive interval (6s by default), and with no dial at all the
// keepalives drop it within ServerAliveInterval × (ServerAliveCountMax+1) (20s by default).
func TestFrozenServer(t *testing.T) {
	t.Run("a dial moves to a fresh connection", func(t *testing.T) {
		f := newFixture(t)
		be := backend(t)
		d, done := start(t, f.config()) // default keepalives
		waitReady(t, d, done)
		get(t, d, be, "/before")
		frozen := d.firstSession()
		freezeSessions(t, f.sshd)

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		c, err := d.DialContext(ctx, "tcp", be)
		took := time.Since(t0)
		if err != nil {
			t.Fatalf("dial on a frozen server: %v after %s", err, took)
		}
		defer c.Close()
		bound := dialProbeAfter + defaultAliveInterval
		if took > bound+3*time.Second {
			t.Fatalf("dial on a frozen server took %s, want about %s", took, bound)
		}
		if sessionOf(t, c) == frozen {
			t.Fatal("the dial went over the frozen connection")
		}
		if got := fetch(t, c, "/after"); got != "hello from backend /after" {
			t.Fatalf("body %q", got)
		}
		t.Logf("dial on a frozen server connected in %s (bound %s)", took.Round(time.Millisecond), bound)
	})

	t.Run("keepalives drop it", func(t *testing.T) {
		f := newFixture(t)
		d, done := start(t, f.config()) // default keepalives
		waitReady(t, d, done)
		if bound := d.plan.aliveInterval * time.Duration(d.plan.aliveCountMax+1); bound != 20*time.Second {
			t.Fatalf("default keepalive bound %s, want the 20s the README promises", bound)
		}
		frozen := d.firstSession()
		freezeSessions(t, f.sshd)
		t0 := time.Now()
		harness.EventuallyTrue(t, 25*time.Second, "the frozen connection to be replaced", func() bool {
			s := d.firstSession()
			return s != nil && s != frozen
		})
		took := time.Since(t0)
		// Between CountMax and CountMax+1 intervals of silence, and a reconnect.
		if took < 2*defaultAliveInterval || took > 20*time.Second+3*time.Second {
			t.Fatalf("frozen connection replaced after %s, want %s to 20s", took, 2*defaultAliveInterval)
		}
		t.Logf("frozen connection dropped and replaced after %s", took.Round(time.Millisecond))
	})
}

// A failed dial names the hop that failed: the destination as the SSH server reports it (refused, or
// forbidden by sshd's PermitOpen), or the SSH server itself when it is down.
func TestDialErrorsNameTheHop(t *testing.T) {
	f := newFixture(t)
	allowed := backend(t)
	closed := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	conf, err := os.OpenFile(filepath.Join(f.sshd.Dir, "sshd_config"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conf, "PermitOpen %s %s\n", allowed, closed)
	conf.Close()
	f.sshd.Restart()
	cfg := f.config()
	cfg.ConnectTimeout = 2 * time.Second
	d, done := start(t, cfg)
	waitReady(t, d, done)
	get(t, d, allowed, "/")
	server := "SSH server root@" + f.sshd.Addr()
	ctx := context.Background()

	for _, c := range []struct {
		addr   string
		errno  syscall.Errno
		reason string
	}{
		{closed, syscall.ECONNREFUSED, "connect failed (Connection refused)"},
		{"127.0.0.1:2", syscall.EACCES, "administratively prohibited"},
	} {
		_, err := d.DialContext(ctx, "tcp", c.addr)
		var te *TargetError
		if !errors.As(err, &te) || !errors.Is(err, c.errno) || te.ReportedBy() != server {
			t.Fatalf("dial %s: %v, want a TargetError (%v) reported by %s", c.addr, err, c.errno, server)
		}
		if want := server + " could not open " + c.addr + ": " + c.reason; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("dial %s: %q, want %q", c.addr, err, want)
		}
		if _, ok := err.(interface{ Hop() string }); ok {
			t.Errorf("dial %s: a refusal by the destination blames the SSH hop", c.addr)
		}
	}

	f.sshd.Stop()
	waitDown(t, d)
	_, err = d.DialContext(ctx, "tcp", allowed)
	var se *ServerError
	if !errors.As(err, &se) || se.Hop() != server || !strings.HasPrefix(err.Error(), server+" is unreachable: ") {
		t.Fatalf("dial with sshd down: %v, want a ServerError naming %s", err, server)
	}
	var te *TargetError
	if errors.As(err, &te) {
		t.Fatalf("dial with sshd down blames the destination: %v", err)
	}
}
