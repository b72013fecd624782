//go:build integration

package tunnel

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/server/egressselector"
)

// kubeAPIServerDialer is kube-apiserver's own egress dialer (its --egress-selector-config-file code) for the
// server's socket in mode: konnectivity-client's single-use tunnel for "grpc", and for "http-connect" a
// CONNECT whose dial fails when data came in the same read as the 200.
func kubeAPIServerDialer(t *testing.T, uds, mode string) utilnet.DialFunc {
	t.Helper()
	protocol := apiserver.ProtocolGRPC
	if mode == "http-connect" {
		protocol = apiserver.ProtocolHTTPConnect
	}
	sel, err := egressselector.NewEgressSelector(&apiserver.EgressSelectorConfiguration{
		EgressSelections: []apiserver.EgressSelection{{Name: "cluster", Connection: apiserver.Connection{
			ProxyProtocol: protocol,
			Transport:     &apiserver.Transport{UDS: &apiserver.UDSTransport{UDSName: uds}},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := sel.Lookup(egressselector.Cluster.AsNetworkContext())
	if err != nil || d == nil {
		t.Fatalf("egress selector lookup: %v", err)
	}
	return d
}

// readServerFirst dials addr with dial and reads to the end: what the backend sent, and how the read ended.
func readServerFirst(dial utilnet.DialFunc, addr string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return readAllWithin(c, 20*time.Second)
}

// countingReader reads c to its end in the background, counting what arrives.
type countingReader struct {
	n    atomic.Int64
	done chan struct{}
	got  []byte
	err  error
}

func readInBackground(c net.Conn) *countingReader {
	r := &countingReader{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			r.got = append(r.got, buf[:n]...)
			r.n.Add(int64(n))
			if err != nil {
				if err != io.EOF {
					r.err = err
				}
				return
			}
		}
	}()
	return r
}

// TestServerFirstBackendUpstreamAgent: a backend that speaks first, read through konnect's server and
// upstream's proxy-agent by kube-apiserver's own dialer, arrives whole. Upstream's agent sends the
// backend's first data right behind its DIAL_RSP; without the server holding it, konnectivity-client drops
// it ("Connection not recognized") and reports a clean end of stream after a truncated one, and
// kube-apiserver's CONNECT dialer refuses a 200 that came with data.
func TestServerFirstBackendUpstreamAgent(t *testing.T) {
	const size, runs = 1 << 20, 30
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			s := start(t, cfg)
			startUpstreamAgent(t, e, "agent-1", s.agentPort())
			s.waitAgents(t, 1)
			addr := startServerFirstBackend(t, size)
			dial := kubeAPIServerDialer(t, cfg.UDSName, mode)

			var failed []string
			deadline := time.Now().Add(90 * time.Second)
			i := 0
			for ; i < runs && time.Now().Before(deadline); i++ {
				got, err := readServerFirst(dial, addr)
				switch {
				case err != nil:
					failed = append(failed, err.Error())
				case len(got) != size:
					failed = append(failed, fmt.Sprintf("read %d bytes, then a clean end of stream", len(got)))
				default:
					checkPattern(t, got, 0)
				}
			}
			t.Logf("%s: %d of %d runs read all %d bytes", mode, i-len(failed), i, size)
			if i < runs {
				t.Errorf("only %d of %d runs within 90s", i, runs)
			}
			if len(failed) > 0 {
				t.Fatalf("%d of %d runs failed, first: %s", len(failed), i, failed[0])
			}
		})
	}
}

// TestFirstDataHoldWaitsOnlyForItsTunnel: with upstream's agent, the server holds a tunnel's first data
// until its client sends something, and only that tunnel waits. Under a hold made a minute long, a
// client-first request on another tunnel through the same agent is answered at once (no hold for HTTP, and
// the agent's stream keeps flowing), the held tunnel's data comes as soon as its client writes, and a
// server-first tunnel whose client stays silent gets its data once the queue fills, long before the hold
// would end.
func TestFirstDataHoldWaitsOnlyForItsTunnel(t *testing.T) {
	const long = time.Minute
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(mode)
			s := startWithFirstDataHold(t, cfg, long)
			startUpstreamAgent(t, e, "agent-1", s.agentPort())
			s.waitAgents(t, 1)
			web := startHTTPBackend(t)
			small, large := startServerFirstBackend(t, 1<<20), startServerFirstBackend(t, 3*flow.DefaultLimit)
			dial := kubeAPIServerDialer(t, cfg.UDSName, mode)

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			held, err := dial(ctx, "tcp", small)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			r := readInBackground(held)
			time.Sleep(500 * time.Millisecond)
			if n := r.n.Load(); n != 0 {
				t.Fatalf("read %d bytes before the client sent anything; want the first data held", n)
			}

			start := time.Now()
			c, err := dial(ctx, "tcp", web)
			if err != nil {
				t.Fatal(err)
			}
			res, body := httpGet(t, c, web, "/")
			c.Close()
			if res.StatusCode != 200 || string(body) != "hello from backend\n" {
				t.Fatalf("got %s %q", res.Status, body)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("an HTTP request took %v while another tunnel's first data was held", d)
			}

			start = time.Now()
			if _, err := held.Write([]byte{0}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-r.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("%d bytes 20s after the client wrote", r.n.Load())
			}
			if r.err != nil || len(r.got) != 1<<20 {
				t.Fatalf("after the client wrote: %d bytes, %v", len(r.got), r.err)
			}
			checkPattern(t, r.got, 0)
			t.Logf("held data came in %v after the client wrote", time.Since(start))

			start = time.Now()
			got, err := readServerFirst(dial, large)
			if err != nil || len(got) != 3*flow.DefaultLimit {
				t.Fatalf("silent client: %d bytes, %v", len(got), err)
			}
			checkPattern(t, got, 0)
			if d := time.Since(start); d > long/2 {
				t.Fatalf("a silent client's data took %v: the hold did not end when the queue filled", d)
			}
		})
	}
}

// TestHalfCloseEndsConnectionUpstreamAgent: checkHalfCloseEndsConnection with upstream's proxy-agent, which
// may drop the request it has not yet written when the close comes.
func TestHalfCloseEndsConnectionUpstreamAgent(t *testing.T) {
	e := newEnv(t)
	s := start(t, e.config("http-connect"))
	startUpstreamAgent(t, e, "agent-1", s.agentPort())
	s.waitAgents(t, 1)
	checkHalfCloseEndsConnection(t, s, false)
}
