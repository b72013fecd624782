package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// swarmRows measures one server holding many idle agents (test/bench/swarm, in w1), konnect and upstream
// with the same flags, alternating, each round on a fresh server: its RSS per agent, the CPU and time to
// register all of them (a reconnect storm), its idle CPU, and then 1000 dials spread over them.
func (b *bench) swarmRows() error {
	for _, n := range b.o.swarmSizes {
		m := newMeasure(fmt.Sprintf("8. swarm, %d idle agents on one server", n),
			[]string{"RSS/agent KiB", "register CPU s", "register s", "idle CPU %", "dials ok", "dial p99 ms"})
		if err := b.alternate(m,
			contender{"konnect", func() (map[string]float64, error) {
				return b.swarmRound(n, append([]string{b.o.konnect, "server"}, b.serverArgs(b.path("swarm-k.sock"), 10132)...))
			}},
			contender{"upstream", func() (map[string]float64, error) {
				return b.swarmRound(n, append([]string{b.o.proxyServer}, b.serverArgs(b.path("swarm-u.sock"), 11132)...))
			}},
		); err != nil {
			return err
		}
	}
	return nil
}

type swarmReport struct {
	Connected int     `json:"connected"`
	Failed    int     `json:"failed"`
	Seconds   float64 `json:"seconds"`
	FirstErr  string  `json:"first_error"`
}

func (b *bench) swarmRound(n int, serverArgv []string) (map[string]float64, error) {
	port := 0
	uds := ""
	for _, a := range serverArgv {
		if v, ok := strings.CutPrefix(a, "--agent-port="); ok {
			port, _ = strconv.Atoi(v)
		}
		if v, ok := strings.CutPrefix(a, "--uds-name="); ok {
			uds = v
		}
	}
	server, err := b.t.start("swarm-server", "cp", serverArgv...)
	if err != nil {
		return nil, err
	}
	defer server.stop()
	if err := b.t.waitHTTP("cp", fmt.Sprintf("http://127.0.0.1:%d/healthz", port+2), 30*time.Second, server); err != nil {
		return nil, err
	}
	rss0, err := server.rssKiB()
	if err != nil {
		return nil, err
	}
	cpu0, err := server.cpuSeconds()
	if err != nil {
		return nil, err
	}
	pki := b.path("k", "pki")
	swarm, err := b.t.start("swarm", "w1", b.o.swarm, "--server="+cpAddr+":"+strconv.Itoa(port), "--server-name="+cpAddr,
		"--ca-cert="+filepath.Join(pki, "ca.crt"),
		"--agent-cert="+filepath.Join(pki, "konnectivity-agent.crt"), "--agent-key="+filepath.Join(pki, "konnectivity-agent.key"),
		"--agents="+strconv.Itoa(n), "--timeout=4m", "--source-cidr="+swarmSources)
	if err != nil {
		return nil, err
	}
	defer swarm.stop()
	var rep swarmReport
	if err := poll("the swarm's report", 5*time.Minute, 100*time.Millisecond, swarm, func() error {
		data, err := os.ReadFile(swarm.LogPath)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &rep) == nil {
				return nil
			}
		}
		return fmt.Errorf("no report yet")
	}); err != nil {
		return nil, err
	}
	if rep.Connected != n {
		return nil, fmt.Errorf("swarm: %d of %d agents connected (first error: %s)", rep.Connected, n, rep.FirstErr)
	}
	cpu1, err := server.cpuSeconds()
	if err != nil {
		return nil, err
	}
	time.Sleep(b.o.swarmIdle) // the idle window: nothing but the connections themselves
	cpu2, err := server.cpuSeconds()
	if err != nil {
		return nil, err
	}
	rss, err := server.rssKiB()
	if err != nil {
		return nil, err
	}
	// The agents answer every dial themselves, so any address does; the default strategy spreads the dials.
	r, err := b.loadgen("cp", "--mode=dial", "--uds="+uds, "--target="+podAddr+":"+podPort, "--count=1000")
	if err != nil {
		return nil, err
	}
	return map[string]float64{
		"RSS/agent KiB":  float64(rss-rss0) / float64(n),
		"register CPU s": cpu1 - cpu0,
		"register s":     rep.Seconds,
		"idle CPU %":     100 * (cpu2 - cpu1) / b.o.swarmIdle.Seconds(),
		"dials ok":       float64(r.OK),
		"dial p99 ms":    r.P99ms,
	}, nil
}
