//go:build integration

package reliability

import (
	"bufio"
	"context"
	"flag"
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
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

var soakDuration = flag.Duration("soak-duration", 0, "churn phase of TestChurnSoak (default 2m, or $KONNECT_SOAK_DURATION)")

func soakChurn(t *testing.T) time.Duration {
	if *soakDuration > 0 {
		return *soakDuration
	}
	if v := os.Getenv("KONNECT_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KONNECT_SOAK_DURATION: %v", err)
		}
		return d
	}
	return 2 * time.Minute
}

// Soak parameters.
const (
	soakWorkers      = 4
	soakGrace        = 2 * time.Second // after everything is ready again, before a window closes
	leakTunnels      = 10000           // tunnels opened and closed between the leak measurements
	goroutineSlack   = 15              // goroutines above baseline still counted as "back to baseline"
	rssSlackFraction = 0.5             // RSS may grow by this fraction of baseline (GC heap sizing)
	rssSlackMin      = 24 << 20        // ... or by this much, whichever is larger
)

// dialThrough opens one single-use tunnel through the server's UDS exactly as kube-apiserver's egress
// selector does, sends one HTTP request to addr through it and reads the answer.
func dialThrough(ctx context.Context, uds, addr string) error {
	tunnelCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tun, err := kclient.CreateSingleUseGrpcTunnelWithContext(ctx, tunnelCtx, "unix:"+uds,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", uds)
		}),
		grpc.WithBlock(),                 //nolint:staticcheck // as kube-apiserver does
		grpc.WithReturnConnectionError(), //nolint:staticcheck // as kube-apiserver does
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
	if err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	c, err := tun.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "GET /soak HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n\r\n"); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK || string(b) != "soak-ok" {
		return fmt.Errorf("answer %s %q", resp.Status, b)
	}
	return nil
}

// window is a period in which a process was down or coming back: [kill, ready again + grace].
type window struct {
	victim     string
	sig        syscall.Signal
	start, end time.Time
}

// request is one tunnelled request of the soak.
type request struct {
	server     int
	start, end time.Time
	err        error
}

// procStats are one process's goroutines and RSS.
type procStats struct {
	goroutines int
	rssKiB     int
}

func goroutines(adminPort int) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", adminPort))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		return 0, err
	}
	var n int
	if _, err := fmt.Sscanf(line, "goroutine profile: total %d", &n); err != nil {
		return 0, fmt.Errorf("admin port %d: %q: %w", adminPort, line, err)
	}
	return n, nil
}

// soakMember is one server or agent of the soak.
type soakMember struct {
	name   string
	p      *harness.Proc
	admin  int
	health int
}

