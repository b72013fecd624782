package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"github.com/prometheus/client_golang/prometheus"
)

// reset reports whether the server reset or closed c (rather than waiting for its request).
func reset(c net.Conn) bool { return !harness.OpenAfter(c, 300*time.Millisecond) }

func getFrom(src, addr string) error {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(context.Context, string, string) (net.Conn, error) { return harness.DialFrom(src, addr) }}}
	res, err := c.Get("http://" + addr + "/livez")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != 200 {
		return fmt.Errorf("%s", res.Status)
	}
	return nil
}

// healthServer is the health mux served as Endpoints serves it, with what tests look into.
type healthServer struct {
	addr  string
	limit *SourceLimit
	reads *readCounter // below the limit
	reg   *prometheus.Registry
	stop  func()
}

// serveHealth serves the health mux as Endpoints does, counting what the limit cuts on its registry.
func serveHealth(t *testing.T) *healthServer {
	t.Helper()
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	s := &healthServer{addr: ln.Addr().String(), reads: &readCounter{Listener: ln, read: map[string]*atomic.Int64{}},
		reg: prometheus.NewRegistry()}
	rejected := newRejectedConns()
	s.reg.MustRegister(rejected)
	s.limit = countRejections(LimitPerSource(s.reads, MaxConnsPerSource), rejected, "health")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveLimited(ctx, s.limit, NewHealthMux(nil, nil, s.reg)) }()
	s.stop = func() { cancel(); <-done }
	return s
}

