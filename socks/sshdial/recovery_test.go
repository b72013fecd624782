package sshdial

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
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
		for _, want := range []string{cfg.Destination, "--retry-first"} {
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
			AgentSocket: "none", ConnectTimeout: 5 * time.Second, RetryFirst: true, AcceptNew: true}
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
		t.Setenv("HOME", home)
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

// A name that does not resolve before any connection was up is a start-up mistake too (checked without
// sending a query anywhere).
func TestStartMistakeUnknownHost(t *testing.T) {
	d := &Dialer{plan: &plan{hops: []endpoint{{hostName: "bastion.invalid", port: 22, user: "u"}}}}
	notFound := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "bastion.invalid", IsNotFound: true}}
	if err := d.startMistake(notFound); err == nil || !strings.Contains(err.Error(), "--retry-first") {
		t.Fatalf("startMistake(no such host) = %v, want a StartError", err)
	}
	timeout := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	if err := d.startMistake(timeout); err != nil {
		t.Fatalf("startMistake(timeout) = %v, want nil: a server that does not answer yet may come", err)
	}
	d.plan.retryFirst = true
	if err := d.startMistake(notFound); err != nil {
		t.Fatalf("startMistake with RetryFirst = %v, want nil", err)
	}
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
