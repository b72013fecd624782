package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The identity agents authenticate as in the storm, as konnect init's manifests set it up.
const (
	stormNamespace = "kube-system"
	stormSA        = "konnectivity-agent"
	stormAudience  = "system:konnectivity-server"
	stormUser      = "system:konnectivity-server"
)

// stormRows measures agent reconnect storms with ServiceAccount tokens reviewed by the real kube-apiserver
// (row 10): konnect and upstream with the same drop-in flags (token authentication, no --kubeconfig-qps),
// alternating, each round on a fresh server. First the storm after a server restart: N agents (the swarm,
// in w1, spread over 1,022 source addresses, each with a token of its own, as every agent pod's projected
// token is its own) connect at once and retry as agents do. Then, for sizes up to --storm-reconnect-max,
// the storm of a network blip: every agent drops its connection and reconnects at once, to the server that
// kept running. For each: the time until all are connected, the TokenReviews kube-apiserver answered (its
// own apiserver_request_total), and the server's CPU time.
func (b *bench) stormRows() error {
	api, err := b.startAPIServer()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kubeconfig := b.path("storm-server.kubeconfig")
	if err := api.AgentAuth(ctx, stormNamespace, stormSA, stormUser, kubeconfig); err != nil {
		return err
	}
	maxN := 0
	for _, n := range b.o.stormSizes {
		maxN = max(maxN, n)
	}
	start := time.Now()
	tokens, err := api.Tokens(ctx, stormNamespace, stormSA, stormAudience, 3*time.Hour, maxN, 32)
	if err != nil {
		return err
	}
	fmt.Printf("minted %d agent tokens in %s\n", len(tokens), time.Since(start).Round(time.Millisecond))
	tokensFile := b.path("storm-tokens")
	if err := os.WriteFile(tokensFile, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	for _, n := range b.o.stormSizes {
		reconnect := n <= b.o.stormReconnectMax
		metrics := []string{"connect s", "TokenReviews", "attempts", "server CPU s"}
		if reconnect {
			metrics = append(metrics, "reconnect s", "reconnect TokenReviews", "reconnect server CPU s")
		}
		m := newMeasure(fmt.Sprintf("10. agent reconnect storm, %d agents with tokens, kube-apiserver 1.36", n), metrics)
		m.note = fmt.Sprintf("Each agent presents a token of its own (TokenRequest); each round starts a fresh server. "+
			"A phase that did not finish within %s is not recorded.", b.o.stormTimeout)
		for round := 0; round < b.o.stormRounds; round++ {
			for _, c := range []struct {
				name string
				argv []string
				port int
			}{
				{"konnect", []string{b.o.konnect, "server"}, 12132},
				{"upstream", []string{b.o.proxyServer}, 13132},
			} {
				argv := append(c.argv, b.stormServerArgs(b.path("storm-"+c.name+".sock"), c.port, kubeconfig)...)
				v, err := b.stormRound(n, c.port, argv, tokensFile, reconnect)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", m.title, c.name, err)
				}
				fmt.Printf("  storm %d, %s: %v\n", n, c.name, v)
				m.add(c.name, v)
			}
		}
		if k, ok := m.stat("konnect", "reconnect TokenReviews"); ok && k.max == 0 {
			m.note += " konnect answered every reconnecting agent from its cache of successful reviews (no TokenReview)."
		}
		m.print()
		b.results = append(b.results, m)
	}
	return nil
}

// stormServerArgs are the drop-in flags both servers run with in the storm: gRPC over uds, agents by token
// reviewed through kubeconfig on port, admin on port+1 and health on port+2.
func (b *bench) stormServerArgs(uds string, port int, kubeconfig string) []string {
	pki := b.path("k", "pki")
	return []string{"--mode=grpc", "--uds-name=" + uds, "--delete-existing-uds-file", "--server-port=0",
		"--cluster-cert=" + filepath.Join(pki, "konnectivity-server.crt"), "--cluster-key=" + filepath.Join(pki, "konnectivity-server.key"),
		"--agent-port=" + strconv.Itoa(port), "--admin-port=" + strconv.Itoa(port+1), "--health-port=" + strconv.Itoa(port+2),
		"--admin-bind-address=127.0.0.1", "--health-bind-address=127.0.0.1",
		"--kubeconfig=" + kubeconfig, "--agent-namespace=" + stormNamespace, "--agent-service-account=" + stormSA,
		"--authentication-audience=" + stormAudience, "--v=0"}
}

