// Command bench runs konnect side by side with the programs its users would otherwise run, on one
// network-namespace topology, in one run, and reports ratios: upstream proxy-server/proxy-agent for the
// tunnel, OpenSSH `ssh -D` for SOCKS5, and `kubectl proxy` for the API proxy. Each pair runs alternately
// (A B A B …) after a warm-up; the report gives the median and the spread (min–max) of every measure.
//
// It needs root and `ip netns`, and sends traffic only inside the namespaces it creates. `make bench` runs it
// and writes docs/benchmarks.md and docs/benchmarks.svg.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/sys/unix"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

type options struct {
	konnect, proxyServer, proxyAgent, loadgen, backend string
	baseline                                           string
	relay                                              string
	kubeAPIServer, swarm                               string
	swarmSizes                                         []int
	swarmIdle                                          time.Duration
	stormSizes                                         []int
	stormRounds, stormReconnectMax                     int
	stormTimeout                                       time.Duration
	rounds                                             int
	bulkBytes                                          int64
	dialCount, scaleCount, socksCount, heyRequests     int
	idle                                               time.Duration
	socksCipher                                        string
	out, svg                                           string
	keep                                               bool
	rows                                               string
	holRounds                                          int
	holBytes                                           int64
	holMeasure                                         time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.konnect, "konnect", "bin/konnect", "konnect binary")
	flag.StringVar(&o.baseline, "baseline", "", "an earlier konnect binary to run beside --konnect, as contender \"konnect before\", in rows 1, 3, 4 and 11: before and after from one run")
	flag.StringVar(&o.proxyServer, "proxy-server", "", "upstream proxy-server binary")
	flag.StringVar(&o.proxyAgent, "proxy-agent", "", "upstream proxy-agent binary")
	flag.StringVar(&o.loadgen, "loadgen", "", "loadgen binary (test/bench/loadgen)")
	flag.StringVar(&o.backend, "backend", "", "backend binary (test/bench/backend)")
	flag.StringVar(&o.relay, "relay", "", "relay binary (test/bench/relay), for the tunnel's ceiling")
	flag.StringVar(&o.kubeAPIServer, "kube-apiserver", "", "kube-apiserver binary, for the API-proxy row against a real API server")
	flag.StringVar(&o.swarm, "swarm", "", "swarm binary (test/bench/swarm)")
	swarmSizes := flag.String("swarm-sizes", "1000,5000", "idle agents per swarm round")
	flag.DurationVar(&o.swarmIdle, "swarm-idle", 10*time.Second, "how long the swarm stays idle before the server's idle CPU and RSS are read")
	stormSizes := flag.String("storm-sizes", "1000,5000", "agents per reconnect storm (row 10)")
	flag.IntVar(&o.stormRounds, "storm-rounds", 1, "measured rounds per storm size and contender (each on a fresh server; no warm-up: upstream takes N/5 seconds)")
	flag.IntVar(&o.stormReconnectMax, "storm-reconnect-max", 1000, "the largest storm that also measures agents reconnecting to a running server")
	flag.DurationVar(&o.stormTimeout, "storm-timeout", 20*time.Minute, "how long one storm phase may take")
	flag.IntVar(&o.rounds, "rounds", 5, "measured rounds per pair, after one warm-up round")
	flag.Int64Var(&o.bulkBytes, "bulk-bytes", 1<<30, "bytes per bulk transfer")
	flag.IntVar(&o.dialCount, "dial-count", 1000, "sequential single-use tunnels per dial round")
	flag.IntVar(&o.scaleCount, "scale-count", 1000, "concurrent tunnels per scale round")
	flag.IntVar(&o.socksCount, "socks-count", 500, "new SOCKS5 connections per latency round")
	flag.IntVar(&o.heyRequests, "hey-requests", 20000, "requests per hey round")
	flag.DurationVar(&o.idle, "idle", 60*time.Second, "how long agents stay connected before their idle RSS is read")
	flag.StringVar(&o.socksCipher, "socks-cipher", "aes128-gcm@openssh.com", "the cipher konnect socks negotiates, for the same-cipher ssh -D run")
	flag.StringVar(&o.out, "out", "docs/benchmarks.md", "report file")
	flag.StringVar(&o.svg, "svg", "docs/benchmarks.svg", "plot file")
	flag.StringVar(&o.rows, "rows", "1,2,3,4,5,6,7,8,9,10,11", "which rows to run, e.g. 5,6 (1-3 tunnel, 4 agent idle, 5-6 and 9 SOCKS5, 7 API proxy, 8 swarm, 10 reconnect storm with tokens, 11 head-of-line and memory beside slow readers)")
	flag.IntVar(&o.holRounds, "hol-rounds", 3, "head-of-line row: rounds of every scenario, each pair alternating")
	flag.Int64Var(&o.holBytes, "hol-bytes", 8<<20, "head-of-line row: bytes of each slow transfer")
	flag.DurationVar(&o.holMeasure, "hol-measure", 5*time.Second, "head-of-line row: how long quick requests are sent in each run")
	flag.BoolVar(&o.keep, "keep", false, "keep the namespaces and processes for debugging (prints how to enter them)")
	flag.Parse()
	for _, sizes := range []struct {
		flag, v string
		to      *[]int
	}{{"--swarm-sizes", *swarmSizes, &o.swarmSizes}, {"--storm-sizes", *stormSizes, &o.stormSizes}} {
		for _, f := range strings.Split(sizes.v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				fatal(fmt.Errorf("%s %q: want positive counts separated by commas", sizes.flag, sizes.v))
			}
			*sizes.to = append(*sizes.to, n)
		}
	}
	for name, v := range map[string]string{"--proxy-server": o.proxyServer, "--proxy-agent": o.proxyAgent, "--loadgen": o.loadgen, "--backend": o.backend, "--relay": o.relay, "--kube-apiserver": o.kubeAPIServer, "--swarm": o.swarm} {
		if v == "" {
			fatal(fmt.Errorf("%s is required", name))
		}
	}

	dir, err := os.MkdirTemp("", "konnect-bench-")
	if err != nil {
		fatal(err)
	}
	isolateEnv(dir)
	topo, err := newTopology(dir)
	if err != nil {
		os.RemoveAll(dir)
		fatal(err)
	}
	topo.keep = o.keep
	// Clean up on SIGINT/SIGTERM too: the namespaces must never outlive the run.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		topo.close()
		os.RemoveAll(dir)
		os.Exit(1)
	}()
	start := time.Now()
	b := &bench{o: o, t: topo, dir: dir}
	err = b.run()
	if o.keep {
		fmt.Printf("kept: ip netns exec %s bash   (files in %s)\n", topo.ns("cp"), dir)
	} else {
		topo.close()
		os.RemoveAll(dir)
	}
	if err != nil {
		fatal(err)
	}
	fmt.Printf("benchmarks took %s\n", time.Since(start).Round(time.Second))
}

