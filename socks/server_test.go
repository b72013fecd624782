package socks

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/socks/internal/localproxy"
	"go.uber.org/goleak"
	"golang.org/x/net/proxy"
)

func TestMain(m *testing.M) {
	// No exceptions for http.Transport's connection goroutines: Serve closes the idle origin connections
	// of http:// forwarding when it returns, and the tests close their clients' transports.
	goleak.VerifyTestMain(m)
}

// serve runs s on a loopback listener until the test ends, and checks that Serve returns nil on cancel.
func serve(t testing.TB, s *Server, proto Protocol) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, s, ln, proto)
}

// serveOn is serve on a listener of the test's making.
func serveOn(t testing.TB, s *Server, ln net.Listener, proto Protocol) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln, proto) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return within 10s of cancel")
		}
	})
	return ln.Addr().String()
}

// sink is an upstream that accepts connections and holds them, reading, until the client closes, so that
// admitted clients stay open. It closes at the test's end.
func sink(t testing.TB) net.Listener {
	t.Helper()
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return up
}

// httpBackend is a plain HTTP server on 127.0.0.1 (and [::1] when available).
func httpBackend(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/echo" {
			// Read everything first: an HTTP/1 handler that writes early may lose the rest of the body.
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
			return
		}
		fmt.Fprintf(w, "backend saw %s %s host=%s proxy-auth=%q", r.Method, r.URL.Path, r.Host, r.Header.Get("Proxy-Authorization"))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func readAll(t testing.TB, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSOCKS5WithXNetProxy(t *testing.T) {
	be := httpBackend(t)
	_, port, _ := net.SplitHostPort(be.Listener.Addr().String())
	// An IPv6 backend, if the machine has ::1.
	var v6Port string
	if ln6, err := net.Listen("tcp", "[::1]:0"); err == nil {
		srv6 := &httptest.Server{Listener: ln6, Config: &http.Server{Handler: be.Config.Handler}}
		srv6.Start()
		t.Cleanup(srv6.Close)
		_, v6Port, _ = net.SplitHostPort(ln6.Addr().String())
	}

	var (
		mu     sync.Mutex
		dialed []string
	)
	plain := &Server{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	plainAddr := serve(t, plain, Auto)
	authed := &Server{Credentials: &Credentials{User: "alice", Password: "pw"}}
	authAddr := serve(t, authed, Auto)

	cases := []struct {
		name   string
		proxy  string
		auth   *proxy.Auth
		target string
		want   string // what Dial must receive; "" = not checked
	}{
		{"ipv4", plainAddr, nil, "127.0.0.1:" + port, "127.0.0.1:" + port},
		{"domain passed unresolved", plainAddr, nil, "localhost:" + port, "localhost:" + port},
		{"ipv6", plainAddr, nil, "[::1]:" + v6Port, "[::1]:" + v6Port},
		{"username/password", authAddr, &proxy.Auth{User: "alice", Password: "pw"}, "127.0.0.1:" + port, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasSuffix(tc.target, "]:") {
				t.Fatal("::1 is not available on this machine")
			}
			mu.Lock()
			dialed = nil
			mu.Unlock()
			d, err := proxy.SOCKS5("tcp", tc.proxy, tc.auth, proxy.Direct)
			if err != nil {
				t.Fatal(err)
			}
			tr := &http.Transport{Dial: d.Dial, DisableKeepAlives: true}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + tc.target + "/x")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if body := readAll(t, resp.Body); !strings.HasPrefix(body, "backend saw GET /x") {
				t.Fatalf("body = %q", body)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.want != "" && (len(dialed) != 1 || dialed[0] != tc.want) {
				t.Fatalf("Dial got %v, want [%s]", dialed, tc.want)
			}
		})
	}

	t.Run("wrong password refused", func(t *testing.T) {
		d, _ := proxy.SOCKS5("tcp", authAddr, &proxy.Auth{User: "alice", Password: "nope"}, proxy.Direct)
		if c, err := d.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			t.Fatal("dial with a wrong password succeeded")
		}
	})
	t.Run("no auth offered to a server that requires it", func(t *testing.T) {
		d, _ := proxy.SOCKS5("tcp", authAddr, nil, proxy.Direct)
		if c, err := d.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			t.Fatal("dial without credentials succeeded")
		}
	})
}

