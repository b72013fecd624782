//go:build integration

package sshdial

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// notSSH starts a listener that is no SSH server; it returns its address and how many connections it took.
func notSSH(t *testing.T, kind string) (string, func() int) {
	t.Helper()
	var mu sync.Mutex
	accepted := 0
	count := func() int { mu.Lock(); defer mu.Unlock(); return accepted }
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "not ssh") })
	switch kind {
	case "http", "https":
		srv := httptest.NewUnstartedServer(handler)
		srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				mu.Lock()
				accepted++
				mu.Unlock()
			}
		}
		if kind == "https" {
			srv.StartTLS()
		} else {
			srv.Start()
		}
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String(), count
	default: // accepts and closes at once, as tcp-wrappers or a full MaxStartups do
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				accepted++
				mu.Unlock()
				c.Close()
			}
		}()
		return ln.Addr().String(), count
	}
}

// A first connection to a port where no SSH server listens ends Run with an error that says so and names
// the address, instead of retrying for ever.
func TestNotSSHAtStartEndsRun(t *testing.T) {
	for _, kind := range []string{"http", "https", "closes"} {
		t.Run(kind, func(t *testing.T) {
			f := newFixture(t)
			addr, _ := notSSH(t, kind)
			cfg := f.config()
			cfg.Destination = addr
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			t0 := time.Now()
			err = d.Run(ctx)
			var se *StartError
			if !errors.As(err, &se) || time.Since(t0) > 10*time.Second {
				t.Fatalf("Run = %v after %s, want a StartError at once", err, time.Since(t0))
			}
			// A TLS server closes without a word on a plain-text hello, like one that closes at once.
			want := []string{addr, "not an SSH server", "closed the connection before sending an SSH version line"}
			if kind == "http" {
				want = []string{addr, "is not an SSH server", "HTTP/1.1 400"}
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q: %v", w, err)
				}
			}
			t.Log(err)
		})
	}
}

// Once a connection was up, a server that closes at once is retried: it may be restarting.
func TestNotSSHAfterUpIsRetried(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.MaxBackoff = 500 * time.Millisecond
	d, done := start(t, cfg)
	waitReady(t, d, done)
	f.sshd.Stop()
	ln, err := net.Listen("tcp", f.sshd.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var accepted sync.WaitGroup
	accepted.Add(3)
	go func() {
		n := 0
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			if n++; n <= 3 {
				accepted.Done()
			}
		}
	}()
	waited := make(chan struct{})
	go func() { accepted.Wait(); close(waited) }()
	select {
	case <-waited:
	case err := <-done:
		ln.Close()
		t.Fatalf("Run returned %v after the connection had been up", err)
	case <-time.After(20 * time.Second):
		ln.Close()
		t.Fatal("no three reconnection attempts within 20s")
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v after the connection had been up", err)
	default:
	}
	ln.Close()
	f.sshd.Restart()
	waitReady(t, d, done)
}