// isolateEnv keeps the programs the benchmarks start (they inherit this environment) to the run's own
// addresses and files: a proxy from the environment (kubectl, client-go, curl and hey honour one) would
// send requests outside the namespaces, and kubectl's discovery cache would outlive the run.
func isolateEnv(dir string) {
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"} {
		_ = os.Unsetenv(v)
	}
	_ = os.Setenv("KUBECACHEDIR", filepath.Join(dir, "kube-cache"))
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

type bench struct {
	o       options
	t       *topology
	dir     string
	results []*measure

	kServer, kAgent, uServer, uAgent *proc
	bServer, bAgent                  *proc              // --baseline's, or nil
	api                              *harness.APIServer // started by the first row that needs it

	sshd          *proc
	socksProcs    map[string]*proc  // SOCKS5 port → the proxy serving it
	socksKex      map[string]string // contender → what it negotiated
	socksKexOrder []string
}

func (b *bench) path(p ...string) string { return filepath.Join(append([]string{b.dir}, p...)...) }

func (b *bench) run() error {
	if err := b.setup(); err != nil {
		return err
	}
	steps := []struct {
		rows []string
		run  func() error
	}{{[]string{"1"}, b.tunnelBulk}, {[]string{"2"}, b.tunnelDial}, {[]string{"3"}, b.tunnelScale},
		{[]string{"5", "6", "9"}, b.socksRows}, {[]string{"7"}, b.apiProxy}, {[]string{"4"}, b.agentIdle},
		{[]string{"8"}, b.swarmRows}, {[]string{"10"}, b.stormRows}, {[]string{"11"}, b.holRow}}
	want := b.wantRows()
	for _, step := range steps {
		if slices.ContainsFunc(step.rows, func(r string) bool { return want[r] }) {
			if err := step.run(); err != nil {
				return err
			}
		}
	}
	return b.report()
}

// wantRows is the set of rows --rows asks for.
func (b *bench) wantRows() map[string]bool {
	want := map[string]bool{}
	for _, r := range strings.Split(b.o.rows, ",") {
		want[strings.TrimSpace(r)] = true
	}
	return want
}

