//go:build integration

package reliability

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/proxy"
)

// backend is a loopback HTTP server that counts the connections it accepted.
type backend struct {
	addr     string
	accepted atomic.Int64
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startBackend(t *testing.T) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "backend-ok")
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(countingListener{ln, &b.accepted})
	t.Cleanup(func() { srv.Close() })
	return b
}

// socksGet fetches http://addr/ through the SOCKS5 proxy with an independent client (x/net/proxy).
func socksGet(proxyAddr, addr string) error {
	d, err := proxy.SOCKS5("tcp", proxyAddr, nil, &net.Dialer{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	tr := &http.Transport{DialContext: d.(proxy.ContextDialer).DialContext, DisableKeepAlives: true}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != "backend-ok" {
		return fmt.Errorf("through SOCKS5: %s %q", resp.Status, b)
	}
	return nil
}

// exchange writes msg, then reads until the peer closes or the deadline passes.
func exchange(addr string, msg []byte, wait time.Duration) (resp []byte, closed bool, elapsed time.Duration, err error) {
	return exchangeOn("tcp", addr, msg, wait)
}

// exchangeOn is exchange over network ("tcp" or "unix").
func exchangeOn(network, addr string, msg []byte, wait time.Duration) (resp []byte, closed bool, elapsed time.Duration, err error) {
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		return nil, false, 0, err
	}
	defer c.Close()
	start := time.Now()
	go func() { _, _ = c.Write(msg) }() // the peer may close before reading all of an oversized message
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var buf bytes.Buffer
	_, rerr := io.Copy(&buf, c)
	var ne net.Error
	closed = rerr == nil || !errors.As(rerr, &ne) || !ne.Timeout()
	return buf.Bytes(), closed, time.Since(start), nil
}

// socksReq is a SOCKS5 request for command cmd to 127.0.0.1:port after a no-auth greeting.
func socksReq(cmd byte, port int) []byte {
	return []byte{5, 1, 0, 5, cmd, 0, 1, 127, 0, 0, 1, byte(port >> 8), byte(port)}
}

// refusal judges a reply: a SOCKS5 reply that is not success, an HTTP error status, or a plain close.
type refusal func(resp []byte) error

func socksReply(code byte) refusal {
	return func(resp []byte) error {
		if len(resp) < 4 || resp[0] != 5 || resp[1] != 0 || resp[2] != 5 || resp[3] != code {
			return fmt.Errorf("want method 00 then reply %#x, got % x", code, resp)
		}
		return nil
	}
}

// socks4Rejected is SOCKS4's "request rejected or failed" reply.
func socks4Rejected(resp []byte) error {
	if len(resp) != 8 || resp[0] != 0 || resp[1] != 91 {
		return fmt.Errorf("want SOCKS4 reply 91 (rejected), got % x", resp)
	}
	return nil
}

// socks4NoGrant: anything but SOCKS4's "granted" reply, closing without one included.
func socks4NoGrant(resp []byte) error {
	if len(resp) >= 2 && resp[0] == 0 && resp[1] == 90 {
		return fmt.Errorf("request granted: % x", resp)
	}
	return nil
}

func socksMethodRefused(resp []byte) error {
	if len(resp) != 2 || resp[0] != 5 || resp[1] != 0xff {
		return fmt.Errorf("want 05 ff (no acceptable method), got % x", resp)
	}
	return nil
}

// socksNoSuccess accepts a close or any SOCKS5 answer short of a successful request reply.
func socksNoSuccess(resp []byte) error {
	if len(resp) >= 4 && resp[0] == 5 && resp[2] == 5 && resp[3] == 0 {
		return fmt.Errorf("request succeeded: % x", resp)
	}
	return nil
}

func httpStatus(lo, hi int) refusal {
	return func(resp []byte) error {
		if len(resp) == 0 {
			return nil // closed without an answer: also a refusal
		}
		var code int
		if _, err := fmt.Sscanf(string(resp), "HTTP/1.1 %d", &code); err != nil {
			return fmt.Errorf("want an HTTP status %d-%d, got %q", lo, hi, harness.Tail(string(resp), 200))
		}
		if code < lo || code > hi {
			return fmt.Errorf("want an HTTP status %d-%d, got %d", lo, hi, code)
		}
		return nil
	}
}

// socksHandshakeLimit is how long konnect socks waits for a complete SOCKS5 handshake or HTTP request head.
const socksHandshakeLimit = 10 * time.Second

type hostileCase struct {
	name  string
	msg   []byte
	check refusal
	// hangs: the message is incomplete, so the daemon must close the connection after its timeout.
	hangs bool
	// bug names the product bug that makes this case fail today.
	bug string
}

// hostileOutcome is what one hostile exchange got back.
type hostileOutcome struct {
	resp    []byte
	closed  bool
	elapsed time.Duration
	wait    time.Duration // how long the exchange waited for the daemon to close
	err     error
}

// sendHostile runs every case's exchange at once, so that the incomplete ones (hangs) wait out the daemon's
// timeout together: hangWait for those, 5 s for the others.
func sendHostile(cases []hostileCase, hangWait time.Duration, exchange func(msg []byte, wait time.Duration) ([]byte, bool, time.Duration, error)) []hostileOutcome {
	outcomes := make([]hostileOutcome, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outcomes[i]
			o.wait = 5 * time.Second
			if tc.hangs {
				o.wait = hangWait
			}
			o.resp, o.closed, o.elapsed, o.err = exchange(tc.msg, o.wait)
		}()
	}
	wg.Wait()
	return outcomes
}