func TestHTTPProxyWithTransport(t *testing.T) {
	be := httpBackend(t)
	tlsBe := httptest.NewTLSServer(be.Config.Handler)
	defer tlsBe.Close()
	creds := &Credentials{User: "bob", Password: "hunter2"}

	for _, tc := range []struct {
		name  string
		srv   *Server
		proto Protocol
		user  *url.Userinfo
	}{
		{"shared port", &Server{}, Auto, nil},
		{"http-only port", &Server{}, HTTPOnly, nil},
		{"with Proxy-Authorization", &Server{Credentials: creds}, Auto, url.UserPassword("bob", "hunter2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serve(t, tc.srv, tc.proto)
			pu := &url.URL{Scheme: "http", Host: addr, User: tc.user}
			tr := &http.Transport{
				Proxy:           http.ProxyURL(pu),
				TLSClientConfig: &tls.Config{RootCAs: tlsBe.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs},
			}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
			// https:// goes through CONNECT; http:// is forwarded. Several requests reuse the connection.
			for i := 0; i < 3; i++ {
				for _, u := range []string{tlsBe.URL + "/tls", be.URL + "/plain"} {
					resp, err := c.Get(u)
					if err != nil {
						t.Fatalf("GET %s: %v", u, err)
					}
					body := readAll(t, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || !strings.HasPrefix(body, "backend saw GET /") {
						t.Fatalf("GET %s: %d %q", u, resp.StatusCode, body)
					}
					if strings.Contains(body, "hunter2") || !strings.HasSuffix(body, `proxy-auth=""`) {
						t.Fatalf("Proxy-Authorization leaked to the backend: %q", body)
					}
				}
				// A request body is forwarded, chunked or with a length.
				payload := strings.Repeat("p", 100<<10)
				for _, r := range []io.Reader{strings.NewReader(payload), io.MultiReader(strings.NewReader(payload))} {
					resp, err := c.Post(be.URL+"/echo", "text/plain", r)
					if err != nil {
						t.Fatalf("POST: %v", err)
					}
					if got := readAll(t, resp.Body); got != payload {
						t.Fatalf("POST echoed %d bytes, want %d", len(got), len(payload))
					}
					resp.Body.Close()
				}
			}
		})
	}

	t.Run("missing credentials get 407", func(t *testing.T) {
		addr := serve(t, &Server{Credentials: creds}, Auto)
		tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr})}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(be.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusProxyAuthRequired || resp.Header.Get("Proxy-Authenticate") == "" {
			t.Fatalf("status %d, Proxy-Authenticate %q", resp.StatusCode, resp.Header.Get("Proxy-Authenticate"))
		}
	})
}

// rawExchange writes in to a fresh connection and returns everything the server sends before it closes.
func rawExchange(t *testing.T, addr string, in []byte, closeWrite bool) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(in); err != nil {
		t.Fatal(err)
	}
	if closeWrite {
		c.(*net.TCPConn).CloseWrite()
	}
	out, _ := io.ReadAll(c)
	return out
}

// exchange is a hostile input and what the server must answer before it closes (nil: nothing).
type exchange struct {
	name    string
	in, out []byte
}

// checkHostile sends each exchange's input to a server that must not dial, and checks what it answers.
func checkHostile(t *testing.T, exchanges []exchange) {
	t.Helper()
	var dials atomic.Int32
	s := &Server{HandshakeTimeout: time.Second, Dial: func(ctx context.Context, n, a string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("must not dial")
	}}
	addr := serve(t, s, Auto)
	for _, tc := range exchanges {
		t.Run(tc.name, func(t *testing.T) {
			got := rawExchange(t, addr, tc.in, true)
			if string(got) != string(tc.out) {
				t.Fatalf("server sent %v, want %v", got, tc.out)
			}
		})
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("server dialled %d times for hostile input", n)
	}
}

