//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// checkSlowReader: a developer on lap reads a pod's 64 MiB file through `kubectl port-forward` over konnect
// socks at 64 KB/s, as over a hotel link. Everything the pod sends backs up towards lap through kube-apiserver
// and the tunnel to w1's agent, which also carries the APIService (sample-apiserver) and the validating
// and conversion webhook (pizza-webhook) that run on w1. Requests to both must keep their latency while the
// reader dawdles (ANP issue 180: without per-connection flow control the agent's one stream waits for the
// slowest reader, and with failurePolicy Fail every write the webhook guards fails cluster-wide), and the
// reader, once it speeds up, must get every byte.
func (nc *nodeCluster) checkSlowReader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const pod = "bb-" + nsW1
	want := strings.Fields(mustOut(t)(nc.kubectl(ctx, nsCP, "exec", pod, "--", "sha256sum", "/tmp/www/big")))[0]
	client, err := nc.apiHTTPClient(nsCP)
	if err != nil {
		t.Fatal(err)
	}
	// One round: a GET of flunders (the APIService) and a dry-run create of a Pizza (the validating webhook,
	// and the conversion webhook for the v1alpha1 the Pizza is sent as), each timed.
	pizza := `{"apiVersion":"restaurant.example.com/v1alpha1","kind":"Pizza","metadata":{"generateName":"slow-","namespace":"pizza"},"spec":{"toppings":["cheese"]}}`
	round := func() ([]time.Duration, error) {
		var took []time.Duration
		t0 := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		if err := httpGetOK(rctx, client, fmt.Sprintf("https://%s:%d%s", cpAddr, apiPort, flundersPath), nil); err != nil {
			return nil, fmt.Errorf("APIService: %w", err)
		}
		took = append(took, time.Since(t0))
		t0 = time.Now()
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, fmt.Sprintf("https://%s:%d%s?dryRun=All", cpAddr, apiPort, pizzasV1alpha1), strings.NewReader(pizza))
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("webhook: %w", err)
		}
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			return nil, fmt.Errorf("webhook: dry-run create of a Pizza: %s: %s", res.Status, body)
		}
		return append(took, time.Since(t0)), nil
	}
	measure := func(what string, rounds int) []time.Duration {
		var all []time.Duration
		for range rounds {
			took, err := round()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			all = append(all, took...)
			time.Sleep(200 * time.Millisecond)
		}
		slices.Sort(all)
		t.Logf("%s: p50 %v, max %v over %d requests", what, all[len(all)/2].Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond), len(all))
		return all
	}
	alone := measure("APIService and webhook alone", 10)

	lapConf := nc.startLaptop(t).kubeconfig
	const port = 18099
	pf := startProcT(t, "kubectl-port-forward-slow", nc.tp.ns(nsLap), nc.logDir, bins.kubectl, "--kubeconfig", lapConf,
		"port-forward", "pod/"+pod, fmt.Sprintf("%d:8080", port))
	if err := harness.Poll("kubectl port-forward to listen", 30*time.Second, 200*time.Millisecond, func() error {
		if err := pf.Exited(); err != nil {
			return err
		}
		if !strings.Contains(pf.Log(), "Forwarding from") {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c, err := harness.DialIn(ctx, nc.tp.ns(nsLap), fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	var fast atomic.Bool
	type got struct {
		n   int64
		sum string
		err error
	}
	done := make(chan got, 1)
	go func() {
		res, err := http.ReadResponse(bufio.NewReaderSize(slowConn{c, &fast}, 8<<10), nil)
		if err != nil {
			done <- got{err: err}
			return
		}
		defer res.Body.Close()
		h := sha256.New()
		n, err := io.Copy(h, res.Body)
		done <- got{n, hex.EncodeToString(h.Sum(nil)), err}
	}()
	time.Sleep(5 * time.Second) // the pod's file backs up along the whole path
	beside := measure("APIService and webhook beside a 64 KB/s reader on the same node", 10)
	fast.Store(true)
	r := <-done
	if r.err != nil || r.sum != want {
		t.Fatalf("the slow reader got %d bytes, sha256 %s (want %s): %v", r.n, r.sum, want, r.err)
	}
	pf.res.release()
	p99 := func(d []time.Duration) time.Duration { return d[len(d)*99/100] }
	// The bound leaves room for a loaded machine; without flow control these requests take seconds to
	// minutes, or time out.
	if bound := 2*p99(alone) + time.Second; p99(beside) > bound {
		t.Fatalf("beside the slow reader the APIService and webhook took up to %v, over twice their %v alone plus 1 s",
			p99(beside), p99(alone))
	}
	t.Logf("the slow reader got all 64 MiB (sha256 matches) after the requests beside it were measured")
}

// slowConn reads 8 KiB every 125 ms (64 KB/s) until fast is set.
type slowConn struct {
	net.Conn
	fast *atomic.Bool
}

func (s slowConn) Read(b []byte) (int, error) {
	if s.fast.Load() {
		return s.Conn.Read(b)
	}
	n, err := s.Conn.Read(b[:min(len(b), 8<<10)])
	time.Sleep(125 * time.Millisecond)
	return n, err
}

// mustOut fails t on a command's error and returns its output.
func mustOut(t *testing.T) func(string, error) string {
	return func(out string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}