func hostileCases(backendPort int) []hostileCase {
	big := bytes.Repeat([]byte("a"), 1<<20)
	greet255 := append([]byte{5, 255}, bytes.Repeat([]byte{0x80}, 255)...)
	return []hostileCase{
		// SOCKS4 and 4a are served (CONNECT only), as ssh -D serves them; what they cannot do is rejected.
		{name: "socks4-bind", msg: []byte{4, 2, byte(backendPort >> 8), byte(backendPort), 127, 0, 0, 1, 0}, check: socks4Rejected},
		{name: "socks4a-bad-name", msg: []byte{4, 1, byte(backendPort >> 8), byte(backendPort), 0, 0, 0, 1, 0, 'a', '\n', 'b', 0}, check: socks4Rejected},
		{name: "socks4-truncated-user-id", msg: []byte{4, 1, byte(backendPort >> 8), byte(backendPort), 127, 0, 0, 1, 'u'}, check: socks4NoGrant, hangs: true},
		{name: "socks5-no-acceptable-method", msg: []byte{5, 1, 2}, check: socksMethodRefused},
		{name: "socks5-zero-methods", msg: []byte{5, 0}, check: socksMethodRefused},
		{name: "socks5-oversized-greeting", msg: greet255, check: socksMethodRefused},
		{name: "socks5-truncated-greeting", msg: []byte{5, 2, 0}, check: socksNoSuccess, hangs: true},
		{name: "socks5-truncated-request", msg: []byte{5, 1, 0, 5, 1, 0, 1, 127, 0}, check: socksNoSuccess, hangs: true},
		{name: "socks5-wrong-request-version", msg: []byte{5, 1, 0, 4, 1, 0, 1, 127, 0, 0, 1, byte(backendPort >> 8), byte(backendPort)}, check: socksNoSuccess},
		{name: "socks5-bind", msg: socksReq(2, backendPort), check: socksReply(7)},
		{name: "socks5-udp-associate", msg: socksReq(3, backendPort), check: socksReply(7)},
		{name: "socks5-unknown-command", msg: socksReq(9, backendPort), check: socksReply(7)},
		{name: "socks5-unknown-address-type", msg: []byte{5, 1, 0, 5, 1, 0, 9, 127, 0, 0, 1, 0, 80}, check: socksReply(8)},
		{name: "socks5-empty-domain", msg: []byte{5, 1, 0, 5, 1, 0, 3, 0, 0, 80}, check: socksNoSuccess},
		{name: "http-garbage", msg: []byte("\x16\x03\x01garbage\r\n\r\n"), check: httpStatus(400, 499)},
		{name: "http-connect-without-port", msg: []byte("CONNECT 127.0.0.1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), check: httpStatus(400, 499)},
		{name: "http-connect-port-out-of-range", msg: []byte("CONNECT 127.0.0.1:99999 HTTP/1.1\r\nHost: 127.0.0.1:99999\r\n\r\n"), check: httpStatus(400, 499)},
		{name: "http-connect-wrong-version", msg: []byte("CONNECT 127.0.0.1:" + strconv.Itoa(backendPort) + " HTTP/9.9\r\n\r\n"), check: httpStatus(400, 505),
			bug: "konnect socks answers CONNECT ... HTTP/9.9 with 200 and dials the destination"},
		{name: "http-oversized-header", msg: append(append([]byte("CONNECT 127.0.0.1:"+strconv.Itoa(backendPort)+" HTTP/1.1\r\nX-Big: "), big...), "\r\n\r\n"...), check: httpStatus(400, 499)},
		{name: "http-truncated-head", msg: []byte("CONNECT 127.0.0.1:" + strconv.Itoa(backendPort) + " HTTP/1.1\r\nHost: 127"), check: httpStatus(400, 499), hangs: true},
	}
}

// socksProxy is a running konnect socks on top of a real sshd.
type socksProxy struct {
	p      *harness.Proc
	addr   string
	health int
}

func startSocks(t *testing.T, s *sshd, extra ...string) *socksProxy {
	t.Helper()
	ports := harness.FreePorts(t, 2)
	sp := &socksProxy{addr: "127.0.0.1:" + strconv.Itoa(ports[0]), health: ports[1]}
	sp.p = startKonnect(t, "socks", s.socksArgs(sp.addr, sp.health, extra...)...)
	waitReady(t, sp.p, sp.health)
	return sp
}

// TestHostileProxyInput sends truncated, oversized, wrong-version and unknown-command SOCKS5 and HTTP
// CONNECT requests to konnect socks (through a real sshd). Each is refused cleanly (a SOCKS5 error code,
// an HTTP error status, or a close within the handshake timeout), nothing is dialled, and afterwards the
// proxy is ready and serves a valid request.
func TestHostileProxyInput(t *testing.T) {
	t.Parallel() // waits on timeouts; runs alongside the other waiting tests, after the soak
	s := startSSHD(t)
	b := startBackend(t)
	sp := startSocks(t, s)
	if err := socksGet(sp.addr, b.addr); err != nil {
		t.Fatalf("valid request before the hostile ones: %v", err)
	}
	_, bport, _ := net.SplitHostPort(b.addr)
	port, _ := strconv.Atoi(bport)
	// Every hostile exchange runs at once (the incomplete ones wait out the handshake timeout); then each
	// case is judged, and a valid request must still work.
	cases := hostileCases(port)
	outcomes := sendHostile(cases, socksHandshakeLimit+5*time.Second, func(msg []byte, wait time.Duration) (resp []byte, closed bool, elapsed time.Duration, err error) {
		return exchange(sp.addr, msg, wait)
	})
	// Nothing but the valid requests may have reached the backend.
	if got := b.accepted.Load(); got != 1 {
		t.Errorf("the backend accepted %d connections during the hostile requests, want only the 1 valid one before them: a hostile request was dialled", got)
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := outcomes[i]
			if o.err != nil {
				t.Fatal(o.err)
			}
			if !o.closed {
				t.Errorf("connection still open after %s (answer %q)%s", o.wait, head(o.resp), bugNote(tc.bug))
			}
			if err := tc.check(o.resp); err != nil {
				t.Errorf("%v%s", err, bugNote(tc.bug))
			}
			if err := httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", sp.health)); err != nil {
				t.Errorf("proxy not ready afterwards: %v", err)
			}
			if err := socksGet(sp.addr, b.addr); err != nil {
				t.Errorf("valid request afterwards: %v", err)
			}
			t.Logf("answer %q, closed after %s", head(o.resp), o.elapsed.Round(time.Millisecond))
		})
	}
}

