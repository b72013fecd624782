// Package socks serves the proxy protocols a developer's tools speak, SOCKS5 and HTTP proxying, and hands
// every outgoing connection to an injected Dial function.
//
// It implements SOCKS5 (RFC 1928) CONNECT with no authentication or username/password (RFC 1929), for IPv4,
// IPv6 and domain-name destinations (names are passed to Dial unresolved, so the far side resolves them, as
// with ssh -D and socks5h); HTTP CONNECT; and forwarding of plain http:// requests. Both protocols can share
// one port: the first byte of a connection (0x05 for SOCKS5) picks the protocol.
//
// It handles only the protocols. It does not know what Dial does (an SSH client's DialContext plugs in
// directly), does not resolve names itself, has no BIND or UDP ASSOCIATE, and does not filter destinations.
// A Dial error may say that a hop of the route failed rather than the destination (see
// socks/internal/localproxy), and the client is told so. Failed requests are logged at the default level,
// rate-limited.
// Hostile clients are bounded: handshake deadlines, header size limits and a connection cap with a clear
// refusal. With credentials, clients that have not authenticated yet may hold at most half of the cap, and
// one source address at most a quarter (64 at most); more from one source are reset, and while the half is
// full a new connection takes the place of the oldest of the source that holds the most, if its own holds
// fewer, and is reset otherwise. A source whose handshakes keep lapsing is reset for a while (preauth.go).
package socks

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/konnect-dev/konnect/socks/internal/localproxy"
)

// Protocol selects what a listener serves.
type Protocol int

const (
	// Auto serves SOCKS5, SOCKS4 and HTTP on one listener, chosen by the first byte.
	Auto Protocol = iota
	// SOCKSOnly serves only SOCKS5 and SOCKS4.
	SOCKSOnly
	// HTTPOnly serves only HTTP proxying (CONNECT and http:// forwarding).
	HTTPOnly
)

// Defaults for the zero values of Server's fields.
const (
	DefaultMaxConns         = 1024
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultDialTimeout      = 30 * time.Second
	DefaultIdleTimeout      = 90 * time.Second
	// MaxHeaderBytes bounds an HTTP request head (request line and headers).
	MaxHeaderBytes = 32 << 10
)

// Credentials is the username and password clients must present, for SOCKS5 (RFC 1929) and HTTP
// (Proxy-Authorization: Basic).
type Credentials struct {
	User     string
	Password string
}

func (c *Credentials) match(user, pass string) bool {
	// Both comparisons always run, so timing does not tell which one failed.
	u := subtle.ConstantTimeCompare([]byte(user), []byte(c.User))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(c.Password))
	return u&p == 1
}

// Server is a SOCKS5 and HTTP proxy server. Set its fields before the first Serve; they must not change
// afterwards. A Server may serve several listeners at once, sharing its connection cap.
type Server struct {
	// Dial opens outgoing connections. nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Credentials, when set, are required from every client.
	Credentials *Credentials
	// MaxConns caps concurrent client connections; more are refused (SOCKS5 reply 0x01, HTTP 503). 0 means
	// DefaultMaxConns. With Credentials, at most half of them may be unauthenticated (unauthenticatedBounds)
	// and it must be at least MinMaxConnsWithCredentials, or Serve fails.
	MaxConns int
	// HandshakeTimeout bounds reading a SOCKS5 handshake or an HTTP request head. 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// DialTimeout bounds one outgoing dial. 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// IdleTimeout is how long a kept-alive HTTP forwarding connection may wait for its next request. 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Name starts the text of error responses to HTTP clients ("konnect socks: cannot reach ..."), so that
	// the user sees which program answered. "" means "proxy".
	Name string
	// MaxUnauthenticatedPerSource bounds, with Credentials, the connections from one source address that
	// have not authenticated yet, and a quarter of MaxConns does too; more are reset. Past half of MaxConns
	// unauthenticated in all (unauthenticatedBounds), a new connection is reset too, unless its source
	// holds fewer than another, whose oldest it then replaces (makeRoom). 0 means
	// DefaultMaxUnauthenticatedPerSource. A source whose connections keep running out HandshakeTimeout
	// unauthenticated is then reset for a while (newPreAuth).
	MaxUnauthenticatedPerSource int
	// Log receives the server's log lines: refused connections, failed handshakes and dials. The zero Logger
	// discards them; a command passes klog's (klog.NewKlogr()).
	Log logr.Logger

	initOnce  sync.Once
	limit     *localproxy.ConnLimit
	preAuth   *preAuth      // with Credentials
	initErr   error         // fields Serve cannot serve with
	refusing  chan struct{} // bounds goroutines spent on refusals
	transport *http.Transport
	failures  localproxy.FailureLog
}