func TestSOCKS5HostileInput(t *testing.T) {
	hello := []byte{5, 1, 0}
	ok := []byte{5, 0}
	fail := func(code byte) []byte { return append(append([]byte{}, ok...), 5, code, 0, 1, 0, 0, 0, 0, 0, 0) }
	checkHostile(t, []exchange{
		{"truncated greeting", []byte{5}, nil},
		{"greeting with missing methods", []byte{5, 3, 0}, nil},
		{"no acceptable method", []byte{5, 1, 2}, []byte{5, 0xff}},
		{"wrong version in request", append(hello, 4, 1, 0, 1, 127, 0, 0, 1, 0, 80), ok},
		{"BIND not supported", append(hello, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80), fail(ReplyCommandNotSupported)},
		{"UDP ASSOCIATE not supported", append(hello, 5, 3, 0, 1, 127, 0, 0, 1, 0, 80), fail(ReplyCommandNotSupported)},
		{"unknown address type", append(hello, 5, 1, 0, 9, 127, 0, 0, 1, 0, 80), fail(ReplyAddrTypeNotSupported)},
		{"truncated IPv6", append(hello, 5, 1, 0, 4, 0, 0, 0), ok},
		{"truncated domain", append(hello, 5, 1, 0, 3, 20, 'a', 'b'), ok},
		{"empty domain", append(hello, 5, 1, 0, 3, 0, 0, 80), fail(ReplyGeneralFailure)},
		{"control bytes in domain", append(hello, 5, 1, 0, 3, 3, 'a', '\n', 'b', 0, 80), fail(ReplyGeneralFailure)},
		{"port zero", append(hello, 5, 1, 0, 1, 127, 0, 0, 1, 0, 0), fail(ReplyGeneralFailure)},
	})
}

// TestSOCKS4HostileInput: malformed SOCKS4 and 4a requests get SOCKS4's rejection, or are closed when they
// end early, and nothing is dialled.
func TestSOCKS4HostileInput(t *testing.T) {
	rejected := []byte{0, socks4Rejected, 0, 0, 0, 0, 0, 0}
	checkHostile(t, []exchange{
		{"truncated request", []byte{4, 1, 0, 80, 127}, nil},
		{"user id without its NUL", []byte{4, 1, 0, 80, 127, 0, 0, 1, 'u', 's', 'e', 'r'}, nil},
		{"user id past the header limit", append([]byte{4, 1, 0, 80, 127, 0, 0, 1}, bytes.Repeat([]byte{'u'}, MaxHeaderBytes+10)...), nil},
		{"BIND not supported", []byte{4, 2, 0, 80, 127, 0, 0, 1, 0}, rejected},
		{"port zero", []byte{4, 1, 0, 0, 127, 0, 0, 1, 0}, rejected},
		{"4a name without its NUL", []byte{4, 1, 0, 80, 0, 0, 0, 1, 0, 'a', 'b'}, nil},
		{"4a empty name", []byte{4, 1, 0, 80, 0, 0, 0, 1, 0, 0}, rejected},
		{"4a control bytes in name", []byte{4, 1, 0, 80, 0, 0, 0, 1, 0, 'a', '\n', 'b', 0}, rejected},
	})
}

func TestHTTPHostileInput(t *testing.T) {
	addr := serve(t, &Server{HandshakeTimeout: time.Second, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("must not dial")
	}}, Auto)
	big := "GET http://x/ HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", MaxHeaderBytes) + "\r\n\r\n"
	for _, tc := range []struct {
		name, in, status string
	}{
		{"oversized header", big, "HTTP/1.1 431 "},
		{"garbage", "HELLO\r\n\r\n", "HTTP/1.1 400 "},
		{"origin-form request", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
		{"https:// forwarding", "GET https://x/ HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
		{"CONNECT without port", "CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", "HTTP/1.1 400 "},
		{"CONNECT port out of range", "CONNECT example.com:70000 HTTP/1.1\r\n\r\n", "HTTP/1.1 400 "},
		{"upgrade over forwarding", "GET http://x/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", "HTTP/1.1 501 "},
		{"truncated head", "GET http://x/ HTTP/1.1\r\nHost:", ""},
		{"unknown HTTP version", "CONNECT example.com:443 HTTP/9.9\r\nHost: example.com\r\n\r\n", "HTTP/1.1 505 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(rawExchange(t, addr, []byte(tc.in), true))
			if !strings.HasPrefix(got, tc.status) || (tc.status == "" && got != "") {
				t.Fatalf("got %q, want status %q", got, tc.status)
			}
		})
	}
}