func head(b []byte) []byte {
	if len(b) > 24 {
		return b[:24]
	}
	return b
}

// slowloris opens a connection, sends the start of a request and then one more byte-sized piece every
// interval. It returns how long the daemon let it live.
func slowloris(addr string, start []byte, piece []byte, interval, limit time.Duration) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	t0 := time.Now()
	if _, err := c.Write(start); err != nil {
		return time.Since(t0), nil
	}
	buf := make([]byte, 4096)
	for time.Since(t0) < limit {
		_ = c.SetReadDeadline(time.Now().Add(interval))
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return time.Since(t0), nil // closed (or an answer followed by a close)
			}
		}
		if _, err := c.Write(piece); err != nil {
			return time.Since(t0), nil
		}
	}
	return 0, fmt.Errorf("still open after %s of trickling", limit)
}

// TestSlowloris trickles request headers (and a SOCKS5 handshake) into every listener of every daemon:
// server health and admin, agent health and admin, socks proxy and health, proxy. Each cuts the client off
// within its header timeout.
func TestSlowloris(t *testing.T) {
	t.Parallel() // waits on timeouts; runs alongside the other waiting tests, after the soak
	dir := copyBase(t)
	tr := newTokenReviewer(t)
	tokenPath := filepath.Join(dir, "agent-token")
	writeFile(t, tokenPath, tr.goodAgentToken())
	tn := startTunnel(t, dir, tokenServerArgs(tr.kubeconfig(t, dir)), []string{"--service-account-token-path", tokenPath})
	s := startSSHD(t)
	sp := startSocks(t, s)
	px := startProxy(t, tr)

	httpStart := []byte("GET /readyz HTTP/1.1\r\nHost: localhost\r\n")
	httpPiece := []byte("X-Slow: 1\r\n")
	// Header timeouts: 5 s for the daemons' HTTP endpoints, 10 s for the proxies.
	cases := []struct {
		name         string
		addr         string
		start, piece []byte
		timeout      time.Duration
	}{
		{"server-health", fmt.Sprintf("127.0.0.1:%d", tn.sp.health), httpStart, httpPiece, 5 * time.Second},
		{"server-admin", fmt.Sprintf("127.0.0.1:%d", tn.sp.admin), httpStart, httpPiece, 5 * time.Second},
		{"agent-health", fmt.Sprintf("127.0.0.1:%d", tn.agentHlt), httpStart, httpPiece, 5 * time.Second},
		{"agent-admin", fmt.Sprintf("127.0.0.1:%d", tn.agentAdmin), httpStart, httpPiece, 5 * time.Second},
		{"socks-health", fmt.Sprintf("127.0.0.1:%d", sp.health), httpStart, httpPiece, 5 * time.Second},
		{"socks-http", sp.addr, []byte("CONNECT 127.0.0.1:1 HTTP/1.1\r\n"), httpPiece, socksHandshakeLimit},
		{"socks-socks5", sp.addr, []byte{5, 255}, []byte{0x80}, socksHandshakeLimit},
		{"proxy", px.addr, httpStart, httpPiece, 10 * time.Second},
	}
	// All slow clients run at once; then each listener is judged.
	type outcome struct {
		lived time.Duration
		err   error
	}
	outcomes := make([]outcome, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[i].lived, outcomes[i].err = slowloris(tc.addr, tc.start, tc.piece, 500*time.Millisecond, tc.timeout+15*time.Second)
		}()
	}
	wg.Wait()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lived, err := outcomes[i].lived, outcomes[i].err
			if err != nil {
				t.Fatalf("%s: %v (header timeout should be %s)", tc.addr, err, tc.timeout)
			}
			if lived > tc.timeout+3*time.Second {
				t.Errorf("cut off after %s, want within %s", lived.Round(time.Millisecond), tc.timeout)
			}
			t.Logf("cut off after %s (header timeout %s)", lived.Round(time.Millisecond), tc.timeout)
		})
	}
}

