package agentcmd

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"
)

// TestNewStartsNoWatch: New builds the lease watch of --count-server-leases but starts nothing (no goroutine,
// no request); Run starts it, and an agent that is closed without running never asks the API server for
// anything.
func TestNewStartsNoWatch(t *testing.T) {
	var requests atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "not here", http.StatusServiceUnavailable)
	}))
	defer api.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "+api.URL+
		"\ncontexts:\n- name: c\n  context:\n    cluster: c\ncurrent-context: c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, caFile, _, _ := testServer(t)
	host, port, _ := net.SplitHostPort(addr)
	newAgent := func() *Agent {
		o := NewOptions()
		fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse([]string{"--ca-cert=" + caFile, "--proxy-server-host=" + host, "--proxy-server-port=" + port,
			"--health-server-host=127.0.0.1", "--health-server-port=" + freePort(t), "--admin-server-port=" + freePort(t),
			"--count-server-leases", "--kubeconfig=" + kubeconfig}); err != nil {
			t.Fatal(err)
		}
		cfg, err := o.Config()
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}

	// Closed without running: no goroutine and no request, then or later.
	before := goleak.IgnoreCurrent()
	a := newAgent()
	if err := goleak.Find(before); err != nil {
		t.Errorf("New started goroutines: %v", err)
	}
	time.Sleep(time.Second) // the informer's first list goes out at once when it runs
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if n := requests.Load(); n != 0 {
		t.Fatalf("%d requests to the API server from an agent that never ran", n)
	}

	// Run starts the watch, and stops it when it returns.
	a = newAgent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for requests.Load() == 0 {
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("Run never started the lease watch")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	after := requests.Load()
	time.Sleep(500 * time.Millisecond)
	if n := requests.Load(); n != after {
		t.Errorf("%d requests to the API server after Run returned", n-after)
	}
}
