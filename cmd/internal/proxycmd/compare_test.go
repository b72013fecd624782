//go:build integration

package proxycmd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// The comparison with kubectl proxy runs only when asked: it is a benchmark, not a test, and takes about a
// minute of both cores.
//
//	KONNECT_BENCH_APIPROXY=1 go test -run TestCompareWithKubectlProxy -v ./cmd/internal/proxycmd
//
// Optional: KONNECT_BENCH_ROUNDS (default 5), KONNECT_BENCH_REQUESTS per hey run (default 20000),
// KONNECT_BENCH_CONCURRENCY (default 50), KONNECT_BENCH_KUBECONFIG to measure against a real API server
// instead of the built-in HTTPS backend, KONNECT_BENCH_PATH (default /api), and KONNECT_BENCH_OUT, a file
// that receives the result table in Markdown.
const benchEnv = "KONNECT_BENCH_APIPROXY"

// reexecEnv makes the test binary run `konnect proxy` with its arguments instead of the tests, so that the
// proxy under test is a separate process, like kubectl proxy.
const reexecEnv = "KONNECT_PROXYCMD_REEXEC"

func init() {
	if os.Getenv(reexecEnv) != "1" {
		return
	}
	cmd := NewProxyCommand()
	cmd.SetArgs(os.Args[1:])
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// startProxyProcess starts a proxy process and returns the address from its "Starting to serve on" line.
func startProxyProcess(t *testing.T, name string, cmd *exec.Cmd) string {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "Starting to serve on "); ok {
				lines <- rest
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case addr := <-lines:
		return addr
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not start serving within 15s", name)
		return ""
	}
}

type heyResult struct {
	rps, p99  float64 // requests per second, seconds
	cpuPerReq float64 // microseconds of the proxy process's CPU time per request
}

var (
	heyRPS    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	heyP99    = regexp.MustCompile(`99%\s+in\s+([0-9.]+)\s+secs`)
	heyStatus = regexp.MustCompile(`\[(\d+)\]\s+(\d+)\s+responses`)
)

// runHey runs one bounded hey load and checks that every response was 200.
func runHey(t *testing.T, hey, url string, n, c int) heyResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, hey, "-n", strconv.Itoa(n), "-c", strconv.Itoa(c), url).CombinedOutput()
	if err != nil {
		t.Fatalf("hey %s: %v\n%s", url, err, out)
	}
	rps, p99 := heyRPS.FindSubmatch(out), heyP99.FindSubmatch(out)
	if rps == nil || p99 == nil {
		t.Fatalf("cannot read hey's output:\n%s", out)
	}
	for _, m := range heyStatus.FindAllSubmatch(out, -1) {
		if string(m[1]) != "200" {
			t.Fatalf("%s: %s responses with status %s\n%s", url, m[2], m[1], out)
		}
	}
	if strings.Contains(string(out), "Error distribution") {
		t.Fatalf("%s: hey saw errors\n%s", url, out)
	}
	r := heyResult{}
	r.rps, _ = strconv.ParseFloat(string(rps[1]), 64)
	r.p99, _ = strconv.ParseFloat(string(p99[1]), 64)
	return r
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func spread(xs []float64) (float64, float64) {
	return slices.Min(xs), slices.Max(xs)
}

func TestCompareWithKubectlProxy(t *testing.T) {
	if os.Getenv(benchEnv) != "1" {
		t.Skipf("benchmark; set %s=1 to run it", benchEnv)
	}
	hey, err := exec.LookPath("hey")
	if err != nil {
		t.Fatalf("hey is required (Debian package hey): %v", err)
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is required: %v", err)
	}
	rounds := envInt(t, "KONNECT_BENCH_ROUNDS", 5)
	n := envInt(t, "KONNECT_BENCH_REQUESTS", 20000)
	c := envInt(t, "KONNECT_BENCH_CONCURRENCY", 50)
	path := os.Getenv("KONNECT_BENCH_PATH")
	if path == "" {
		path = "/api"
	}
	kc := os.Getenv("KONNECT_BENCH_KUBECONFIG")
	backendName := "kube-apiserver (" + kc + ")"
	if kc == "" {
		kc = newBackend(t).kubeconfig(t, "cert")
		backendName = "built-in HTTPS backend (client certificate, HTTP/2 capable)"
	}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	konnect := exec.Command(self, "--kubeconfig", kc, "--port=0")
	konnect.Env = append(os.Environ(), reexecEnv+"=1")
	kubectlCmd := exec.Command(kubectl, "proxy", "--kubeconfig", kc, "--port=0")
	proxies := []struct {
		name, url string
		cmd       *exec.Cmd
	}{
		{"konnect proxy", "http://" + startProxyProcess(t, "konnect proxy", konnect) + path, konnect},
		{"kubectl proxy", "http://" + startProxyProcess(t, "kubectl proxy", kubectlCmd) + path, kubectlCmd},
	}
	for _, p := range proxies { // warm-up: connections, TLS sessions, caches
		runHey(t, hey, p.url, min(n, 2000), c)
	}
	results := make([][]heyResult, len(proxies))
	for r := range rounds {
		for i, p := range proxies {
			before := harness.CPUTime(p.cmd.Process.Pid)
			res := runHey(t, hey, p.url, n, c)
			res.cpuPerReq = float64((harness.CPUTime(p.cmd.Process.Pid) - before).Microseconds()) / float64(n)
			results[i] = append(results[i], res)
			t.Logf("round %d %-14s %8.0f req/s  p99 %6.1f ms  %5.1f µs CPU/request", r+1, p.name, res.rps, res.p99*1000, res.cpuPerReq)
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "API proxy: hey -n %d -c %d %s, %d alternating rounds, against the %s\n\n", n, c, path, rounds, backendName)
	fmt.Fprintf(&b, "| proxy | req/s median | req/s min–max | p99 median (ms) | p99 min–max (ms) | proxy CPU µs/request |\n|---|---|---|---|---|---|\n")
	var rps, p99, cpu [2]float64
	for i, p := range proxies {
		var rs, ps, cs []float64
		for _, res := range results[i] {
			rs = append(rs, res.rps)
			ps = append(ps, res.p99*1000)
			cs = append(cs, res.cpuPerReq)
		}
		rps[i], p99[i], cpu[i] = median(rs), median(ps), median(cs)
		rlo, rhi := spread(rs)
		plo, phi := spread(ps)
		fmt.Fprintf(&b, "| %s | %.0f | %.0f–%.0f | %.1f | %.1f–%.1f | %.1f |\n", p.name, rps[i], rlo, rhi, p99[i], plo, phi, cpu[i])
	}
	fmt.Fprintf(&b, "\nkonnect/kubectl: req/s ratio %.2f, p99 ratio %.2f (lower is better), CPU per request ratio %.2f (lower is better)\n",
		rps[0]/rps[1], p99[0]/p99[1], cpu[0]/cpu[1])
	t.Log("\n" + b.String())
	if out := os.Getenv("KONNECT_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