// proxyRun is a running konnect proxy in front of the fake API server.
type proxyRun struct {
	p    *harness.Proc
	addr string
}

// proxyKubeconfig points at the fake (it answers every path with 200) with a recognisable token.
const proxyToken = "proxy-user-token-5up3r-s3cr3t-0123456789"

func startProxy(t *testing.T, tr *tokenReviewer, extra ...string) *proxyRun {
	t.Helper()
	dir := shortDir(t)
	kc := tr.kubeconfig(t, dir)
	b, _ := os.ReadFile(kc)
	writeFile(t, kc, strings.Replace(string(b), "konnectivity-server-token-0123456789", proxyToken, 1))
	port := harness.FreePort(t)
	pr := &proxyRun{addr: "127.0.0.1:" + strconv.Itoa(port)}
	pr.p = startKonnect(t, "proxy", append([]string{"proxy", "--kubeconfig", kc, "--port", strconv.Itoa(port)}, extra...)...)
	harness.Eventually(t, 20*time.Second, "proxy serving", func() error {
		if !pr.p.Running() {
			t.Fatalf("proxy exited:\n%s", pr.p.Log())
		}
		return httpOK("http://" + pr.addr + "/version")
	})
	return pr
}

// TestConnectionCap opens connections to konnect socks and konnect proxy without limit: past
// --max-connections, new ones are refused (SOCKS5 general failure or close, HTTP 503) while the held ones
// stay served, and once they close the proxy serves again.
func TestConnectionCap(t *testing.T) {
	t.Parallel() // waits on timeouts; runs alongside the other waiting tests, after the soak
	const limit = 8
	s := startSSHD(t)
	b := startBackend(t)
	tr := newTokenReviewer(t)
	sp := startSocks(t, s, "--max-connections", strconv.Itoa(limit))
	px := startProxy(t, tr, "--max-connections", strconv.Itoa(limit))
	_, bport, _ := net.SplitHostPort(b.addr)
	port, _ := strconv.Atoi(bport)
	// Probes end with "Connection: close" so that a served probe returns at once; the held connections
	// send nothing, and must be counted before their handshake timeout frees them.
	get := "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"

	for _, tc := range []struct {
		name  string
		addr  string
		probe []byte
		check refusal
	}{
		{"socks", sp.addr, append(socksReq(1, port), get...), func(resp []byte) error {
			if err := socksNoSuccess(resp); err != nil {
				return err
			}
			if len(resp) >= 4 && resp[3] != 1 {
				return fmt.Errorf("want general failure (01) or a close, got % x", resp)
			}
			return nil
		}},
		{"proxy", px.addr, []byte(get), httpStatus(503, 503)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			var refusedAt int
			refused := func(resp []byte) bool {
				return len(resp) > 0 && tc.check(resp) == nil && !bytes.Contains(resp, []byte(" 200 "))
			}
			for i := 0; i < 4*limit; i++ {
				resp, _, _, err := exchange(tc.addr, tc.probe, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				// Below the cap, the previous probe's slot may not be released yet: ask again.
				for retry := 0; i < limit && refused(resp) && retry < 20; retry++ {
					time.Sleep(100 * time.Millisecond)
					if resp, _, _, err = exchange(tc.addr, tc.probe, 2*time.Second); err != nil {
						t.Fatal(err)
					}
				}
				if refused(resp) {
					if i < limit {
						t.Fatalf("refused with only %d connections held (limit %d): %q", i, limit, head(resp))
					}
					refusedAt = i
					t.Logf("connection %d refused with % x (%q)", i+1, head(resp), head(resp))
					break
				}
				c, err := net.Dial("tcp", tc.addr)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
			}
			if refusedAt == 0 {
				t.Fatalf("no refusal after holding %d connections (limit %d)", len(held), limit)
			}
			// A held connection may still sit in the accept queue when the probe arrives.
			if refusedAt > limit+2 {
				t.Errorf("first refusal with %d connections held, limit %d", refusedAt, limit)
			}
			for _, c := range held {
				c.Close()
			}
			held = nil
			harness.Eventually(t, 15*time.Second, "served again after the held connections closed", func() error {
				if tc.name == "socks" {
					return socksGet(sp.addr, b.addr)
				}
				return httpOK("http://" + px.addr + "/version")
			})
		})
	}
}

