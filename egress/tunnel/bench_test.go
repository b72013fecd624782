package tunnel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// stack is one complete tunnel: a server with an agent connected, and the frontend to dial through.
type stack struct {
	name  string
	start func(tb testing.TB, e *env) (Frontend, func())
}

var stacks = []stack{
	{"konnect", func(tb testing.TB, e *env) (Frontend, func()) {
		cfg := e.config("grpc")
		cfg.UDSName = filepath.Join(e.dir, "k.sock")
		s := start(tb, cfg)
		stopAgent := startKonnectAgent(tb, e, "bench-konnect", s.agentPort())
		s.waitAgents(tb, 1)
		return s.frontend("grpc"), func() { stopAgent(); s.Stop(tb) }
	}},
	{"konnect-without-flow-control", func(tb testing.TB, e *env) (Frontend, func()) {
		cfg := e.config("grpc")
		cfg.UDSName = filepath.Join(e.dir, "kn.sock")
		cfg.DisableFlowControl = true
		s := start(tb, cfg)
		stopAgent := startKonnectAgent(tb, e, "bench-konnect-noflow", s.agentPort())
		s.waitAgents(tb, 1)
		return s.frontend("grpc"), func() { stopAgent(); s.Stop(tb) }
	}},
	{"konnect-server+upstream-agent", func(tb testing.TB, e *env) (Frontend, func()) {
		cfg := e.config("grpc")
		cfg.UDSName = filepath.Join(e.dir, "ku.sock")
		s := start(tb, cfg)
		a := startUpstreamAgent(tb, e, "bench-mixed", s.agentPort())
		s.waitAgents(tb, 1)
		return s.frontend("grpc"), func() { a.Kill(); s.Stop(tb) }
	}},
	{"upstream", func(tb testing.TB, e *env) (Frontend, func()) {
		sock := filepath.Join(e.dir, "u.sock")
		agentPort := harness.FreePort(tb)
		p := harness.Start(tb, e.dir, "proxy-server", nil, harness.UpstreamBinary(tb, "proxy-server"),
			"--uds-name="+sock, "--cluster-cert="+e.serverCert, "--cluster-key="+e.serverKey,
			"--mode=grpc", "--server-port=0", "--agent-port="+strconv.Itoa(agentPort),
			"--agent-bind-address=127.0.0.1", "--health-bind-address=127.0.0.1",
			"--admin-port="+strconv.Itoa(harness.FreePort(tb)), "--health-port="+strconv.Itoa(harness.FreePort(tb)),
			"--server-id=upstream", "--v=0")
		a := startUpstreamAgent(tb, e, "bench-upstream", agentPort)
		f := Frontend{UDSName: sock, Mode: "grpc"}
		waitDial(tb, f, startHTTPBackend(tb))
		return f, func() { a.Kill(); p.Kill() }
	}},
}

// BenchmarkTunnelBulk measures the data path kube-apiserver uses: client over the Unix socket (gRPC mode)
// → server → TLS gRPC → agent → loopback HTTP backend, downloading 64 MiB per stream, with 1 and 8
// concurrent streams, for konnect (server and agent), konnect's server with upstream's agent, and
// upstream's proxy-server and proxy-agent binaries. The machine is shared: compare ratios from one run, or
// use TestBulkRatio, which alternates the stacks.
//
//	go test -run '^$' -bench TunnelBulk -benchtime 5x ./egress/tunnel
func BenchmarkTunnelBulk(b *testing.B) {
	const perStream = 64 << 20
	e := newEnv(b)
	web := startHTTPBackend(b)
	for _, st := range stacks {
		b.Run(st.name, func(b *testing.B) {
			f, stop := st.start(b, e)
			defer stop()
			for _, streams := range []int{1, 8} {
				b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
					b.SetBytes(int64(perStream * streams))
					defer harness.ReportCPU(b, int64(perStream*streams))()
					for range b.N {
						if err := fetchParallel(f, web, perStream, streams); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// TestBulkRatio alternates konnect and upstream (A B A B ...) and reports median throughput and ratios.
// It is a measurement, not a pass/fail test: it runs only with KONNECT_BENCH_RATIO=rounds.
func TestBulkRatio(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("KONNECT_BENCH_RATIO"))
	if rounds <= 0 {
		t.Skip("set KONNECT_BENCH_RATIO=5 to measure")
	}
	const perStream = 128 << 20
	e := newEnv(t)
	web := startHTTPBackend(t)
	type result struct{ mbps map[int][]float64 }
	fronts := map[string]Frontend{}
	results := map[string]*result{}
	for _, st := range stacks {
		f, stop := st.start(t, e)
		t.Cleanup(stop)
		fronts[st.name] = f
		results[st.name] = &result{mbps: map[int][]float64{}}
		_ = fetchParallel(f, web, 16<<20, 1) // warm-up
	}
	for r := range rounds {
		for _, streams := range []int{1, 8} {
			for _, st := range stacks {
				begin := time.Now()
				if err := fetchParallel(fronts[st.name], web, perStream, streams); err != nil {
					t.Fatalf("%s round %d: %v", st.name, r, err)
				}
				mbps := float64(perStream*streams) / time.Since(begin).Seconds() / 1e6
				results[st.name].mbps[streams] = append(results[st.name].mbps[streams], mbps)
			}
		}
	}
	median := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	up1, up8 := median(results["upstream"].mbps[1]), median(results["upstream"].mbps[8])
	for _, st := range stacks {
		r := results[st.name]
		m1, m8 := median(r.mbps[1]), median(r.mbps[8])
		t.Logf("%-30s 1 stream %7.1f MB/s (%.2fx upstream)  8 streams %7.1f MB/s (%.2fx upstream, %.2fx its 1 stream)  all: %.0f / %.0f",
			st.name, m1, m1/up1, m8, m8/up8, m8/m1, r.mbps[1], r.mbps[8])
	}
}

// waitDial polls until a dial through f succeeds (an agent has connected to a server we do not observe).
func waitDial(tb testing.TB, f Frontend, addr string) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := f.Dial(ctx, addr)
		cancel()
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no tunnel through %s: %v", f.UDSName, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fetchParallel(f Frontend, web string, n, streams int) error {
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- fetch(f, web, n)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func fetch(f Frontend, web string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := f.Dial(ctx, web)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(120 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/blob?n=%d", web, n), nil)
	if err := req.Write(c); err != nil {
		return err
	}
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 256<<10), req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	got, err := io.CopyBuffer(io.Discard, res.Body, make([]byte, 256<<10))
	if err != nil {
		return err
	}
	if got != int64(n) {
		return fmt.Errorf("got %d of %d bytes", got, n)
	}
	return nil
}