func (s *Server) name() string {
	if s.Name != "" {
		return s.Name
	}
	return "proxy"
}

func (s *Server) init() {
	s.initOnce.Do(func() {
		n := s.MaxConns
		if n <= 0 {
			n = DefaultMaxConns
		}
		s.limit = localproxy.NewConnLimit(n)
		s.failures.Logger = s.Log
		if s.Credentials != nil {
			m := s.MaxUnauthenticatedPerSource
			if m <= 0 {
				m = DefaultMaxUnauthenticatedPerSource
			}
			if n < MinMaxConnsWithCredentials {
				s.initErr = fmt.Errorf("MaxConns %d is below %d: too few to keep clients without the password from holding every connection",
					n, MinMaxConnsWithCredentials)
			}
			total, perSource := unauthenticatedBounds(n, m)
			s.preAuth = newPreAuth(total, perSource, s.handshakeTimeout(), s.limit)
		}
		s.refusing = make(chan struct{}, 64)
		s.transport = &http.Transport{
			Proxy:                 nil,
			DialContext:           s.dial,
			MaxIdleConns:          64,
			MaxIdleConnsPerHost:   8,
			IdleConnTimeout:       s.idleTimeout(),
			ResponseHeaderTimeout: 0, // a slow origin is the client's business
			DisableCompression:    true,
			ForceAttemptHTTP2:     false,
		}
	})
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout > 0 {
		return s.HandshakeTimeout
	}
	return DefaultHandshakeTimeout
}

func (s *Server) idleTimeout() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return DefaultIdleTimeout
}