// TestAllowDestination starts an agent with --allow-destination for the backend's port only: a dial
// through the tunnel to the backend works, a dial to another listening port is refused with a reason and
// never reaches it. The refusal, as konnect doctor dial prints it, names --allow-destination.
func TestAllowDestination(t *testing.T) {
	dir := copyBase(t)
	allowed := startBackend(t)
	forbidden := startBackend(t)
	_, aport, _ := net.SplitHostPort(allowed.addr)
	tr := newTokenReviewer(t)
	tokenPath := filepath.Join(dir, "agent-token")
	writeFile(t, tokenPath, tr.goodAgentToken())
	tn := startTunnel(t, dir, tokenServerArgs(tr.kubeconfig(t, dir)),
		[]string{"--service-account-token-path", tokenPath, "--allow-destination", "127.0.0.1/32:" + aport})
	ok := konnect(t, time.Minute, "doctor", "dial", allowed.addr, "--uds-name", tn.uds, "--timeout", "10s", "--request", "GET /")
	if ok.code != 0 {
		t.Fatalf("dial to the allowed destination failed:\n%s", ok)
	}
	bad := konnect(t, time.Minute, "doctor", "dial", forbidden.addr, "--uds-name", tn.uds, "--timeout", "10s")
	if bad.code == 0 {
		t.Errorf("dial outside --allow-destination succeeded:\n%s", bad)
	}
	// The agent's refusal travels back through the tunnel ("error:"), and the doctor explains it ("reason:");
	// both must name the flag that refused the dial.
	var errLine, reasonLine string
	for _, l := range strings.Split(bad.stdout+bad.stderr, "\n") {
		switch l = strings.TrimSpace(l); {
		case strings.HasPrefix(l, "error:"):
			errLine = l
		case strings.HasPrefix(l, "reason:"):
			reasonLine = l
		}
	}
	if !strings.Contains(errLine, "not in --allow-destination") {
		t.Errorf("the agent's refusal (%q) does not say the destination is not in --allow-destination:\n%s", errLine, bad)
	}
	if !strings.Contains(reasonLine, "--allow-destination") {
		t.Errorf("the reason given (%q) does not name --allow-destination:\n%s", reasonLine, bad)
	}
	if n := forbidden.accepted.Load(); n != 0 {
		t.Errorf("the forbidden backend was reached %d times", n)
	}
	if err := httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", tn.agentHlt)); err != nil {
		t.Errorf("agent not ready after the refusal: %v", err)
	}
	t.Logf("refusal seen by the dialler: %s", strings.TrimSpace(bad.stdout+bad.stderr))
}