func TestSlowloris(t *testing.T) {
	s := &Server{HandshakeTimeout: 300 * time.Millisecond}
	addr := serve(t, s, Auto)
	for _, first := range []string{"\x05", "G"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(first))
		t0 := time.Now()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(c)
		c.Close()
		if err != nil || time.Since(t0) > 3*time.Second {
			t.Fatalf("first byte %q: connection not closed by the handshake deadline (err %v after %s)", first, err, time.Since(t0))
		}
	}
	// Trickling a header one byte at a time does not extend the deadline.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	for i := 0; i < 100; i++ {
		if _, err := c.Write([]byte("G")); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	io.ReadAll(c)
	if time.Since(t0) > 3*time.Second {
		t.Fatalf("trickling client kept the connection for %s", time.Since(t0))
	}
}

func TestConnectionCap(t *testing.T) {
	up := sink(t)
	s := &Server{MaxConns: 2}
	addr := serve(t, s, Auto)
	d, _ := proxy.SOCKS5("tcp", addr, nil, proxy.Direct)
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, err := d.Dial("tcp", up.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if n := s.ActiveConns(); n != 2 {
		t.Fatalf("ActiveConns = %d, want 2", n)
	}
	// A third SOCKS5 client gets a general failure reply.
	got := rawExchange(t, addr, []byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 80}, false)
	if want := []byte{5, 0, 5, ReplyGeneralFailure, 0, 1, 0, 0, 0, 0, 0, 0}; string(got) != string(want) {
		t.Fatalf("over the cap, SOCKS5 got %v, want %v", got, want)
	}
	// A third HTTP client gets 503.
	resp := string(rawExchange(t, addr, []byte("CONNECT 127.0.0.1:80 HTTP/1.1\r\n\r\n"), false))
	if !strings.HasPrefix(resp, "HTTP/1.1 503 ") || !strings.Contains(resp, "too many connections") {
		t.Fatalf("over the cap, HTTP got %q", resp)
	}
	for _, c := range held {
		c.Close()
	}
	// Slots come back once the held connections end.
	deadline := time.Now().Add(5 * time.Second)
	for s.ActiveConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("ActiveConns = %d after clients left", s.ActiveConns())
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, err := d.Dial("tcp", up.Addr().String())
	if err != nil {
		t.Fatalf("dial after slots freed: %v", err)
	}
	c.Close()
}