// setup makes the PKI with konnect init and starts both tunnels (konnect and upstream, with the same
// drop-in arguments) and the backend behind them.
func (b *bench) setup() error {
	pki := b.path("k", "pki")
	// The certificates only: agents authenticate with client certificates here, so no kube-apiserver is
	// needed to review tokens.
	if out, err := exec.Command(b.o.konnect, "init", "phase", "certs", "--dir", b.path("k"), "--control-plane-address", cpAddr,
		"--agent-auth", "mtls").CombinedOutput(); err != nil {
		return fmt.Errorf("konnect init phase certs: %w\n%s", err, out)
	}
	var err error
	if _, err = b.t.start("backend-w1", "w1", b.o.backend, "--listen", podAddr+":"+podPort); err != nil {
		return err
	}
	agentArgs := func(port, health int) []string {
		return []string{"--proxy-server-host=" + cpAddr, "--proxy-server-port=" + strconv.Itoa(port),
			"--ca-cert=" + filepath.Join(pki, "ca.crt"),
			"--agent-cert=" + filepath.Join(pki, "konnectivity-agent.crt"), "--agent-key=" + filepath.Join(pki, "konnectivity-agent.key"),
			"--health-server-port=" + strconv.Itoa(health), "--admin-server-port=" + strconv.Itoa(health+1), "--v=0"}
	}
	kServerBin, err := b.ownCopy(b.o.konnect, "konnect-server")
	if err != nil {
		return err
	}
	kAgentBin, err := b.ownCopy(b.o.konnect, "konnect-agent")
	if err != nil {
		return err
	}
	if b.kServer, err = b.t.start("konnect-server", "cp", append([]string{kServerBin, "server"}, b.serverArgs(b.path("konnect.sock"), 8132)...)...); err != nil {
		return err
	}
	uServerBin, err := b.ownCopy(b.o.proxyServer, "upstream-server")
	if err != nil {
		return err
	}
	uAgentBin, err := b.ownCopy(b.o.proxyAgent, "upstream-agent")
	if err != nil {
		return err
	}
	if b.uServer, err = b.t.start("upstream-server", "cp", append([]string{uServerBin}, b.serverArgs(b.path("upstream.sock"), 9132)...)...); err != nil {
		return err
	}
	for _, w := range []struct {
		p    *proc
		port int
	}{{b.kServer, 8134}, {b.uServer, 9134}} {
		if err := b.t.waitHTTP("cp", fmt.Sprintf("http://127.0.0.1:%d/healthz", w.port), 30*time.Second, w.p); err != nil {
			return err
		}
	}
	if b.kAgent, err = b.t.start("konnect-agent", "w1", append([]string{kAgentBin, "agent"}, agentArgs(8132, 8093)...)...); err != nil {
		return err
	}
	if b.uAgent, err = b.t.start("upstream-agent", "w1", append([]string{uAgentBin}, agentArgs(9132, 9093)...)...); err != nil {
		return err
	}
	for _, w := range []struct {
		p    *proc
		port int
	}{{b.kAgent, 8093}, {b.uAgent, 9093}} {
		if err := b.t.waitHTTP("w1", fmt.Sprintf("http://127.0.0.1:%d/readyz", w.port), 30*time.Second, w.p); err != nil {
			return err
		}
	}
	if b.o.baseline != "" {
		if err := b.startBaseline(agentArgs); err != nil {
			return err
		}
	}
	// The agent reports ready once connected; the server may take a moment to register it for dials.
	return b.waitTunnel(b.path("konnect.sock"), b.kServer)
}

// startBaseline starts --baseline's server and agent, with the same arguments as konnect's, on ports
// baselinePort and up: ports of their own, since they run beside every row (row 8's swarm server has 10132,
// row 10's servers 12132 and 13132).
const baselinePort, baselineAgentHealth = 14132, 14093

func (b *bench) startBaseline(agentArgs func(port, health int) []string) error {
	serverBin, err := b.ownCopy(b.o.baseline, "baseline-server")
	if err != nil {
		return err
	}
	agentBin, err := b.ownCopy(b.o.baseline, "baseline-agent")
	if err != nil {
		return err
	}
	if b.bServer, err = b.t.start("baseline-server", "cp", append([]string{serverBin, "server"}, b.serverArgs(b.path("baseline.sock"), baselinePort)...)...); err != nil {
		return err
	}
	if err := b.t.waitHTTP("cp", fmt.Sprintf("http://127.0.0.1:%d/healthz", baselinePort+2), 30*time.Second, b.bServer); err != nil {
		return err
	}
	if b.bAgent, err = b.t.start("baseline-agent", "w1", append([]string{agentBin, "agent"}, agentArgs(baselinePort, baselineAgentHealth)...)...); err != nil {
		return err
	}
	if err := b.t.waitHTTP("w1", fmt.Sprintf("http://127.0.0.1:%d/readyz", baselineAgentHealth), 30*time.Second, b.bAgent); err != nil {
		return err
	}
	return b.waitTunnel(b.path("baseline.sock"), b.bServer)
}

// baselineName is the contender --baseline runs as.
const baselineName = "konnect before"

// ownCopy copies a program's executable for one process. In a cluster the server and each agent run on
// nodes of their own, each from its own image; here they would all map one file, and the kernel keeps the
// pages of a file that several processes map, where a process alone on its node gives back what only its
// start-up needed (konnect does, cmd/internal/daemon/pageout.go). Every long-lived tunnel process, konnect's
// and upstream's alike, therefore runs from its own copy. The copy is dropped from the page cache once
// written, so that each process starts as from a freshly pulled image: a file whose every page is cached
// would have the kernel map neighbouring pages on each fault, and make every process's RSS look larger.
func (b *bench) ownCopy(bin, name string) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	dst := b.path("exe", name)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	return dst, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// serverArgs are the drop-in flags both servers run with: gRPC over uds, agents by client certificate on
// port, admin on port+1 and health on port+2.
func (b *bench) serverArgs(uds string, port int) []string {
	pki := b.path("k", "pki")
	return []string{"--mode=grpc", "--uds-name=" + uds, "--delete-existing-uds-file", "--server-port=0",
		"--cluster-cert=" + filepath.Join(pki, "konnectivity-server.crt"), "--cluster-key=" + filepath.Join(pki, "konnectivity-server.key"),
		"--cluster-ca-cert=" + filepath.Join(pki, "konnectivity-agent-ca.crt"),
		"--agent-port=" + strconv.Itoa(port), "--admin-port=" + strconv.Itoa(port+1), "--health-port=" + strconv.Itoa(port+2),
		"--admin-bind-address=127.0.0.1", "--health-bind-address=127.0.0.1", "--v=0"}
}

