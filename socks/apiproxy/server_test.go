package apiproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// runServer starts New(cfg).Run and returns the server and a stop function that cancels Run and
// returns its error and how long it took.
func runServer(t *testing.T, cfg Config) (*Server, func() (error, time.Duration)) {
	t.Helper()
	if cfg.Listener == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = ln
	}
	if cfg.APIPrefix == "" {
		cfg.APIPrefix = "/"
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx) }()
	var stopped bool
	var result error
	var took time.Duration
	stop := func() (error, time.Duration) {
		if !stopped {
			stopped = true
			start := time.Now()
			cancel()
			select {
			case result = <-errc:
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return within 30s of cancel")
			}
			took = time.Since(start)
		}
		return result, took
	}
	t.Cleanup(func() { stop() })
	return srv, stop
}

func TestServerServesAndStops(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	srv, stop := runServer(t, Config{HandlerConfig: HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())}})

	addr := srv.Addr().(*net.TCPAddr)
	if addr.Port == 0 || !addr.IP.IsLoopback() {
		t.Fatalf("Addr() = %v, want a loopback address with the chosen port", addr)
	}
	code, body := do(t, "GET", "http://"+addr.String()+"/api", "", "")
	if code != 200 || !strings.HasPrefix(body, "GET /api") {
		t.Fatalf("got %d %q", code, body)
	}
	code, _ = do(t, "GET", "http://"+addr.String()+"/api", "evil.example", "")
	if code != http.StatusForbidden {
		t.Fatalf("Host evil.example: got %d, want 403", code)
	}
	if err, _ := stop(); err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	if _, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		t.Fatal("the listener is still open after Run returned")
	}
}

// A client that sends its headers slowly (slowloris) is cut off after ReadHeaderTimeout; an idle
// keep-alive connection after IdleTimeout.
func TestServerCutsOffSlowAndIdleClients(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	srv, _ := runServer(t, Config{
		HandlerConfig:     HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())},
		ReadHeaderTimeout: 300 * time.Millisecond,
		IdleTimeout:       300 * time.Millisecond,
	})

	t.Run("slow headers", func(t *testing.T) {
		conn, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "GET /api HTTP/1.1\r\nHost: localhost\r\n")
		start := time.Now()
		// Trickle a header byte at a time; the server must close the connection.
		closed := false
		for time.Since(start) < 5*time.Second {
			if _, err := io.WriteString(conn, "X"); err != nil {
				closed = true
				break
			}
			_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := conn.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				closed = true
				break
			}
		}
		if !closed {
			t.Fatal("a client trickling its headers was not cut off within 5s")
		}
		if d := time.Since(start); d < 250*time.Millisecond {
			t.Fatalf("cut off after %v, before ReadHeaderTimeout", d)
		}
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		conn, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "GET /api HTTP/1.1\r\nHost: localhost\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := br.ReadByte(); err == nil || isTimeout(err) {
			t.Fatalf("idle connection not closed by the server: %v", err)
		}
	})
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestServerCapsConnections(t *testing.T) {
	p := newTestPKI(t)
	var s seen
	backend := p.newTLSBackend(t, "", echoBackend(&s))
	_, rc := p.kubeconfig(t, backend.URL, "")
	srv, _ := runServer(t, Config{HandlerConfig: HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())}, MaxConnections: 2})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The listener hands out slots in Accept order; make sure both are taken before the third dial.
	for _, c := range held {
		fmt.Fprintf(c, "GET /api HTTP/1.1\r\nHost: localhost\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	third, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	_ = third.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(decodeStatus(t, resp.StatusCode, string(b)).Message, "too many connections") {
		t.Fatalf("third connection: %s %q, want 503 too many connections", resp.Status, b)
	}
	// Freeing a slot lets the next client in. Each try is a fresh connection: a refused one is closed by the
	// server, and a pooled client could pick such a connection up and fail on it.
	held[0].Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code := 0
		resp, err := client.Get("http://" + srv.Addr().String() + "/api")
		if err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still refused after a slot was freed: %d %v", code, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	held[1].Close()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// On shutdown, an open watch and an upgraded connection end at once, while a plain request in flight gets
// the grace period to finish.
func TestServerShutdownEndsStreamsAndDrainsRequests(t *testing.T) {
	p := newTestPKI(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	slowStarted := make(chan struct{})
	backend := p.newTLSBackend(t, "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Query().Get("watch") == "true":
			w.WriteHeader(200)
			http.NewResponseController(w).Flush()
			<-r.Context().Done()
		case r.URL.Path == "/slow":
			close(slowStarted)
			select {
			case <-release:
				_, _ = io.WriteString(w, "finished")
			case <-r.Context().Done():
			}
		default:
			upgradeBackend(t).ServeHTTP(w, r)
		}
	}))
	_, rc := p.kubeconfig(t, backend.URL, "")
	srv, stop := runServer(t, Config{HandlerConfig: HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())}, ShutdownGrace: 10 * time.Second})
	base := "http://" + srv.Addr().String()

	watch, err := http.Get(base + "/api/v1/pods?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Body.Close()
	upConn, upReader, resp := dialUpgrade(t, base, "/api/v1/namespaces/a/pods/b/portforward")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-slowStarted

	stopped := make(chan time.Duration, 1)
	go func() {
		_, took := stop()
		stopped <- took
	}()
	// The watch and the upgraded connection end without waiting for the grace period.
	watchDone := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, watch.Body); watchDone <- err }()
	select {
	case <-watchDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch was not ended by shutdown")
	}
	_ = upConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := upReader.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("the upgraded connection was not closed by shutdown: %v", err)
	}
	// The plain request is still allowed to finish.
	releaseOnce.Do(func() { close(release) })
	if got := <-slow; got != "finished" {
		t.Fatalf("request in flight during shutdown got %q", got)
	}
	if took := <-stopped; took > 5*time.Second {
		t.Fatalf("Run took %v to return", took)
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// The listener's timeouts are for idle and slow clients only: a watch with gaps between events, and an
// upgraded connection that stays quiet, both outlive them.
func TestServerTimeoutsSpareStreams(t *testing.T) {
	const timeout = 150 * time.Millisecond
	p := newTestPKI(t)
	backend := p.newTLSBackend(t, "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			upgradeBackend(t).ServeHTTP(w, r)
			return
		}
		for i := range 3 {
			fmt.Fprintf(w, "event %d\n", i)
			_ = http.NewResponseController(w).Flush()
			select {
			case <-time.After(3 * timeout):
			case <-r.Context().Done():
				return
			}
		}
	}))
	_, rc := p.kubeconfig(t, backend.URL, "")
	srv, _ := runServer(t, Config{
		HandlerConfig:     HandlerConfig{REST: rc, Filter: mustFilter(t, DefaultFilterSpec())},
		ReadHeaderTimeout: timeout,
		IdleTimeout:       timeout,
	})
	base := "http://" + srv.Addr().String()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(base + "/api/v1/pods?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != "event 0\nevent 1\nevent 2\n" {
		t.Fatalf("watch with gaps longer than the timeouts: %q, %v", body, err)
	}

	conn, br, uresp := dialUpgrade(t, base, "/api/v1/namespaces/a/pods/b/portforward")
	if uresp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", uresp.Status)
	}
	time.Sleep(4 * timeout)
	if _, err := io.WriteString(conn, "still there?\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "echo: still there?\n" {
		t.Fatalf("quiet upgraded connection after the timeouts: %q, %v", line, err)
	}
}