func TestDialErrors(t *testing.T) {
	// Port 1 (tcpmux), never served here: a port freed by closing a listener could be taken again by
	// another test running at the same time.
	closed := "127.0.0.1:1"
	addr := serve(t, &Server{}, Auto)
	host, port, _ := net.SplitHostPort(closed)
	p, _ := net.LookupPort("tcp", port)

	req := []byte{5, 1, 0, 5, 1, 0, 1}
	req = append(req, net.ParseIP(host).To4()...)
	req = append(req, byte(p>>8), byte(p))
	got := rawExchange(t, addr, req, false)
	if len(got) < 4 || got[3] != ReplyConnectionRefused {
		t.Fatalf("SOCKS5 reply to a refused dial: %v, want code %d", got, ReplyConnectionRefused)
	}
	resp := string(rawExchange(t, addr, []byte("CONNECT "+closed+" HTTP/1.1\r\n\r\n"), false))
	if !strings.HasPrefix(resp, "HTTP/1.1 502 ") || !strings.Contains(resp, "connection refused") {
		t.Fatalf("HTTP reply to a refused dial: %q", resp)
	}

	for _, tc := range []struct {
		err   error
		reply byte
		code  int
	}{
		{syscall.ECONNREFUSED, ReplyConnectionRefused, 502},
		{fmt.Errorf("ssh: %w", syscall.ENETUNREACH), ReplyNetworkUnreachable, 502},
		{&net.OpError{Op: "dial", Err: syscall.EHOSTUNREACH}, ReplyHostUnreachable, 502},
		{syscall.EACCES, ReplyNotAllowed, 502},
		{&net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}, ReplyHostUnreachable, 502},
		{context.DeadlineExceeded, ReplyHostUnreachable, 504},
		{errors.New("something else"), ReplyGeneralFailure, 502},
		// A hop of the route failed, whatever its cause: the proxy's own failure, not the destination's.
		{fmt.Errorf("dial: %w", hopDown{syscall.ECONNREFUSED}), ReplyGeneralFailure, 503},
		{hopDown{context.DeadlineExceeded}, ReplyGeneralFailure, 503},
		{reported{syscall.ECONNREFUSED}, ReplyConnectionRefused, 502},
	} {
		if got := replyCode(tc.err); got != tc.reply {
			t.Errorf("replyCode(%v) = %d, want %d", tc.err, got, tc.reply)
		}
		if got := localproxy.HTTPStatus(tc.err); got != tc.code {
			t.Errorf("HTTPStatus(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

// hopDown is a dial error of a route whose hop (an SSH server) failed.
type hopDown struct{ err error }

func (h hopDown) Error() string { return "SSH server u@bastion:22 is unreachable: " + h.err.Error() }
func (h hopDown) Unwrap() error { return h.err }
func (h hopDown) Hop() string   { return "SSH server u@bastion:22" }

// reported is a destination's failure as a hop reports it.
type reported struct{ err error }

func (r reported) Error() string      { return "SSH server u@bastion:22 could not open: " + r.err.Error() }
func (r reported) Unwrap() error      { return r.err }
func (r reported) ReportedBy() string { return "SSH server u@bastion:22" }

// Clients are told which hop failed, in the command's own name: a hop that is down gets SOCKS5 reply 1 and
// HTTP 503 naming the hop; a destination that refused gets reply 5 and HTTP 502 saying who reported it.
func TestDialErrorsNameTheHop(t *testing.T) {
	for _, tc := range []struct {
		err   error
		reply byte
		head  string
		body  string
	}{
		{hopDown{syscall.ECONNREFUSED}, ReplyGeneralFailure, "HTTP/1.1 503 ",
			"konnect socks: cannot reach 127.0.0.1:1: SSH server u@bastion:22 is unreachable: connection refused\n"},
		{reported{syscall.ECONNREFUSED}, ReplyConnectionRefused, "HTTP/1.1 502 ",
			"konnect socks: cannot reach 127.0.0.1:1: connection refused (as reported by the SSH server u@bastion:22)\n"},
	} {
		s := &Server{Name: "konnect socks", Dial: func(context.Context, string, string) (net.Conn, error) { return nil, tc.err }}
		addr := serve(t, s, Auto)
		got := rawExchange(t, addr, []byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 1}, false)
		if len(got) < 4 || got[3] != tc.reply {
			t.Errorf("%v: SOCKS5 reply %v, want code %d", tc.err, got, tc.reply)
		}
		for _, req := range []string{"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n", "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n"} {
			resp := string(rawExchange(t, addr, []byte(req), false))
			if !strings.HasPrefix(resp, tc.head) || !strings.HasSuffix(resp, "\r\n\r\n"+tc.body) {
				t.Errorf("%v: %q answered %q, want %q ... %q", tc.err, req, resp, tc.head, tc.body)
			}
		}
	}
}

// TestSlowDialGetsItsReply: a dial may take longer than the handshake's write deadline (an SSH reconnect
// waits up to its connect timeout); its reply, success or failure, still reaches the client.
func TestSlowDialGetsItsReply(t *testing.T) {
	be := httpBackend(t)
	target := be.Listener.Addr().(*net.TCPAddr)
	for _, refuse := range []bool{false, true} {
		s := &Server{HandshakeTimeout: 200 * time.Millisecond, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			select { // three times the handshake timeout
			case <-time.After(600 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if refuse {
				return nil, syscall.ECONNREFUSED
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
		addr := serve(t, s, Auto)
		exchange := func(in []byte, n int) []byte {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write(in)
			out := make([]byte, n)
			got, err := io.ReadFull(c, out)
			if err != nil {
				t.Fatalf("refused=%v: %d bytes of the reply (%q), then %v", refuse, got, out[:got], err)
			}
			return out
		}
		wantCode, wantStatus := byte(ReplySucceeded), "HTTP/1.1 200 "
		if refuse {
			wantCode, wantStatus = ReplyConnectionRefused, "HTTP/1.1 502 "
		}
		req := append([]byte{5, 1, 0, 5, 1, 0, 1}, target.IP.To4()...)
		req = append(req, byte(target.Port>>8), byte(target.Port))
		if got := exchange(req, 2+10); got[3] != wantCode {
			t.Errorf("refused=%v: SOCKS5 reply %v, want code %d", refuse, got[2:], wantCode)
		}
		if got := string(exchange([]byte("CONNECT "+target.String()+" HTTP/1.1\r\n\r\n"), len(wantStatus))); got != wantStatus {
			t.Errorf("refused=%v: CONNECT reply %q, want %q", refuse, got, wantStatus)
		}
	}
}

// TestHTTP10ClientGetsNoChunks: a body of unknown length goes to an HTTP/1.0 client unframed, ended by the
// close, since it cannot read chunked encoding.
func TestHTTP10ClientGetsNoChunks(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("part1"))
		w.(http.Flusher).Flush() // the origin answers chunked: no Content-Length
		w.Write([]byte("part2"))
	}))
	t.Cleanup(origin.Close)
	addr := serve(t, &Server{}, Auto)
	resp := string(rawExchange(t, addr, []byte("GET "+origin.URL+"/ HTTP/1.0\r\n\r\n"), false))
	head, body, _ := strings.Cut(resp, "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 200 ") || strings.Contains(strings.ToLower(head), "transfer-encoding") || body != "part1part2" {
		t.Fatalf("HTTP/1.0 client got %q", resp)
	}
}

// TestForwardKeepsUserAgent: an http:// request is forwarded with the client's User-Agent, and without one
// when the client sent none: the proxy adds nothing of its own.
func TestForwardKeepsUserAgent(t *testing.T) {
	seen := make(chan []string, 1)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Values("User-Agent")
	}))
	t.Cleanup(origin.Close)
	addr := serve(t, &Server{}, Auto)
	for _, tc := range []struct {
		header string
		want   []string
	}{
		{"", nil},
		{"User-Agent: curl/8.0\r\n", []string{"curl/8.0"}},
	} {
		req := "GET " + origin.URL + "/ HTTP/1.1\r\nHost: " + strings.TrimPrefix(origin.URL, "http://") + "\r\n" + tc.header + "Connection: close\r\n\r\n"
		if resp := string(rawExchange(t, addr, []byte(req), false)); !strings.HasPrefix(resp, "HTTP/1.1 200 ") {
			t.Fatalf("response %q", resp)
		}
		if got := <-seen; !slices.Equal(got, tc.want) {
			t.Errorf("with %q the origin saw User-Agent %q, want %q", tc.header, got, tc.want)
		}
	}
}

