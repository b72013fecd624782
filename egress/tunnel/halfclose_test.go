package tunnel

import (
	"io"
	"net"
	"testing"
	"time"
)

// checkHalfCloseEndsConnection: the Konnectivity protocol has no half-close, so a half-close by either end
// ends the whole tunnelled connection. A CONNECT client that shuts down its write side after its request
// gets no reply: the backend reads the request and an end, and the client's read ends without the reply.
// A backend that shuts down its write side after a greeting reads nothing more: the client gets the
// greeting and an end, and what it writes then does not arrive. keepsRequest: the agent writes the request
// out before it closes the backend (konnect's does; upstream's may drop it).
func checkHalfCloseEndsConnection(t *testing.T, s *running, keepsRequest bool) {
	t.Helper()
	f := s.frontend("http-connect")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type seen struct {
		read string
		err  error
	}
	backend := make(chan seen, 1)
	serve := func(greet bool) {
		c, err := ln.Accept()
		if err != nil {
			backend <- seen{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if greet {
			_, _ = io.WriteString(c, "greeting")
			_ = c.(*net.TCPConn).CloseWrite()
		}
		b, err := io.ReadAll(c)
		if !greet {
			_, _ = io.WriteString(c, "reply")
		}
		backend <- seen{string(b), err}
	}

	t.Run("client", func(t *testing.T) {
		go serve(false)
		c := dial(t, f, ln.Addr().String())
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, "request"); err != nil {
			t.Fatal(err)
		}
		if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if b := <-backend; b.err != nil || b.read != "request" && (keepsRequest || b.read != "") {
			t.Fatalf("backend read %q, %v", b.read, b.err)
		}
		if string(got) != "" || err != nil {
			t.Fatalf("client read %q, %v after its half-close; want the connection ended", got, err)
		}
	})
	t.Run("backend", func(t *testing.T) {
		go serve(true)
		c := dial(t, f, ln.Addr().String())
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(c)
		if string(got) != "greeting" || err != nil {
			t.Fatalf("client read %q, %v", got, err)
		}
		_, _ = io.WriteString(c, "late")
		if b := <-backend; b.read != "" || b.err != nil {
			t.Fatalf("backend read %q, %v after its half-close; want the connection ended", b.read, b.err)
		}
	})
}

// TestHalfCloseEndsConnectionKonnectAgent: checkHalfCloseEndsConnection with konnect's agent.
func TestHalfCloseEndsConnectionKonnectAgent(t *testing.T) {
	e := newEnv(t)
	s := start(t, e.config("http-connect"))
	startKonnectAgent(t, e, "konnect-agent", s.agentPort())
	s.waitAgents(t, 1)
	checkHalfCloseEndsConnection(t, s, true)
}
