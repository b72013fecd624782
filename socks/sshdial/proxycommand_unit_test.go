package sshdial

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

func writeSSHConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExpandProxyCommand(t *testing.T) {
	e := endpoint{alias: "pc", hostName: "10.1.2.3", port: 2222, user: "alice"}
	got, err := expandProxyCommand("nc %h %p # %r@%n 100%%", e)
	if err != nil {
		t.Fatal(err)
	}
	if want := "nc 10.1.2.3 2222 # alice@pc 100%"; got != want {
		t.Fatalf("expanded %q, want %q", got, want)
	}
	for _, bad := range []string{"nc %h %C", "nc %"} {
		if _, err := expandProxyCommand(bad, e); err == nil || !strings.Contains(err.Error(), "ProxyCommand") {
			t.Errorf("expandProxyCommand(%q) = %v, want an error naming ProxyCommand", bad, err)
		}
	}
}

// OpenSSH takes whichever of ProxyJump and ProxyCommand it reads first, -J wins over both, and "none"
// disables either.
func TestProxyJumpOrProxyCommand(t *testing.T) {
	cfg := writeSSHConfig(t, `
Host cmdfirst
  HostName 10.0.0.1
  ProxyCommand nc %h %p
  ProxyJump jump
Host jumpfirst
  ProxyJump jump
  ProxyCommand nc %h %p
Host off
  ProxyCommand none
Host jump
  HostName 10.0.0.9
  User j
  ProxyCommand ssh -W %h:%p gateway
Host *
  ProxyCommand nc -X connect %h %p
`)
	for _, tc := range []struct {
		dest, jump string
		hops       int
		cmd0       string // the first hop's ProxyCommand
	}{
		{dest: "cmdfirst", hops: 1, cmd0: "nc 10.0.0.1 22"},
		{dest: "jumpfirst", hops: 2, cmd0: "ssh -W 10.0.0.9:22 gateway"},
		{dest: "off", hops: 1, cmd0: ""},
		{dest: "other", hops: 1, cmd0: "nc -X connect other 22"},
		{dest: "cmdfirst", jump: "none", hops: 1, cmd0: ""},
		{dest: "cmdfirst", jump: "jump", hops: 2, cmd0: "ssh -W 10.0.0.9:22 gateway"},
	} {
		c := Config{Destination: tc.dest, ConfigFile: cfg, KnownHostsFile: filepath.Join(t.TempDir(), "kh")}
		if tc.jump != "" {
			c.JumpHosts = []string{tc.jump}
		}
		p, err := resolve(c)
		if err != nil {
			t.Fatalf("%s -J %q: %v", tc.dest, tc.jump, err)
		}
		if len(p.hops) != tc.hops || p.hops[0].proxyCommand != tc.cmd0 {
			t.Errorf("%s -J %q: %d hops, first ProxyCommand %q; want %d, %q", tc.dest, tc.jump, len(p.hops), p.hops[0].proxyCommand, tc.hops, tc.cmd0)
		}
		for _, h := range p.hops[1:] {
			if h.proxyCommand != "" {
				t.Errorf("%s: hop %s has ProxyCommand %q; only the first hop may", tc.dest, h, h.proxyCommand)
			}
		}
	}
}

// TestCommandConnDeadlines: a ProxyCommand's connection keeps deadlines as a socket does, so that what sets
// one on the SSH transport bounds a read from a command that says nothing.
func TestCommandConnDeadlines(t *testing.T) {
	var procs sync.WaitGroup
	c, err := startProxyCommand("sleep 30", endpoint{hostName: "127.0.0.1", port: 22, user: "u"}, logr.Discard(), &procs)
	if err != nil {
		t.Fatal(err)
	}
	defer procs.Wait()
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(began) > 5*time.Second {
		t.Fatalf("read from a silent command: %v after %v, want a deadline error", err, time.Since(began))
	}
}