// TestChurnSoak runs two servers and two agents on loopback (each agent connected to both servers), sends
// requests through the tunnel continuously as kube-apiserver does, and kills (SIGKILL or SIGTERM) and
// restarts one of them at random, again and again. No request may fail outside the restart windows. Then
// it opens and closes 10,000 tunnels and checks that every process's goroutines and RSS return to their
// baseline.
func TestChurnSoak(t *testing.T) {
	churn := soakChurn(t)
	rng := seed(t)
	dir := filepath.Join(shortDir(t), "k")
	initMTLS(t, dir)
	// Agents authenticate by client certificate (konnect init --agent-auth mtls) unless
	// KONNECT_SOAK_AGENT_AUTH=token, which puts the TokenReview path (against a fake API server) under churn.
	serverAuth, agentAuth := mtlsServer(dir), mtlsAgent(dir)
	if os.Getenv("KONNECT_SOAK_AGENT_AUTH") == "token" {
		tr := newTokenReviewer(t)
		tokenPath := filepath.Join(dir, "agent-token")
		writeFile(t, tokenPath, tr.goodAgentToken())
		serverAuth, agentAuth = tokenServerArgs(tr.kubeconfig(t, dir)), []string{"--service-account-token-path", tokenPath}
	}
	t.Logf("agent authentication: %s", strings.Join(agentAuth, " "))

	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "soak-ok")
	}), ReadHeaderTimeout: 5 * time.Second}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(bln)
	t.Cleanup(func() { backend.Close() })
	backendAddr := bln.Addr().String()

	ports := harness.FreePorts(t, 10)
	var servers, agents []*soakMember
	var udss []string
	sockDir := shortDir(t)
	for i := range 2 {
		sp := serverPorts{agent: ports[3*i], admin: ports[3*i+1], health: ports[3*i+2]}
		uds := filepath.Join(sockDir, fmt.Sprintf("s%d.sock", i))
		udss = append(udss, uds)
		args := serverArgs(dir, uds, sp, append(append([]string{}, serverAuth...),
			"--server-count", "2", "--server-id", fmt.Sprintf("soak-server-%d", i))...)
		servers = append(servers, &soakMember{name: fmt.Sprintf("server-%d", i), admin: sp.admin, health: sp.health,
			p: startKonnect(t, fmt.Sprintf("server-%d", i), args...)})
	}
	for _, s := range servers {
		waitReady(t, s.p, s.health)
	}
	for i := range 2 {
		admin, health := ports[6+2*i], ports[7+2*i]
		args := agentArgs(dir, []int{ports[0], ports[3]}, admin, health,
			append(append([]string{}, agentAuth...), "--agent-id", fmt.Sprintf("soak-agent-%d", i))...)
		agents = append(agents, &soakMember{name: fmt.Sprintf("agent-%d", i), admin: admin, health: health,
			p: startKonnect(t, fmt.Sprintf("agent-%d", i), args...)})
	}
	all := append(append([]*soakMember{}, servers...), agents...)
	allReady := func() error {
		for _, m := range all {
			if err := httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", m.health)); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
		return nil
	}
	harness.Eventually(t, 60*time.Second, "all ready", allReady)
	for i, uds := range udss {
		harness.Eventually(t, 30*time.Second, "first tunnel through server "+strconv.Itoa(i), func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return dialThrough(ctx, uds, backendAddr)
		})
	}

	// Requests: workers cycle over the servers until stopped.
	var (
		mu       sync.Mutex
		requests []request
		windows  []window
		tunnels  atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				srv := i % len(udss)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				err := dialThrough(ctx, udss[srv], backendAddr)
				cancel()
				tunnels.Add(1)
				mu.Lock()
				requests = append(requests, request{server: srv, start: start, end: time.Now(), err: err})
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}

	// Churn: one fault at a time; a window ends when every process is ready again, plus a grace period.
	t.Logf("churn for %s", churn)
	churnEnd := time.Now().Add(churn)
	for time.Now().Before(churnEnd) {
		time.Sleep(time.Duration(2000+rng.IntN(4000)) * time.Millisecond)
		victim := all[rng.IntN(len(all))]
		sig := syscall.SIGKILL
		if rng.IntN(2) == 0 {
			sig = syscall.SIGTERM
		}
		w := window{victim: victim.name, sig: sig, start: time.Now()}
		_ = victim.p.Stop(sig, 30*time.Second)
		victim.p.Restart()
		harness.Eventually(t, 60*time.Second, "all ready after restarting "+victim.name, allReady)
		time.Sleep(soakGrace)
		w.end = time.Now()
		mu.Lock()
		windows = append(windows, w)
		mu.Unlock()
	}
	time.Sleep(time.Second) // requests after the last window are outside every window
	close(stop)
	wg.Wait()

	var inside, outside, failedInside, failedOutside int
	var outsideErrs []string
	for _, r := range requests {
		in := false
		for _, w := range windows {
			if r.start.Before(w.end) && r.end.After(w.start) {
				in = true
				break
			}
		}
		if in {
			inside++
			if r.err != nil {
				failedInside++
			}
		} else {
			outside++
			if r.err != nil {
				failedOutside++
				if len(outsideErrs) < 10 {
					outsideErrs = append(outsideErrs, fmt.Sprintf("%s server-%d: %v", r.start.Format("15:04:05.000"), r.server, r.err))
				}
			}
		}
	}
	var kills []string
	for _, w := range windows {
		kills = append(kills, fmt.Sprintf("%s %s %.1fs", w.victim, map[syscall.Signal]string{syscall.SIGKILL: "KILL", syscall.SIGTERM: "TERM"}[w.sig], w.end.Sub(w.start).Seconds()))
	}
	t.Logf("SOAK churn: %s, %d restarts: %s", churn, len(windows), strings.Join(kills, ", "))
	t.Logf("SOAK requests: %d sent; inside restart windows %d (failed %d); outside %d (failed %d)",
		len(requests), inside, failedInside, outside, failedOutside)
	if failedOutside > 0 {
		t.Errorf("%d requests failed outside the restart windows, e.g.:\n  %s", failedOutside, strings.Join(outsideErrs, "\n  "))
	}
	if len(requests) == 0 || outside == 0 {
		t.Errorf("no requests outside the restart windows: the soak proved nothing")
	}

	// Leak check: baseline after a warm-up, then 10,000 tunnels, then the same figures again.
	harness.Eventually(t, 60*time.Second, "all ready before the leak check", allReady)
	run := func(n int) (failed int) {
		var next, bad atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > int64(n) {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := dialThrough(ctx, udss[i%2], backendAddr); err != nil {
						bad.Add(1)
					}
					cancel()
					tunnels.Add(1)
				}
			}()
		}
		wg.Wait()
		return int(bad.Load())
	}
	if f := run(500); f > 0 {
		t.Errorf("warm-up: %d of 500 requests failed with every process up", f)
	}
	measureAll := func() map[string]procStats {
		time.Sleep(3 * time.Second) // closed tunnels finish on both ends
		stats := map[string]procStats{}
		for _, m := range all {
			g, err := goroutines(m.admin)
			if err != nil {
				t.Fatalf("%s goroutines: %v", m.name, err)
			}
			info, ok := harness.Process(m.p.Pid())
			if !ok {
				t.Fatalf("%s RSS: process %d is gone", m.name, m.p.Pid())
			}
			stats[m.name] = procStats{g, info.RSSKiB}
		}
		return stats
	}
	before := measureAll()
	start := time.Now()
	failed := run(leakTunnels)
	elapsed := time.Since(start)
	if failed > 0 {
		t.Errorf("%d of %d tunnels failed with every process up", failed, leakTunnels)
	}
	after := measureAll()
	t.Logf("SOAK leak check: %d tunnels opened and closed in %s (%d failed); %d tunnels in the whole soak", leakTunnels, elapsed.Round(time.Millisecond), failed, tunnels.Load())
	for _, m := range all {
		b, a := before[m.name], after[m.name]
		t.Logf("SOAK %-8s goroutines %4d -> %4d   RSS %6d KiB -> %6d KiB", m.name, b.goroutines, a.goroutines, b.rssKiB, a.rssKiB)
		if a.goroutines > b.goroutines+goroutineSlack {
			t.Errorf("%s: goroutines %d -> %d after %d tunnels (leak)", m.name, b.goroutines, a.goroutines, leakTunnels)
		}
		slack := max(int(float64(b.rssKiB)*rssSlackFraction), rssSlackMin>>10)
		if a.rssKiB > b.rssKiB+slack {
			t.Errorf("%s: RSS %d KiB -> %d KiB after %d tunnels (more than %d KiB growth)", m.name, b.rssKiB, a.rssKiB, leakTunnels, slack)
		}
	}
}