func (b *bench) waitTunnel(uds string, p *proc) error {
	return poll("a tunnel through "+uds, 30*time.Second, 300*time.Millisecond, p, func() error {
		_, err := b.loadgen("cp", "--mode=dial", "--count=1", "--uds="+uds, "--target="+podAddr+":"+podPort)
		return err
	})
}

type loadResult struct {
	MBps     float64 `json:"mbps"`
	OK       int     `json:"ok"`
	Failed   int     `json:"failed"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	FirstErr string  `json:"first_error"`
}

func (b *bench) loadgen(ns string, args ...string) (loadResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := harness.Run(ctx, b.t.ns(ns), append([]string{b.o.loadgen}, args...)...)
	var r loadResult
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return r, fmt.Errorf("loadgen output %q: %w", out, err)
	}
	if r.Failed > 0 {
		return r, fmt.Errorf("loadgen: %d failed (first: %s)", r.Failed, r.FirstErr)
	}
	return r, nil
}

// alternate runs every contender once per round, A B A B …, after one warm-up round that is not recorded.
func (b *bench) alternate(m *measure, contenders ...contender) error {
	for round := 0; round <= b.o.rounds; round++ {
		for _, c := range contenders {
			v, err := c.run()
			if err != nil {
				return fmt.Errorf("%s, %s: %w", m.title, c.name, err)
			}
			if round > 0 {
				m.add(c.name, v)
			}
		}
	}
	m.print()
	b.results = append(b.results, m)
	return nil
}

type contender struct {
	name string
	run  func() (map[string]float64, error)
}

// tunnelBulk measures bulk transfer through konnect and upstream, and through the ceiling: the same hops
// and crypto with plain relays and no gRPC (test/bench/relay: a relay on a UDS in cp forwards over mutual
// TLS to a relay in w1, which forwards over TCP to the backend).
func (b *bench) tunnelBulk() error {
	if err := b.startCeiling(); err != nil {
		return err
	}
	for _, streams := range []int{1, 8} {
		bulk := func(via, ns, uds, target string) func() (map[string]float64, error) {
			return func() (map[string]float64, error) {
				args := []string{"--mode=bulk", "--via=" + via, "--target=" + target, fmt.Sprintf("--bytes=%d", b.o.bulkBytes), fmt.Sprintf("--streams=%d", streams)}
				if uds != "" {
					args = append(args, "--uds="+uds)
				}
				r, err := b.loadgen(ns, args...)
				return map[string]float64{"MB/s": r.MBps}, err
			}
		}
		target := podAddr + ":" + podPort
		m := newMeasure(fmt.Sprintf("1. tunnel bulk, %s, %d stream(s)", size(b.o.bulkBytes), streams), []string{"MB/s"})
		contenders := []contender{
			{"konnect", bulk("tunnel", "cp", b.path("konnect.sock"), target)},
			{"upstream", bulk("tunnel", "cp", b.path("upstream.sock"), target)},
			{"ceiling", bulk("unix", "cp", b.path("ceiling.sock"), target)},
			{"direct", bulk("direct", "w1", "", target)},
		}
		if b.bServer != nil {
			contenders = append(contenders, contender{baselineName, bulk("tunnel", "cp", b.path("baseline.sock"), target)})
		}
		if err := b.alternate(m, contenders...); err != nil {
			return err
		}
	}
	return nil
}

// startCeiling starts the two relays of the ceiling with the tunnel's certificates: the far one in w1
// presents the server certificate and checks the agent's against the agents' CA, as the server does; the
// near one in cp presents the agent's.
func (b *bench) startCeiling() error {
	pki := b.path("k", "pki")
	far, err := b.t.start("ceiling-w1", "w1", b.o.relay, "--listen", "tls:"+w1Addr+":"+relayPort, "--to", "tcp:"+podAddr+":"+podPort,
		"--ca", filepath.Join(pki, "konnectivity-agent-ca.crt"), "--cert", filepath.Join(pki, "konnectivity-server.crt"), "--key", filepath.Join(pki, "konnectivity-server.key"))
	if err != nil {
		return err
	}
	if err := b.t.waitTCP("cp", w1Addr+":"+relayPort, 15*time.Second, far); err != nil {
		return err
	}
	near, err := b.t.start("ceiling-cp", "cp", b.o.relay, "--listen", "unix:"+b.path("ceiling.sock"), "--to", "tls:"+w1Addr+":"+relayPort,
		"--ca", filepath.Join(pki, "ca.crt"), "--cert", filepath.Join(pki, "konnectivity-agent.crt"), "--key", filepath.Join(pki, "konnectivity-agent.key"),
		"--server-name", cpAddr)
	if err != nil {
		return err
	}
	return poll("the ceiling relays", 15*time.Second, 200*time.Millisecond, near, func() error {
		_, err := b.loadgen("cp", "--mode=dial", "--via=unix", "--uds="+b.path("ceiling.sock"), "--target="+podAddr+":"+podPort, "--count=1")
		return err
	})
}

func (b *bench) tunnelDial() error {
	dial := func(uds string) func() (map[string]float64, error) {
		return func() (map[string]float64, error) {
			r, err := b.loadgen("cp", "--mode=dial", "--uds="+uds, "--target="+podAddr+":"+podPort, fmt.Sprintf("--count=%d", b.o.dialCount))
			return map[string]float64{"p50 ms": r.P50ms, "p99 ms": r.P99ms}, err
		}
	}
	m := newMeasure(fmt.Sprintf("2. tunnel dial, %d sequential single-use tunnels", b.o.dialCount), []string{"p50 ms", "p99 ms"})
	return b.alternate(m, contender{"konnect", dial(b.path("konnect.sock"))}, contender{"upstream", dial(b.path("upstream.sock"))})
}

func (b *bench) tunnelScale() error {
	scale := func(uds string, server, agent *proc) func() (map[string]float64, error) {
		return func() (map[string]float64, error) {
			ready := b.path("scale.ready")
			_ = os.Remove(ready)
			type out struct {
				r   loadResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				r, err := b.loadgen("cp", "--mode=scale", "--uds="+uds, "--target="+podAddr+":"+podPort,
					fmt.Sprintf("--count=%d", b.o.scaleCount), "--ready-file="+ready, "--hold=2s")
				done <- out{r, err}
			}()
			var srvRSS, agRSS int64
			var srvAnon int
			for {
				if _, err := os.Stat(ready); err == nil {
					srvRSS, _ = server.rssKiB()
					srvAnon, _ = harness.AnonRSSKiB(server.Pid())
					agRSS, _ = agent.rssKiB()
					break
				}
				select {
				case o := <-done:
					return nil, fmt.Errorf("scale run ended before all tunnels were open: %v", o.err)
				case <-time.After(50 * time.Millisecond):
				}
			}
			o := <-done
			return map[string]float64{"ok": float64(o.r.OK), "server RSS MiB": float64(srvRSS) / 1024,
				"server anon MiB": float64(srvAnon) / 1024, "agent RSS MiB": float64(agRSS) / 1024}, o.err
		}
	}
	// The server's anonymous memory is what its tunnels cost; the rest of its RSS is pages of its executable
	// (see row 4).
	m := newMeasure(fmt.Sprintf("3. tunnel scale, %d concurrent tunnels", b.o.scaleCount),
		[]string{"ok", "server RSS MiB", "server anon MiB", "agent RSS MiB"})
	contenders := []contender{{"konnect", scale(b.path("konnect.sock"), b.kServer, b.kAgent)},
		{"upstream", scale(b.path("upstream.sock"), b.uServer, b.uAgent)}}
	if b.bServer != nil {
		contenders = append(contenders, contender{baselineName, scale(b.path("baseline.sock"), b.bServer, b.bAgent)})
	}
	return b.alternate(m, contenders...)
}

// agentIdle starts `rounds` fresh agents of each kind at once, leaves them connected and idle, and reads
// their RSS: the samples are taken side by side in one window instead of rounds × the idle time.
func (b *bench) agentIdle() error {
	pki := b.path("k", "pki")
	type kind struct {
		name string
		bin  string
		args []string
		port int
	}
	kinds := []kind{{"konnect", b.o.konnect, []string{"agent"}, 8132}, {"upstream", b.o.proxyAgent, nil, 9132}}
	if b.o.baseline != "" {
		kinds = append(kinds, kind{baselineName, b.o.baseline, []string{"agent"}, baselinePort})
	}
	agents := map[string][]*proc{}
	for i := 0; i < b.o.rounds; i++ {
		for k, kind := range kinds {
			health := 20000 + 10*i + 3*k
			bin, err := b.ownCopy(kind.bin, fmt.Sprintf("idle-%d-%d", k, i))
			if err != nil {
				return err
			}
			argv := append(append([]string{bin}, kind.args...), "--proxy-server-host="+cpAddr, "--proxy-server-port="+strconv.Itoa(kind.port),
				"--ca-cert="+filepath.Join(pki, "ca.crt"), "--agent-cert="+filepath.Join(pki, "konnectivity-agent.crt"),
				"--agent-key="+filepath.Join(pki, "konnectivity-agent.key"), "--health-server-port="+strconv.Itoa(health),
				"--admin-server-port="+strconv.Itoa(health+1), "--v=0")
			p, err := b.t.start(fmt.Sprintf("idle-%d-%d", k, i), "w1", argv...)
			if err != nil {
				return err
			}
			if err := b.t.waitHTTP("w1", fmt.Sprintf("http://127.0.0.1:%d/readyz", health), 30*time.Second, p); err != nil {
				return err
			}
			agents[kind.name] = append(agents[kind.name], p)
		}
	}
	fmt.Printf("agents connected; idle for %s\n", b.o.idle)
	time.Sleep(b.o.idle)
	// The anonymous part is what the agent allocated; the rest is pages of its executable, so it tells the
	// cost of konnect's one binary, which links every subcommand, from the agent's own. Each agent runs from
	// its own copy of its executable, as on a node of its own (ownCopy).
	m := newMeasure(fmt.Sprintf("4. agent idle, RSS after %s connected", b.o.idle), []string{"RSS MiB", "anon MiB"})
	for i := 0; i < b.o.rounds; i++ {
		for _, kind := range kinds {
			p := agents[kind.name][i]
			kb, err := p.rssKiB()
			if err != nil {
				return err
			}
			anon, err := harness.AnonRSSKiB(p.Pid())
			if err != nil {
				return err
			}
			m.add(kind.name, map[string]float64{"RSS MiB": float64(kb) / 1024, "anon MiB": float64(anon) / 1024})
		}
	}
	for _, list := range agents {
		for _, p := range list {
			p.stop()
		}
	}
	m.print()
	b.results = append(b.results, m)
	return nil
}

// socksRows starts sshd in cp and, in lap, konnect socks (one SSH connection, and --ssh-connections 4),
// ssh -D with OpenSSH's defaults, and ssh -D with konnect's cipher, all to the same sshd, then measures bulk
// transfer (row 5, one stream; row 9, four at once) and connection latency (row 6) through each.
//
// The bulk client is curl --socks5-hostname, the client people use, for every contender; each sample also
// records the CPU time per GiB of the proxy process, of sshd (all its processes), and of curl, read from
// /proc before and after, and the row notes what each side negotiated, from sshd's debug log.
func (b *bench) socksRows() error {
	want := b.wantRows()
	if err := b.startSSH(); err != nil {
		return err
	}
	one := func(port string) func() (map[string]float64, error) {
		return func() (map[string]float64, error) { return b.socksCurl("lap", port, 1) }
	}
	if want["5"] {
		m := newMeasure(fmt.Sprintf("5. SOCKS5 over SSH, %s, curl --socks5-hostname", size(b.o.bulkBytes)), socksMetrics)
		m.note = b.negotiated()
		if err := b.alternate(m,
			contender{"konnect", one(socksPort)},
			contender{"ssh -D", one(sshDPort)},
			contender{"ssh -D -c " + b.o.socksCipher, one(sshDCipher)},
			contender{"direct", func() (map[string]float64, error) { return b.socksCurl("cp", "", 1) }},
		); err != nil {
			return err
		}
	}
	if want["9"] {
		four := func(port string) func() (map[string]float64, error) {
			return func() (map[string]float64, error) { return b.socksCurl("lap", port, 4) }
		}
		m := newMeasure(fmt.Sprintf("9. SOCKS5 over SSH, 4 parallel downloads of %s each, curl --socks5-hostname", size(b.o.bulkBytes/4)), socksMetrics)
		m.note = b.negotiated()
		if err := b.alternate(m,
			contender{"konnect", four(socksPort)},
			contender{"konnect --ssh-connections 4", four(socksPortN)},
			contender{"ssh -D", four(sshDPort)},
		); err != nil {
			return err
		}
	}
	if !want["6"] {
		return nil
	}
	dial := func(port string) func() (map[string]float64, error) {
		return func() (map[string]float64, error) {
			r, err := b.loadgen("lap", "--mode=dial", "--via=socks", "--socks=127.0.0.1:"+port, "--target="+cpBackend, fmt.Sprintf("--count=%d", b.o.socksCount))
			return map[string]float64{"p50 ms": r.P50ms, "p99 ms": r.P99ms}, err
		}
	}
	m := newMeasure(fmt.Sprintf("6. SOCKS5 connect latency, %d new connections", b.o.socksCount), []string{"p50 ms", "p99 ms"})
	return b.alternate(m, contender{"konnect", dial(socksPort)}, contender{"ssh -D", dial(sshDPort)})
}

var socksMetrics = []string{"MB/s", "proxy CPU s/GiB", "sshd CPU s/GiB", "curl CPU s/GiB"}

// socksCurl downloads --bulk-bytes with `streams` concurrent curl --socks5-hostname processes in ns through
// the SOCKS5 port (direct to the backend when port is empty) and returns the aggregate MB/s and the CPU
// time per GiB of the proxy, of sshd and of curl.
func (b *bench) socksCurl(ns, port string, streams int) (map[string]float64, error) {
	per := b.o.bulkBytes / int64(streams)
	// sh runs curl and then prints its own children's CPU time (cutime and cstime, in clock ticks).
	script := `curl -sS --fail --max-time 300 -o /dev/null -w '%{size_download}\n' "$@" && read -r _ rest < /proc/$$/stat && ` +
		`set -- ${rest#*) } && shift 13 && echo "$1 $2"`
	argv := []string{"sh", "-c", script, "sh"}
	if port != "" {
		argv = append(argv, "--socks5-hostname", "127.0.0.1:"+port)
	}
	argv = append(argv, fmt.Sprintf("http://%s/bytes?n=%d", cpBackend, per))
	proxy := b.socksProcs[port]
	cpu0, sshd0 := 0.0, b.sshdCPU()
	if proxy != nil {
		cpu0, _ = proxy.cpuSeconds()
	}
	type out struct {
		got   int64
		ticks float64
		err   error
	}
	outs := make(chan out, streams)
	start := time.Now()
	for i := 0; i < streams; i++ {
		go func() {
			s, err := b.execFor(5*time.Minute, ns, argv...)
			var o out
			o.err = err
			if err == nil {
				var u, st float64
				if _, err := fmt.Sscan(s, &o.got, &u, &st); err != nil {
					o.err = fmt.Errorf("curl output %q: %w", s, err)
				}
				o.ticks = u + st
			}
			outs <- o
		}()
	}
	var got int64
	var ticks float64
	var firstErr error
	for i := 0; i < streams; i++ {
		o := <-outs
		got += o.got
		ticks += o.ticks
		if o.err != nil && firstErr == nil {
			firstErr = o.err
		}
	}
	secs := time.Since(start).Seconds()
	if firstErr != nil {
		return nil, firstErr
	}
	if got != per*int64(streams) {
		return nil, fmt.Errorf("curl through port %s: %d of %d bytes", port, got, per*int64(streams))
	}
	gib := float64(got) / (1 << 30)
	r := map[string]float64{"MB/s": float64(got) / 1e6 / secs, "curl CPU s/GiB": ticks / clockTicks / gib}
	if proxy != nil {
		cpu1, _ := proxy.cpuSeconds()
		r["proxy CPU s/GiB"] = (cpu1 - cpu0) / gib
		r["sshd CPU s/GiB"] = (b.sshdCPU() - sshd0) / gib
	}
	return r, nil
}

// sshdCPU is the CPU time of sshd and every process under it (one or two per SSH connection; idle ones add
// nothing), in seconds.
func (b *bench) sshdCPU() float64 {
	if b.sshd == nil {
		return 0
	}
	var total float64
	for _, pid := range append([]int{b.sshd.Pid()}, harness.Descendants(b.sshd.Pid())...) {
		total += harness.CPUTime(pid).Seconds()
	}
	return total
}

// negotiated lists what each SSH client negotiated with sshd, as recorded when it connected.
func (b *bench) negotiated() string {
	if len(b.socksKex) == 0 {
		return ""
	}
	var lines []string
	for _, name := range b.socksKexOrder {
		lines = append(lines, fmt.Sprintf("%s: %s", name, b.socksKex[name]))
	}
	return "Negotiated (sshd's debug log): " + strings.Join(lines, "; ") + "."
}

func (b *bench) startSSH() error {
	clientKey, clientPub, err := harness.GenerateSSHKey(b.dir, "client_key", "")
	if err != nil {
		return err
	}
	sshd, err := harness.NewSSHD(harness.SSHDOptions{Addr: cpLapAddr + ":" + sshPort, Netns: b.t.ns("cp"), From: b.t.ns("lap"),
		Dir: b.path("sshd"), Keep: b.t.keep}, clientPub)
	if err != nil {
		return err
	}
	b.sshd = &proc{sshd.Proc}
	b.t.procs = append(b.t.procs, b.sshd)
	if err := os.WriteFile(b.path("known_hosts"), []byte(sshd.KnownHostsLine()+"\n"), 0o644); err != nil {
		return err
	}
	sshArgs := func(port string, extra ...string) []string {
		return append(append([]string{"ssh", "-F", "/dev/null", "-N", "-D", "127.0.0.1:" + port, "-i", clientKey,
			"-o", "UserKnownHostsFile=" + b.path("known_hosts"), "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"}, extra...),
			"-p", sshPort, "root@"+cpLapAddr)
	}
	konnectArgs := func(port string, extra ...string) []string {
		return append(append([]string{b.o.konnect, "socks", "-F", "none", "-D", "127.0.0.1:" + port, "-i", clientKey,
			"--known-hosts", b.path("known_hosts"), "-p", sshPort}, extra...), "root@"+cpLapAddr)
	}
	if _, err := b.t.start("backend-cp", "cp", b.o.backend, "--listen", cpBackend); err != nil {
		return err
	}
	b.socksProcs = map[string]*proc{}
	b.socksKex = map[string]string{}
	for _, s := range []struct {
		name, label string
		argv        []string
		port        string
		conns       int
	}{
		{"konnect-socks", "konnect", konnectArgs(socksPort), socksPort, 1},
		{"konnect-socks-4", "konnect --ssh-connections 4", konnectArgs(socksPortN, "--ssh-connections", "4"), socksPortN, 4},
		{"ssh-D", "ssh -D", sshArgs(sshDPort), sshDPort, 1},
		{"ssh-D-cipher", "ssh -D -c " + b.o.socksCipher, sshArgs(sshDCipher, "-c", b.o.socksCipher), sshDCipher, 1},
	} {
		logged := logSize(b.sshd.LogPath)
		p, err := b.t.start(s.name, "lap", s.argv...)
		if err != nil {
			return err
		}
		if err := b.t.waitTCP("lap", "127.0.0.1:"+s.port, 15*time.Second, p); err != nil {
			return err
		}
		// The listener comes up before the SSH session; one request through it proves the whole path, and
		// its SSH connections are in sshd's log by then.
		if err := poll("SOCKS5 on port "+s.port, 20*time.Second, 300*time.Millisecond, p, func() error {
			_, err := b.loadgen("lap", "--mode=dial", "--via=socks", "--socks=127.0.0.1:"+s.port, "--target="+cpBackend, "--count=1")
			return err
		}); err != nil {
			return err
		}
		// Every SSH connection of this proxy is up (and in the log) before the next proxy starts.
		if err := poll(fmt.Sprintf("%d SSH connection(s) of %s in sshd's log", s.conns, s.label), 20*time.Second, 100*time.Millisecond, p, func() error {
			if n := len(kexCipher.FindAllString(readFrom(b.sshd.LogPath, logged), -1)); n < s.conns {
				return fmt.Errorf("%d so far", n)
			}
			return nil
		}); err != nil {
			return err
		}
		b.socksProcs[s.port] = p
		b.socksKexOrder = append(b.socksKexOrder, s.label)
		b.socksKex[s.label] = kexSummary(readFrom(b.sshd.LogPath, logged))
	}
	return nil
}

// logSize is the current length of a log file.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns a file's content from offset on.
func readFrom(path string, off int64) string {
	data, err := os.ReadFile(path)
	if err != nil || off > int64(len(data)) {
		return ""
	}
	return string(data[off:])
}

var (
	kexAlgo   = regexp.MustCompile(`kex: algorithm: (\S+)`)
	kexCipher = regexp.MustCompile(`kex: server->client cipher: (\S+) MAC: (\S+)`)
)

// kexSummary condenses the kex lines of sshd's debug log (one set per SSH connection) into "cipher (MAC),
// kex", counting the connections when there are several alike.
func kexSummary(log string) string {
	algos := kexAlgo.FindAllStringSubmatch(log, -1)
	ciphers := kexCipher.FindAllStringSubmatch(log, -1)
	counts := map[string]int{}
	var order []string
	for i, c := range ciphers {
		kex := "?"
		if i < len(algos) {
			kex = algos[i][1]
		}
		s := fmt.Sprintf("%s (MAC %s), kex %s", c[1], c[2], kex)
		if counts[s] == 0 {
			order = append(order, s)
		}
		counts[s]++
	}
	if len(order) == 0 {
		return "not in sshd's log"
	}
	var parts []string
	for _, s := range order {
		if counts[s] > 1 {
			s = fmt.Sprintf("%d connections, %s", counts[s], s)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

var (
	heyRPS = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	heyP99 = regexp.MustCompile(`99% in ([0-9.]+) secs`)
	heyNon = regexp.MustCompile(`\[(\d{3})\]\s+(\d+) responses`)
)

// apiProxy compares konnect proxy with kubectl proxy, with hey: in front of a static HTTPS backend (the
// proxies' own cost) and in front of a real kube-apiserver (what users see).
func (b *bench) apiProxy() error {
	if _, err := b.t.start("backend-tls", "cp", b.o.backend, "--listen", cpTLSAddr, "--tls", "--cert-out", b.path("backend-tls.crt")); err != nil {
		return err
	}
	if err := b.t.waitTCP("cp", cpTLSAddr, 15*time.Second, nil); err != nil {
		return err
	}
	err := pkitest.WriteKubeconfig(b.path("bench.kubeconfig"), clientcmdapi.Cluster{Server: "https://" + cpTLSAddr, CertificateAuthority: b.path("backend-tls.crt")},
		clientcmdapi.AuthInfo{Token: "bench-token-not-a-secret"})
	if err != nil {
		return err
	}
	if err := b.proxyPair("static HTTPS backend", b.path("bench.kubeconfig"), 8001, 8002); err != nil {
		return err
	}
	api, err := b.startAPIServer()
	if err != nil {
		return err
	}
	return b.proxyPair("kube-apiserver 1.36", api.Kubeconfig, 8003, 8004)
}

// proxyPair starts konnect proxy and kubectl proxy for one kubeconfig and runs hey against each in turn.
// hey's default Content-Type is text/html, which kube-apiserver answers with 415; -T sets a type it takes.
func (b *bench) proxyPair(backend, kubeconfig string, konnectPort, kubectlPort int) error {
	kp, cp := strconv.Itoa(konnectPort), strconv.Itoa(kubectlPort)
	for _, s := range []struct {
		name string
		argv []string
		port string
	}{
		{"konnect-proxy-" + kp, []string{b.o.konnect, "proxy", "--port=" + kp, "--kubeconfig=" + kubeconfig}, kp},
		{"kubectl-proxy-" + cp, []string{"kubectl", "proxy", "--port=" + cp, "--kubeconfig=" + kubeconfig}, cp},
	} {
		p, err := b.t.start(s.name, "cp", s.argv...)
		if err != nil {
			return err
		}
		if err := b.t.waitHTTP("cp", "http://127.0.0.1:"+s.port+"/api", 30*time.Second, p); err != nil {
			return err
		}
	}
	hey := func(port string) func() (map[string]float64, error) {
		return func() (map[string]float64, error) {
			out, err := b.execFor(5*time.Minute, "cp", "hey", "-n", strconv.Itoa(b.o.heyRequests), "-c", "32", "-T", "application/json", "http://127.0.0.1:"+port+"/api")
			if err != nil {
				return nil, err
			}
			for _, m := range heyNon.FindAllStringSubmatch(out, -1) {
				if m[1] != "200" {
					return nil, fmt.Errorf("hey: %s responses with status %s", m[2], m[1])
				}
			}
			rps, p99 := heyRPS.FindStringSubmatch(out), heyP99.FindStringSubmatch(out)
			if rps == nil || p99 == nil {
				return nil, fmt.Errorf("hey output not understood:\n%s", out)
			}
			r, _ := strconv.ParseFloat(rps[1], 64)
			p, _ := strconv.ParseFloat(p99[1], 64)
			return map[string]float64{"req/s": r, "p99 ms": p * 1000}, nil
		}
	}
	m := newMeasure(fmt.Sprintf("7. API proxy, hey -n %d -c 32 /api, %s", b.o.heyRequests, backend), []string{"req/s", "p99 ms"})
	return b.alternate(m, contender{"konnect", hey(kp)}, contender{"kubectl proxy", hey(cp)})
}

// execFor runs a short command inside ns, bounded by d.
func (b *bench) execFor(d time.Duration, ns string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return harness.Run(ctx, b.t.ns(ns), argv...)
}

// size prints a byte count the way the report's titles use it: 1 GiB, 256 MiB.
func size(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