// TestHalfClose checks that a client's EOF reaches the backend while the backend can still answer.
func TestHalfClose(t *testing.T) {
	be, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	go func() {
		for {
			c, err := be.Accept()
			if err != nil {
				return
			}
			// Answer only after the request is complete (EOF), like a request/response protocol over
			// half-close.
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				fmt.Fprintf(c, "got %d bytes", len(b))
			}()
		}
	}()
	// The upstream is not a *net.TCPConn, like an SSH channel.
	s := &Server{Dial: dialWrapped}
	addr := serve(t, s, Auto)
	for _, via := range []string{"socks5", "connect"} {
		t.Run(via, func(t *testing.T) {
			var c net.Conn
			if via == "socks5" {
				d, _ := proxy.SOCKS5("tcp", addr, nil, proxy.Direct)
				c, err = d.Dial("tcp", be.Addr().String())
			} else {
				c, err = net.Dial("tcp", addr)
				if err == nil {
					fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n\r\n", be.Addr())
					line, _ := bufio.NewReader(c).ReadString('\n')
					if !strings.HasPrefix(line, "HTTP/1.1 200") {
						t.Fatalf("CONNECT: %q", line)
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			payload := strings.Repeat("z", 1<<20)
			io.WriteString(c, payload)
			c.(interface{ CloseWrite() error }).CloseWrite()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got := readAll(t, c)
			if want := fmt.Sprintf("got %d bytes", len(payload)); !strings.HasSuffix(got, want) {
				t.Fatalf("reply %q, want %q", got, want)
			}
		})
	}
}

// wrapped hides *net.TCPConn, so the upstream looks like an SSH channel: a net.Conn with CloseWrite.
type wrapped struct{ *net.TCPConn }

// dialWrapped dials TCP and returns the connection as wrapped.
func dialWrapped(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return wrapped{c.(*net.TCPConn)}, nil
}

func TestProxyAuthorizationParsing(t *testing.T) {
	s := &Server{Credentials: &Credentials{User: "a", Password: "b:c"}}
	for _, tc := range []struct {
		header string
		ok     bool
	}{
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("a:b:c")), true},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("a:b:c")), true},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("a:b")), false},
		{"Bearer xyz", false},
		{"Basic !!!", false},
		{"", false},
	} {
		r := &http.Request{Header: http.Header{}}
		if tc.header != "" {
			r.Header.Set("Proxy-Authorization", tc.header)
		}
		if got := s.proxyAuthorized(r); got != tc.ok {
			t.Errorf("%q: authorized = %v, want %v", tc.header, got, tc.ok)
		}
	}
}

