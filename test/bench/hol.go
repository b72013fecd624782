package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// holScenario is one run of the head-of-line row: quick requests beside slow transfers.
type holScenario struct {
	name   string
	slow   int
	upload bool
}

// holScenarios are the head-of-line row's runs: quick requests alone, then beside N slow readers, then
// beside a slow upload.
var holScenarios = []holScenario{{"alone", 0, false}, {"1 slow reader", 1, false}, {"10 slow readers", 10, false},
	{"100 slow readers", 100, false}, {"1 slow upload", 0, true}}

// holRow measures, through one agent, quick requests (a new tunnel and a small GET each, one after another)
// alone and beside slow transfers that read 64 KB/s each, larger than anything on their path buffers for
// them, konnect and upstream alternately (row 11). Each run also reads the server's memory once the slow
// transfers have filled what they may hold.
func (b *bench) holRow() error {
	metrics := []string{"p50 ms", "p99 ms", "failed", "slow transfers complete %", "server RSS MiB", "server anon MiB"}
	title := fmt.Sprintf("11. head-of-line, quick requests for %s beside transfers read at 64 KB/s, %s each",
		b.o.holMeasure, size(b.o.holBytes))
	// One measure per scenario, so that each keeps its own table.
	measures := map[string]*measure{}
	for _, sc := range holScenarios {
		measures[sc.name] = newMeasure(title+": "+sc.name, metrics)
	}
	run := func(sc holScenario, uds string, server *proc) (map[string]float64, error) {
		ready := b.path("hol.ready")
		_ = os.Remove(ready)
		args := []string{"--mode=hol", "--uds=" + uds, "--target=" + podAddr + ":" + podPort,
			"--slow=" + strconv.Itoa(sc.slow), "--slow-rate=65536", fmt.Sprintf("--slow-bytes=%d", b.o.holBytes),
			"--fill=2s", "--measure=" + b.o.holMeasure.String(), "--quick-timeout=5s", "--ready-file=" + ready}
		if sc.upload {
			args = append(args, "--slow-upload")
		}
		type out struct {
			r   holOut
			err error
		}
		done := make(chan out, 1)
		go func() {
			r, err := b.holLoadgen(args...)
			done <- out{r, err}
		}()
		var rss, anon float64
		for rss == 0 {
			if _, err := os.Stat(ready); err == nil {
				kb, _ := server.rssKiB()
				a, _ := harness.AnonRSSKiB(server.Pid())
				rss, anon = float64(kb)/1024, float64(a)/1024
				break
			}
			select {
			case o := <-done:
				return nil, fmt.Errorf("the run ended before its slow transfers were under way: %v", o.err)
			case <-time.After(50 * time.Millisecond):
			}
		}
		o := <-done
		if o.err != nil {
			return nil, o.err
		}
		slows := sc.slow
		if sc.upload {
			slows++
		}
		complete := 100.0
		if slows > 0 {
			complete = 100 * float64(o.r.SlowOK) / float64(slows)
		}
		return map[string]float64{"p50 ms": o.r.P50ms, "p99 ms": o.r.P99ms, "failed": float64(o.r.Failed),
			"slow transfers complete %": complete, "server RSS MiB": rss, "server anon MiB": anon}, nil
	}
	for round := 0; round < b.o.holRounds; round++ {
		for _, sc := range holScenarios {
			type tunnel struct {
				name   string
				uds    string
				server *proc
			}
			tunnels := []tunnel{{"konnect", b.path("konnect.sock"), b.kServer}, {"upstream", b.path("upstream.sock"), b.uServer}}
			if b.bServer != nil {
				tunnels = append(tunnels, tunnel{baselineName, b.path("baseline.sock"), b.bServer})
			}
			for _, c := range tunnels {
				v, err := run(sc, c.uds, c.server)
				if err != nil {
					return fmt.Errorf("%s, %s, %s: %w", title, sc.name, c.name, err)
				}
				measures[sc.name].add(c.name, v)
			}
		}
	}
	for _, sc := range holScenarios {
		mm := measures[sc.name]
		if sc.name == "alone" {
			mm.note = "Quick requests that fail count at their 5 s bound in the percentiles."
		}
		mm.print()
		b.results = append(b.results, mm)
	}
	return nil
}

// holOut is loadgen's answer in hol mode.
type holOut struct {
	loadResult
	SlowOK    int   `json:"slow_ok"`
	SlowBytes int64 `json:"slow_bytes"`
}

// holLoadgen runs loadgen in hol mode in cp. Failed quick requests and incomplete slow transfers are
// results here, not errors.
func (b *bench) holLoadgen(args ...string) (holOut, error) {
	var r holOut
	out, err := b.execFor(10*time.Minute, "cp", append([]string{b.o.loadgen}, args...)...)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return r, fmt.Errorf("loadgen output %q: %w", out, err)
	}
	return r, nil
}

// holRatios are the head-of-line row's goals: konnect's p99 beside slow transfers at most twice its p99
// alone plus 20 ms, no failed request, and every slow transfer complete; and how upstream fares beside it.
func (b *bench) holRatios(add func(m *measure, label, a, bName, metric string, higherBetter bool, target float64)) []ratio {
	var out []ratio
	find := func(name string) *measure {
		for _, m := range b.results {
			if strings.HasPrefix(m.title, "11. head-of-line") && strings.HasSuffix(m.title, ": "+name) {
				return m
			}
		}
		return nil
	}
	alone := find("alone")
	if alone == nil {
		return nil
	}
	base, ok := alone.stat("konnect", "p99 ms")
	if !ok {
		return nil
	}
	for _, sc := range holScenarios[1:] {
		m := find(sc.name)
		if m == nil {
			continue
		}
		if s, ok := m.stat("konnect", "p99 ms"); ok && s.max > 0 {
			// The worst round, not the median: the goal holds for every run or it is not met.
			v := (2*base.median + 20) / s.max
			out = append(out, ratio{fmt.Sprintf("head-of-line, %s: konnect's goal (2×p99 alone + 20 ms) / its worst p99", sc.name), v, 1, v >= 1})
		}
		if s, ok := m.stat("konnect", "failed"); ok {
			v := 1 / (1 + s.max)
			out = append(out, ratio{fmt.Sprintf("head-of-line, %s: 1 / (1 + konnect's failed quick requests, worst round)", sc.name), v, 1, v >= 1})
		}
		if s, ok := m.stat("konnect", "slow transfers complete %"); ok {
			v := s.min / 100
			out = append(out, ratio{fmt.Sprintf("head-of-line, %s: konnect's slow transfers complete (worst round)", sc.name), v, 1, v >= 1})
		}
		add(m, fmt.Sprintf("head-of-line, %s: quick p99 upstream / konnect", sc.name), "konnect", "upstream", "p99 ms", false, 0)
		add(m, fmt.Sprintf("head-of-line, %s: quick p99 konnect before / konnect", sc.name), "konnect", baselineName, "p99 ms", false, 0)
		add(m, fmt.Sprintf("memory, %s at full windows: server RSS upstream / konnect", sc.name), "konnect", "upstream", "server RSS MiB", false, 1)
	}
	return out
}