// dial applies DialTimeout and the default dialer.
func (s *Server) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	t := s.DialTimeout
	if t <= 0 {
		t = DefaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	if s.Dial != nil {
		return s.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Serve accepts connections on ln until ctx ends, then closes ln and every connection it accepted and
// returns nil once they are all done. Any other accept error is returned the same way. Fields it cannot
// serve with (see MaxConns) close ln and return an error at once.
func (s *Server) Serve(ctx context.Context, ln net.Listener, proto Protocol) error {
	s.init()
	if s.initErr != nil {
		ln.Close()
		return s.initErr
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		active = map[net.Conn]struct{}{}
	)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	// Connections to origins kept alive for http:// forwarding must not outlive the listeners they served.
	defer s.transport.CloseIdleConnections()
	// track and untrack keep every connection this Serve started a goroutine for, admitted or being
	// refused, so that shutdown closes them all and waits for their goroutines.
	track := func(c net.Conn) {
		mu.Lock()
		active[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
	}
	untrack := func(c net.Conn) {
		c.Close()
		mu.Lock()
		delete(active, c)
		mu.Unlock()
		wg.Done()
	}
	var tempDelay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				err = nil
			} else if retryableAccept(err) {
				// Out of file descriptors, or a client gone before accept: back off instead of spinning
				// or giving up; the connections being served will free descriptors.
				tempDelay = min(max(2*tempDelay, 5*time.Millisecond), time.Second)
				s.Log.V(1).Info("Proxy accept failed; retrying", "addr", ln.Addr(), "err", err, "in", tempDelay)
				time.Sleep(tempDelay)
				continue
			} else {
				err = fmt.Errorf("accept on %s: %w", ln.Addr(), err)
			}
			ln.Close()
			mu.Lock()
			for c := range active {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
			return err
		}
		tempDelay = 0
		acquired := true // whether c holds a slot of MaxConns
		if s.preAuth != nil {
			// admit takes c's slot with its count, or hands it the slot of the connection it displaces.
			var (
				refused why
				evicted net.Addr
			)
			c, refused, evicted = s.preAuth.admit(c)
			switch {
			case refused == overCap:
				acquired = false
			case refused != "":
				s.refuseSource(c, refused)
				continue
			case evicted != nil:
				s.Log.V(1).Info("Proxy connection closed unauthenticated to make room for a source that holds fewer",
					"remote", evicted, "for", c.RemoteAddr())
			}
		} else {
			acquired = s.limit.TryAcquire()
		}
		if !acquired {
			// Over the cap: answer briefly in the client's protocol, unless too many refusals are
			// already in flight, then just close.
			select {
			case s.refusing <- struct{}{}:
			default:
				c.Close()
				continue
			}
			track(c)
			go func() {
				defer func() { <-s.refusing }()
				defer untrack(c)
				s.refuse(c, proto)
			}()
			continue
		}
		track(c)
		go func() {
			defer s.releaseSlot(c)
			defer untrack(c)
			s.serveConn(ctx, c, proto)
		}()
	}
}

// releaseSlot frees the slot of MaxConns that c held, unless c gave it to a connection that displaced it.
func (s *Server) releaseSlot(c net.Conn) {
	if pc, ok := c.(*preAuthConn); ok {
		pc.p.releaseSlot(pc)
		return
	}
	s.limit.Release()
}

func retryableAccept(err error) bool {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ServeConn serves one already accepted connection, outside any connection cap, and closes it.
func (s *Server) ServeConn(ctx context.Context, c net.Conn, proto Protocol) {
	s.init()
	defer c.Close()
	s.serveConn(ctx, c, proto)
}

// ActiveConns returns the number of client connections being served.
func (s *Server) ActiveConns() int {
	s.init()
	return s.limit.Active()
}

// refuse answers a connection over the cap in its own protocol, briefly (2s at most), so the client shows a
// clear error rather than a reset. The caller closes c.
func (s *Server) refuse(c net.Conn, proto Protocol) {
	s.Log.V(1).Info("Proxy connection refused: too many connections", "remote", c.RemoteAddr())
	c.SetDeadline(time.Now().Add(2 * time.Second))
	br := bufio.NewReaderSize(c, 512)
	switch kind, err := sniff(br, proto); {
	case err != nil:
		return
	case kind == socksVersion:
		refuseSOCKS(br, c)
		return
	case kind == socks4Version:
		writeReply4(c, socks4Rejected)
		return
	}
	writeHTTPError(c, s.name(), http.StatusServiceUnavailable, "too many connections")
}

// sniff decides the protocol from the first byte without consuming it: socksVersion (SOCKS5),
// socks4Version (SOCKS4 and 4a), or 0 for HTTP.
func sniff(br *bufio.Reader, proto Protocol) (byte, error) {
	if proto == HTTPOnly {
		return 0, nil
	}
	b, err := br.Peek(1)
	if err != nil {
		return 0, err
	}
	switch {
	case b[0] == socks4Version:
		return socks4Version, nil
	case b[0] == socksVersion || proto == SOCKSOnly:
		return socksVersion, nil
	}
	return 0, nil
}

// client is an accepted connection with its buffered reader. lr bounds what the reader may consume while a
// handshake or request head is read.
type client struct {
	net.Conn
	br *bufio.Reader
	lr *limitedReader
}

func (s *Server) serveConn(ctx context.Context, c net.Conn, proto Protocol) {
	c.SetReadDeadline(time.Now().Add(s.handshakeTimeout()))
	lr := &limitedReader{r: c, n: MaxHeaderBytes}
	cl := &client{Conn: c, br: bufio.NewReaderSize(lr, 4096), lr: lr}
	switch kind, err := sniff(cl.br, proto); {
	case err != nil:
	case kind == socksVersion:
		s.serveSOCKS(ctx, cl)
	case kind == socks4Version:
		s.serveSOCKS4(ctx, cl)
	default:
		s.serveHTTP(ctx, cl)
	}
}

// limitedReader fails reads beyond n bytes, bounding what a handshake or request head may consume. The
// limit is lifted (n < 0) once the handshake is over.
type limitedReader struct {
	r net.Conn
	n int
}

var errHeaderTooLarge = errors.New("request header too large")

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(p)
	}
	if l.n == 0 {
		return 0, errHeaderTooLarge
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}