// rejected is the count of connections cut for reason on the port ("evicted" or "refused"), from reg.
func rejected(t *testing.T, reg prometheus.Gatherer, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != RejectedConnsMetric {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// wantRejected fails t unless reg counts evicted and refused connections.
func wantRejected(t *testing.T, reg prometheus.Gatherer, evicted, refused float64) {
	t.Helper()
	if got := rejected(t, reg, "evicted"); got != evicted {
		t.Errorf("%s{reason=\"evicted\"} = %v, want %v", RejectedConnsMetric, got, evicted)
	}
	if got := rejected(t, reg, "refused"); got != refused {
		t.Errorf("%s{reason=\"refused\"} = %v, want %v", RejectedConnsMetric, got, refused)
	}
}

// readCounter is a listener whose connections count the bytes the server has read from them, by the
// client's address.
type readCounter struct {
	net.Listener
	mu   sync.Mutex
	read map[string]*atomic.Int64
}

func (l *readCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := &atomic.Int64{}
	l.mu.Lock()
	l.read[c.RemoteAddr().String()] = n
	l.mu.Unlock()
	return &countedConn{Conn: c, n: n}, nil
}

// readFrom is how many bytes the server has read from the client connection c.
func (l *readCounter) readFrom(c net.Conn) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.read[c.LocalAddr().String()]; n != nil {
		return n.Load()
	}
	return 0
}

type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// serving counts the connections from src that l holds with a request being served: the server has read
// its headers and not finished its response.
func serving(l *SourceLimit, src netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns[src] {
		if c.waitingSince.Load() == 0 {
			n++
		}
	}
	return n
}

// closedOf counts the connections of cs that the server has closed or reset: each is read until a deadline
// 300 ms away, all at once.
func closedOf(cs []net.Conn) int {
	var wg sync.WaitGroup
	var closed atomic.Int32
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if reset(c) {
				closed.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(closed.Load())
}

// TestServeEvictsQuietConnectionsAtTheBound: kubelet's probe shares its source (loopback, or the node's
// address) with every other process there, so a process that holds the source's share of connections
// without using them (a scraper that leaks keep-alive connections, a script) must not get the probe
// refused. At the bound a new connection takes the place of the one idle longest, so that the source still
// holds at most MaxConnsPerSource.
func TestServeEvictsQuietConnectionsAtTheBound(t *testing.T) {
	s := serveHealth(t)
	defer s.stop()
	addr := s.addr
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// The source's share, each an idle keep-alive connection that did one request.
	for range MaxConnsPerSource {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("request on connection %d: %v", len(held), err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || res.Close {
			t.Fatalf("request on connection %d: %s, close %v; want 200 and the connection kept", len(held), res.Status, res.Close)
		}
	}
	// Connections that never send a byte; the server's header timeout (5 s) must not run out before the
	// end of the test, so nothing here waits long.
	const silent = 8
	for i := range silent {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Errorf("connection %d past the bound refused while the source's others are quiet: %v", i+1, err)
			continue
		}
		held = append(held, c)
	}
	if err := getFrom("127.0.0.1", addr); err != nil {
		t.Fatalf("/livez from a source whose connections are all quiet: %v", err)
	}
	// The bound still holds: the silent ones and the probe each took the place of one connection.
	if n := closedOf(held); n != silent+1 {
		t.Fatalf("%d of the %d connections held were closed, want %d", n, len(held), silent+1)
	}
	// Each closed one counted as it was closed, none as refused.
	wantRejected(t, s.reg, silent+1, 0)
}

// TestServeLimitsConnectionsPerSource: a health, metrics or admin endpoint takes at most MaxConnsPerSource
// connections from one source address at once. While every one of them has a request being served (here a
// handler that waits), none is evicted: a new one is reset as it is accepted, while other sources are
// served, and the source is served again once the requests are done.
func TestServeLimitsConnectionsPerSource(t *testing.T) {
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	reg := prometheus.NewRegistry()
	counts := newRejectedConns()
	reg.MustRegister(counts)
	limit := countRejections(LimitPerSource(ln, MaxConnsPerSource), counts, "health")
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(MaxConnsPerSource)
	mux := NewHealthMux(nil, nil, reg)
	mux.HandleFunc("/wait", func(w http.ResponseWriter, r *http.Request) {
		started.Done()
		<-release
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveLimited(ctx, limit, mux) }()
	released := false
	defer func() {
		if !released {
			close(release)
		}
		cancel()
		<-done
	}()

	var busy []net.Conn
	defer func() {
		for _, c := range busy {
			c.Close()
		}
	}()
	for range MaxConnsPerSource {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		busy = append(busy, c)
		if _, err := io.WriteString(c, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	waited := make(chan struct{})
	go func() { started.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(ReadTimeout / 2):
		t.Fatalf("the requests did not all reach their handler")
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	if n := serving(limit, loopback); n != MaxConnsPerSource {
		t.Fatalf("%d of %d connections in their handler are counted as being served", n, MaxConnsPerSource)
	}

	if c, err := harness.DialFrom("127.0.0.1", addr); err == nil {
		defer c.Close()
		if !reset(c) {
			t.Fatalf("connection %d from one source was kept while the others were being served", MaxConnsPerSource+1)
		}
	}
	if err := getFrom("127.0.0.1", addr); err == nil {
		t.Fatal("/livez was served past the bound while every connection of the source was being served")
	}
	if n := closedOf(busy); n != 0 {
		t.Fatalf("%d connections within the bound, being served, were closed", n)
	}
	if err := getFrom("127.0.0.2", addr); err != nil {
		t.Fatalf("another source is not served: %v", err)
	}
	// The connection and the /livez past the bound, each reset as it was accepted; nothing evicted.
	wantRejected(t, reg, 0, 2)

	close(release)
	released = true
	for i, c := range busy {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("the response on busy connection %d: %v", i, err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("the response on busy connection %d: %s", i, res.Status)
		}
	}
	// Done, they are idle keep-alive connections: a new one takes the place of one.
	if err := getFrom("127.0.0.1", addr); err != nil {
		t.Fatalf("the source is not served once its requests are done: %v", err)
	}
	wantRejected(t, reg, 1, 2)
}

// held counts the connections from src that l holds open.
func held(l *SourceLimit, src netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns[src])
}

// trickle writes request to c a byte every interval, never the last byte, until stop closes or a write fails.
func trickle(c net.Conn, request string, interval time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; i < len(request)-1; i++ {
		if _, err := io.WriteString(c, request[i:i+1]); err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// TestServeEvictsHeaderTricklersAtTheBound: a local process that holds its source's share of connections,
// each trickling its request headers a byte at a time (well within the header timeout), must not get
// kubelet's probe, which shares the source, reset. At the bound a new connection takes the place of the
// source's connection that has been waiting longest for a complete request, so the probe is answered at
// once, not after the header timeout, and the source still holds at most MaxConnsPerSource.
func TestServeEvictsHeaderTricklersAtTheBound(t *testing.T) {
	s := serveHealth(t)
	defer s.stop()
	addr, limit := s.addr, s.limit

	var tricklers []net.Conn
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		for _, c := range tricklers {
			c.Close()
		}
		wg.Wait()
	}()
	loopback := netip.MustParseAddr("127.0.0.1")
	// holds waits until the source holds n connections.
	holds := func(n int) {
		t.Helper()
		if err := harness.Poll(fmt.Sprintf("the source holding %d connections", n), 5*time.Second, 5*time.Millisecond, func() error {
			if got := held(limit, loopback); got != n {
				return fmt.Errorf("it holds %d", got)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// fill opens n tricklers, each sending a byte of its request every 100 ms, and waits until the source
	// holds its share.
	fill := func(n int) {
		t.Helper()
		for range n {
			c, err := harness.DialFrom("127.0.0.1", addr)
			if err != nil {
				t.Fatal(err)
			}
			tricklers = append(tricklers, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				trickle(c, "GET /livez HTTP/1.1\r\nHost: x\r\nUser-Agent: trickler\r\n\r\n", 100*time.Millisecond, done)
			}()
		}
		holds(MaxConnsPerSource)
	}
	start := time.Now()
	fill(MaxConnsPerSource)
	// Each is in the middle of its headers: the server has read a few bytes of each, and none of them is
	// complete (a byte every 100 ms).
	const started = 3
	if err := harness.Poll(fmt.Sprintf("the server reading %d bytes of each trickler's headers", started), 3*time.Second, 5*time.Millisecond, func() error {
		for i, c := range tricklers {
			if n := s.reads.readFrom(c); n < started {
				return fmt.Errorf("%d bytes read from trickler %d", n, i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	probeStart := time.Now()
	if err := getFrom("127.0.0.1", addr); err != nil {
		t.Fatalf("/livez from a source whose connections all trickle their headers: %v", err)
	}
	if took := time.Since(probeStart); took > 2*time.Second {
		t.Fatalf("/livez took %v past the tricklers, want it at once", took)
	}
	probes := 1
	if path, err := exec.LookPath("curl"); err != nil {
		t.Log("curl is not installed; probed with net/http only")
	} else {
		holds(MaxConnsPerSource - 1) // the probe's connection is gone: one more trickler takes its place
		fill(1)
		out, err := exec.Command(path, "-sS", "--max-time", "2", "-o", "/dev/null", "-w", "%{http_code}",
			"http://"+addr+"/livez").CombinedOutput()
		if err != nil || string(out) != "200" {
			t.Fatalf("curl /livez from a source whose connections all trickle their headers: %v, %q", err, out)
		}
		probes++
	}
	if since := time.Since(start); since > ReadHeaderTimeout*4/5 {
		t.Fatalf("the test took %v, too close to the header timeout (%v) to show eviction", since, ReadHeaderTimeout)
	}
	// Each probe took the place of the oldest trickler; the others still trickle.
	if n := closedOf(tricklers); n != probes {
		t.Fatalf("%d of the %d tricklers were closed, want %d (one for each probe)", n, len(tricklers), probes)
	}
	for i, c := range tricklers[:probes] {
		if !reset(c) {
			t.Errorf("trickler %d, among the oldest, was kept", i)
		}
	}
	wantRejected(t, s.reg, float64(probes), 0)
}

// TestServeStopsWithoutWaitingForRequests: a stop does not wait for connections that have not delivered a
// complete request (one that sent nothing yet, one trickling its headers, one idle between requests): Serve
// returns at once, where http.Server's Shutdown alone waited for the first two until they were 5 s old (up
// to ShutdownGrace). A request being served is still waited for and answered.
func TestServeStopsWithoutWaitingForRequests(t *testing.T) {
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	limit := LimitPerSource(ln, MaxConnsPerSource)
	release, started := make(chan struct{}), make(chan struct{})
	mux := NewHealthMux(nil, nil, prometheus.NewRegistry())
	mux.HandleFunc("/wait", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serveLimited(ctx, limit, mux) }()

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(request string) net.Conn {
		t.Helper()
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		return c
	}
	dial("")                          // sends nothing
	dial("GET /livez HTTP/1.1\r\nHo") // headers not complete
	idle := dial("GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(idle)
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if res, err := http.ReadResponse(br, nil); err != nil {
		t.Fatal(err)
	} else {
		res.Body.Close()
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	if err := harness.Poll("the connections accepted", 5*time.Second, 5*time.Millisecond, func() error {
		if n := held(limit, loopback); n != 3 {
			return fmt.Errorf("%d of 3", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(ReadHeaderTimeout):
		t.Fatalf("Serve did not return within %v of its stop", ReadHeaderTimeout)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Serve returned %v after its stop, waiting for connections without a request being served", took)
	}

	// A request being served at the stop is waited for.
	ln, err = Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	limit = LimitPerSource(ln, MaxConnsPerSource)
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- serveLimited(ctx, limit, mux) }()
	busy := dial("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
	<-started
	cancel()
	select {
	case <-done:
		t.Fatal("Serve returned while a request was being served")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	_ = busy.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatalf("the request being served at the stop: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("the request being served at the stop: %s", res.Status)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// scrapeRejections reads, from the /metrics that addr serves, RejectedConnsMetric{port,reason}; -1 when the
// series is missing.
func scrapeRejections(t *testing.T, addr, port, reason string) float64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	res, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	series := fmt.Sprintf(`%s{port=%q,reason=%q} `, RejectedConnsMetric, port, reason)
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s%s: %v", series, v, err)
			}
			return f
		}
	}
	return -1
}

// TestServeEndpointsCountRejections: the connections the per-source bound cuts on a daemon's health or
// admin port (Endpoints, as every daemon serves them) are counted on the daemon's /metrics, by port and
// reason, each series there from 0 so that a rate can be taken before the first one.
func TestServeEndpointsCountRejections(t *testing.T) {
	var e Endpoints
	var err error
	if e.Health, err = Listen("tcp", "127.0.0.1:0", false, "--health-port"); err != nil {
		t.Fatal(err)
	}
	if e.Admin, err = Listen("tcp", "127.0.0.1:0", false, "--admin-port"); err != nil {
		e.Health.Close()
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := e.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	e.HealthMux, e.AdminMux = NewHealthMux(nil, nil, reg), NewAdminMux(false, false)
	health, admin := e.Health.Addr().String(), e.Admin.Addr().String()
	var g Group
	e.AddTo(&g)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() { cancel(); <-done }()

	for _, port := range []string{"health", "admin"} {
		for _, reason := range []string{"evicted", "refused"} {
			if v := scrapeRejections(t, health, port, reason); v != 0 {
				t.Errorf("%s{port=%q,reason=%q} = %v before any connection was cut, want 0", RejectedConnsMetric, port, reason, v)
			}
		}
	}
	// The admin port's share from one source, silent connections; one more takes the place of one.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range MaxConnsPerSource + 1 {
		c, err := harness.DialFrom("127.0.0.1", admin)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// Scraped on the health port, whose bound is its own.
	if err := harness.Poll("the eviction on the admin port counted", 4*time.Second, 10*time.Millisecond, func() error {
		if v := scrapeRejections(t, health, "admin", "evicted"); v != 1 {
			return fmt.Errorf("admin evicted = %v", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, s := range [][2]string{{"admin", "refused"}, {"health", "evicted"}, {"health", "refused"}} {
		if v := scrapeRejections(t, health, s[0], s[1]); v != 0 {
			t.Errorf("%s{port=%q,reason=%q} = %v, want 0", RejectedConnsMetric, s[0], s[1], v)
		}
	}
}
