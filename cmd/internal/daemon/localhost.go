package daemon

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
)

// listenLocalhost binds port on both loopback addresses, 127.0.0.1 and ::1, for an address whose host is
// "localhost", as OpenSSH binds ssh -D's. Bound on one alone, the other stays free for any user of the
// machine, and a client that resolves localhost to the other would reach whoever bound it. Where ::1 cannot
// exist (no IPv6 on the loopback interface) nobody can take it, and 127.0.0.1 is bound alone. Port 0 picks a
// port free on both.
func listenLocalhost(port int) (net.Listener, error) {
	const tries = 10 // port 0: a port free on 127.0.0.1 may be taken on ::1
	for try := 0; ; try++ {
		v4, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, err
		}
		p := v4.Addr().(*net.TCPAddr).Port
		v6, err := net.Listen("tcp6", net.JoinHostPort("::1", strconv.Itoa(p)))
		switch {
		case err == nil:
			return newMergedListener(v4, v6), nil
		case errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT):
			return v4, nil
		case port == 0 && errors.Is(err, syscall.EADDRINUSE) && try < tries:
			v4.Close()
			continue
		}
		v4.Close()
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: another program holds [::1]:%d, which clients that resolve localhost to ::1 would reach instead (localhost is bound on 127.0.0.1 and ::1 both)", err, p)
		}
		return nil, err
	}
}

// mergedListener accepts from several listeners as one. Its address is the first one's.
type mergedListener struct {
	lns     []net.Listener
	accepts chan accepted
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

type accepted struct {
	c   net.Conn
	err error
}

func newMergedListener(lns ...net.Listener) *mergedListener {
	m := &mergedListener{lns: lns, accepts: make(chan accepted), done: make(chan struct{})}
	for _, ln := range lns {
		m.wg.Add(1)
		go m.accept(ln)
	}
	return m
}

// accept hands ln's connections and errors to Accept until the merged listener closes. An error other than
// a closed listener is handed on too (the caller decides whether to retry), and ln keeps accepting.
func (m *mergedListener) accept(ln net.Listener) {
	defer m.wg.Done()
	for {
		c, err := ln.Accept()
		select {
		case m.accepts <- accepted{c, err}:
		case <-m.done:
			if c != nil {
				c.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

func (m *mergedListener) Accept() (net.Conn, error) {
	select {
	case a := <-m.accepts:
		return a.c, a.err
	case <-m.done:
		return nil, net.ErrClosed
	}
}

// Close closes every listener and waits for their accept loops.
func (m *mergedListener) Close() error {
	var errs []error
	m.once.Do(func() {
		close(m.done)
		for _, ln := range m.lns {
			errs = append(errs, ln.Close())
		}
		m.wg.Wait()
	})
	return errors.Join(errs...)
}

func (m *mergedListener) Addr() net.Addr { return m.lns[0].Addr() }
