package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
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

// TestServeLimitsConnectionsPerSource: a health, metrics or admin endpoint takes at most MaxConnsPerSource
// connections from one source address at once (each also bounded in time by the timeouts); beyond, a new
// one is reset, while other sources are served, and the source is served again once it closes some.
func TestServeLimitsConnectionsPerSource(t *testing.T) {
	ln, err := Listen("tcp", "127.0.0.1:0", false, "--health-port")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, NewHealthMux(nil, nil, prometheus.NewRegistry())) }()
	defer func() { cancel(); <-done }()
	addr := ln.Addr().String()

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range MaxConnsPerSource {
		c, err := harness.DialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if c, err := harness.DialFrom("127.0.0.1", addr); err == nil {
		defer c.Close()
		if !reset(c) {
			t.Fatalf("connection %d from one source was kept", MaxConnsPerSource+1)
		}
	}
	if reset(held[0]) {
		t.Fatal("a connection within the bound was reset")
	}
	if err := getFrom("127.0.0.2", addr); err != nil {
		t.Fatalf("another source is not served: %v", err)
	}
	for _, c := range held[:8] {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for err := getFrom("127.0.0.1", addr); err != nil; err = getFrom("127.0.0.1", addr) {
		if time.Now().After(deadline) {
			t.Fatalf("the source is not served again after closing connections: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