// TestHostileConnectFrontend sends malformed and hostile requests to konnect server's HTTP CONNECT frontend
// (--mode http-connect on a unix socket, where kube-apiserver's egress selector connects). Each is refused
// with an HTTP error or closed within the header timeout; nothing reaches the backend; the server stays
// ready and a valid CONNECT through the tunnel works afterwards.
func TestHostileConnectFrontend(t *testing.T) {
	t.Parallel() // waits on timeouts; runs alongside the other waiting tests, after the soak
	dir := copyBase(t)
	b := startBackend(t)
	tn := startTunnel(t, dir, append(mtlsServer(dir), "--mode", "http-connect"), mtlsAgent(dir))
	valid := func() error {
		r := konnect(t, time.Minute, "doctor", "dial", b.addr, "--uds-name", tn.uds, "--mode", "http-connect", "--timeout", "10s", "--request", "GET /")
		if r.code != 0 {
			return fmt.Errorf("%s", r)
		}
		return nil
	}
	harness.Eventually(t, 20*time.Second, "valid CONNECT before the hostile ones", valid)
	accepted := b.accepted.Load()
	big := bytes.Repeat([]byte("a"), 1<<20)
	target := b.addr
	cases := []hostileCase{
		{name: "garbage", msg: []byte("\x16\x03\x01garbage\r\n\r\n"), check: httpStatus(400, 499)},
		{name: "not-connect", msg: []byte("GET http://" + target + "/ HTTP/1.1\r\nHost: " + target + "\r\n\r\n"), check: httpStatus(400, 499)},
		{name: "connect-without-port", msg: []byte("CONNECT 127.0.0.1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), check: httpStatus(400, 599)},
		{name: "connect-port-out-of-range", msg: []byte("CONNECT 127.0.0.1:99999 HTTP/1.1\r\nHost: 127.0.0.1:99999\r\n\r\n"), check: httpStatus(400, 599)},
		{name: "oversized-header", msg: append(append([]byte("CONNECT "+target+" HTTP/1.1\r\nX-Big: "), big...), "\r\n\r\n"...), check: httpStatus(400, 499)},
		{name: "truncated-head", msg: []byte("CONNECT " + target + " HTTP/1.1\r\nHost: 127"), check: httpStatus(400, 499), hangs: true},
		{name: "wrong-version", msg: []byte("CONNECT " + target + " HTTP/9.9\r\nHost: " + target + "\r\n\r\n"), check: httpStatus(400, 505)},
	}
	// The frontend's header timeout is 10 s.
	outcomes := sendHostile(cases, 15*time.Second, func(msg []byte, wait time.Duration) (resp []byte, closed bool, elapsed time.Duration, err error) {
		return exchangeOn("unix", tn.uds, msg, wait)
	})
	if got := b.accepted.Load() - accepted; got != 0 {
		t.Errorf("the backend accepted %d connections during the hostile requests", got)
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := outcomes[i]
			if o.err != nil {
				t.Fatal(o.err)
			}
			if !o.closed && !bytes.HasPrefix(o.resp, []byte("HTTP/1.1 4")) && !bytes.HasPrefix(o.resp, []byte("HTTP/1.1 5")) {
				t.Errorf("connection still open after %s without an error answer (answer %q)", o.wait, head(o.resp))
			}
			if err := tc.check(o.resp); err != nil {
				t.Error(err)
			}
			t.Logf("answer %q, closed=%v after %s", head(o.resp), o.closed, o.elapsed.Round(time.Millisecond))
		})
	}
	if err := httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", tn.sp.health)); err != nil {
		t.Errorf("server not ready afterwards: %v", err)
	}
	if err := valid(); err != nil {
		t.Errorf("valid CONNECT afterwards: %v", err)
	}
}