type stormReport struct {
	Phase     string  `json:"phase"`
	Connected int     `json:"connected"`
	Failed    int     `json:"failed"`
	Attempts  float64 `json:"attempts"`
	Seconds   float64 `json:"seconds"`
	FirstErr  string  `json:"first_error"`
}

func (b *bench) stormRound(n, port int, serverArgv []string, tokensFile string, reconnect bool) (map[string]float64, error) {
	server, err := b.t.start("storm-server", "cp", serverArgv...)
	if err != nil {
		return nil, err
	}
	defer server.stop()
	if err := b.t.waitHTTP("cp", fmt.Sprintf("http://127.0.0.1:%d/healthz", port+2), 30*time.Second, server); err != nil {
		return nil, err
	}
	reviews0, err := b.tokenReviews()
	if err != nil {
		return nil, err
	}
	cpu0, err := server.cpuSeconds()
	if err != nil {
		return nil, err
	}
	argv := []string{b.o.swarm, "--server=" + cpAddr + ":" + strconv.Itoa(port), "--server-name=" + cpAddr,
		"--ca-cert=" + filepath.Join(b.path("k", "pki"), "ca.crt"), "--tokens=" + tokensFile,
		"--agents=" + strconv.Itoa(n), "--parallel=" + strconv.Itoa(n), "--source-cidr=" + swarmSources,
		"--timeout=" + b.o.stormTimeout.String()}
	if reconnect {
		argv = append(argv, "--reconnect=2s")
	}
	swarm, err := b.t.start("storm-swarm", "w1", argv...)
	if err != nil {
		return nil, err
	}
	defer swarm.stop()
	out := map[string]float64{}
	phase := func(name, prefix string) error {
		rep, err := b.stormReport(swarm, name)
		if err != nil {
			return err
		}
		if rep.Connected != n {
			return fmt.Errorf("%s: %d of %d agents connected within %s (first error: %s)", name, rep.Connected, n, b.o.stormTimeout, rep.FirstErr)
		}
		reviews, err := b.tokenReviews()
		if err != nil {
			return err
		}
		cpu, err := server.cpuSeconds()
		if err != nil {
			return err
		}
		out[prefix+"s"] = rep.Seconds
		out[strings.TrimPrefix(prefix+"TokenReviews", "connect ")] = reviews - reviews0
		out[strings.TrimPrefix(prefix+"server CPU s", "connect ")] = cpu - cpu0
		if name == "connect" {
			out["attempts"] = rep.Attempts
		}
		reviews0, cpu0 = reviews, cpu
		return nil
	}
	if err := phase("connect", "connect "); err != nil {
		return nil, err
	}
	if reconnect {
		if err := phase("reconnect", "reconnect "); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// stormReport waits for the swarm's report of one phase.
func (b *bench) stormReport(swarm *proc, phase string) (stormReport, error) {
	var rep stormReport
	err := poll("the swarm's "+phase+" report", b.o.stormTimeout+time.Minute, 200*time.Millisecond, swarm, func() error {
		data, err := os.ReadFile(swarm.LogPath)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &rep) == nil && rep.Phase == phase {
				return nil
			}
		}
		return fmt.Errorf("no report yet")
	})
	return rep, err
}

// tokenReviews is how many TokenReviews kube-apiserver has answered, from its own metrics.
func (b *bench) tokenReviews() (float64, error) {
	cs, err := b.api.Client()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `resource="tokenreviews"`) {
			if i := strings.LastIndexByte(line, ' '); i > 0 {
				v, _ := strconv.ParseFloat(line[i+1:], 64)
				sum += v
			}
		}
	}
	return sum, nil
}