// BenchmarkRelay measures bulk throughput through the proxy on loopback: a SOCKS5 client sends to a sink
// that counts the bytes. The upstream is wrapped so that it is not a *net.TCPConn, as with an SSH channel.
func BenchmarkRelay(b *testing.B) {
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() {
				n, _ := io.Copy(io.Discard, c)
				fmt.Fprintf(c, "%d", n)
				c.Close()
			}()
		}
	}()
	s := &Server{Dial: dialWrapped}
	addr := serve(b, s, Auto)
	d, _ := proxy.SOCKS5("tcp", addr, nil, proxy.Direct)
	c, err := d.Dial("tcp", sink.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	got, _ := io.ReadAll(c)
	b.StopTimer()
	if want := fmt.Sprint(int64(b.N) * int64(len(buf))); string(got) != want {
		b.Fatalf("sink counted %s bytes, want %s", got, want)
	}
}

// flakyListener fails its first accepts with errs, then accepts for real.
type flakyListener struct {
	net.Listener
	mu   sync.Mutex
	errs []error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

func TestServeAcceptErrors(t *testing.T) {
	be := httpBackend(t)
	t.Run("out of descriptors is survived", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		fl := &flakyListener{Listener: ln, errs: []error{
			&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.EMFILE)},
			&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.ECONNABORTED)},
		}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- (&Server{}).Serve(ctx, fl, Auto) }()
		tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(be.URL)
		if err != nil {
			t.Fatalf("request after EMFILE: %v", err)
		}
		resp.Body.Close()
		tr.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Serve = %v after cancel", err)
		}
	})
	t.Run("other errors end Serve", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		fl := &flakyListener{Listener: ln, errs: []error{errors.New("listener broke")}}
		err := (&Server{}).Serve(context.Background(), fl, Auto)
		if err == nil || !strings.Contains(err.Error(), "listener broke") {
			t.Fatalf("Serve = %v, want the accept error", err)
		}
	})
}

// TestServeClosesIdleOriginConnections checks that the keep-alive connections opened for http:// forwarding
// end when Serve returns, instead of idling on until the transport's timeout.
func TestServeClosesIdleOriginConnections(t *testing.T) {
	var once sync.Once
	originClosed := make(chan struct{})
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	origin.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			once.Do(func() { close(originClosed) })
		}
	}
	origin.Start()
	defer origin.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- (&Server{}).Serve(ctx, ln, Auto) }()
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(origin.URL)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp.Body); body != "ok" {
		t.Fatalf("body %q", body)
	}
	resp.Body.Close()

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v after cancel", err)
	}
	select {
	case <-originClosed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection to the origin is still open 5s after Serve returned")
	}
}
