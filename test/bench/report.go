package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// measure holds every sample of one benchmark row: contender → metric → values, in the order taken.
type measure struct {
	title   string
	note    string // printed under the row's table
	metrics []string
	order   []string
	samples map[string]map[string][]float64
}

func newMeasure(title string, metrics []string) *measure {
	return &measure{title: title, metrics: metrics, samples: map[string]map[string][]float64{}}
}

func (m *measure) add(contender string, v map[string]float64) {
	if m.samples[contender] == nil {
		m.samples[contender] = map[string][]float64{}
		m.order = append(m.order, contender)
	}
	for k, x := range v {
		m.samples[contender][k] = append(m.samples[contender][k], x)
	}
}

type stat struct{ median, min, max float64 }

func (m *measure) stat(contender, metric string) (stat, bool) {
	xs := append([]float64(nil), m.samples[contender][metric]...)
	if len(xs) == 0 {
		return stat{}, false
	}
	sort.Float64s(xs)
	med := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		med = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return stat{med, xs[0], xs[len(xs)-1]}, true
}

func fmtNum(x float64) string {
	switch {
	case x >= 1000:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func (m *measure) cell(contender, metric string) string {
	s, ok := m.stat(contender, metric)
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%s (%s–%s)", fmtNum(s.median), fmtNum(s.min), fmtNum(s.max))
}

func (m *measure) print() {
	fmt.Printf("\n%s\n", m.title)
	for _, c := range m.order {
		var parts []string
		for _, metric := range m.metrics {
			parts = append(parts, metric+" "+m.cell(c, metric))
		}
		fmt.Printf("  %-28s %s\n", c, strings.Join(parts, ", "))
	}
	if m.note != "" {
		fmt.Printf("  %s\n", m.note)
	}
}

// ratio is one comparison the report states: konnect's median against a peer's, oriented so that a larger
// number is always better for konnect, with the target the project holds itself to.
type ratio struct {
	label  string
	value  float64
	target float64
	ok     bool
}

func (b *bench) ratios() []ratio {
	var out []ratio
	find := func(prefix string) *measure {
		for _, m := range b.results {
			if strings.HasPrefix(m.title, prefix) {
				return m
			}
		}
		return nil
	}
	// higherBetter: konnect/peer; otherwise peer/konnect.
	add := func(m *measure, label, a, bName, metric string, higherBetter bool, target float64) {
		if m == nil {
			return
		}
		sa, ok1 := m.stat(a, metric)
		sb, ok2 := m.stat(bName, metric)
		if !ok1 || !ok2 || sa.median == 0 || sb.median == 0 {
			return
		}
		v := sa.median / sb.median
		if !higherBetter {
			v = sb.median / sa.median
		}
		out = append(out, ratio{label: label, value: v, target: target, ok: v >= target})
	}
	bulk1, bulk8 := find("1. tunnel bulk"), (*measure)(nil)
	for _, m := range b.results {
		if strings.HasPrefix(m.title, "1. tunnel bulk") && strings.Contains(m.title, "8 stream") {
			bulk8 = m
		}
	}
	add(bulk1, "tunnel bulk 1 stream: konnect / upstream", "konnect", "upstream", "MB/s", true, 3)
	add(bulk1, "tunnel bulk 1 stream: konnect / direct", "konnect", "direct", "MB/s", true, 0.4)
	add(bulk1, "tunnel bulk 1 stream: konnect / ceiling", "konnect", "ceiling", "MB/s", true, 0)
	add(bulk1, "tunnel bulk 1 stream: upstream / ceiling", "upstream", "ceiling", "MB/s", true, 0)
	add(bulk1, "tunnel bulk 1 stream: konnect / konnect before", "konnect", baselineName, "MB/s", true, 0)
	add(bulk8, "tunnel bulk 8 streams: konnect / upstream", "konnect", "upstream", "MB/s", true, 1)
	add(bulk8, "tunnel bulk 8 streams: konnect / ceiling", "konnect", "ceiling", "MB/s", true, 0)
	if bulk1 != nil && bulk8 != nil {
		s1, ok1 := bulk1.stat("konnect", "MB/s")
		s8, ok8 := bulk8.stat("konnect", "MB/s")
		if ok1 && ok8 && s1.median > 0 {
			v := s8.median / s1.median
			out = append(out, ratio{"tunnel bulk: konnect 8 streams / 1 stream", v, 1.5, v >= 1.5})
		}
	}
	dial := find("2. tunnel dial")
	add(dial, "tunnel dial p50: upstream / konnect", "konnect", "upstream", "p50 ms", false, 1)
	add(dial, "tunnel dial p99: upstream / konnect", "konnect", "upstream", "p99 ms", false, 1)
	scale := find("3. tunnel scale")
	add(scale, "tunnel scale: successes konnect / upstream", "konnect", "upstream", "ok", true, 1)
	add(scale, "tunnel scale: server RSS upstream / konnect", "konnect", "upstream", "server RSS MiB", false, 1)
	add(scale, "tunnel scale: server anonymous RSS upstream / konnect", "konnect", "upstream", "server anon MiB", false, 0)
	add(scale, "tunnel scale: agent RSS upstream / konnect", "konnect", "upstream", "agent RSS MiB", false, 0)
	add(scale, "tunnel scale: server RSS konnect before / konnect", "konnect", baselineName, "server RSS MiB", false, 0)
	add(find("4. agent idle"), "agent idle RSS: upstream / konnect", "konnect", "upstream", "RSS MiB", false, 1)
	add(find("4. agent idle"), "agent idle anonymous RSS: upstream / konnect", "konnect", "upstream", "anon MiB", false, 0)
	add(find("4. agent idle"), "agent idle RSS: konnect before / konnect", "konnect", baselineName, "RSS MiB", false, 0)
	for _, m := range b.results {
		if !strings.HasPrefix(m.title, "8. swarm") {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimPrefix(m.title, "8. swarm, "), " ")
		add(m, "swarm "+n+": server RSS per agent upstream / konnect", "konnect", "upstream", "RSS/agent KiB", false, 2)
		add(m, "swarm "+n+": registration CPU upstream / konnect", "konnect", "upstream", "register CPU s", false, 1)
		add(m, "swarm "+n+": idle CPU upstream / konnect", "konnect", "upstream", "idle CPU %", false, 1)
		add(m, "swarm "+n+": time to register upstream / konnect", "konnect", "upstream", "register s", false, 0)
		add(m, "swarm "+n+": dials ok konnect / upstream", "konnect", "upstream", "dials ok", true, 1)
	}
	out = append(out, b.holRatios(add)...)
	for _, m := range b.results {
		if !strings.HasPrefix(m.title, "10. agent reconnect storm") {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimPrefix(m.title, "10. agent reconnect storm, "), " ")
		add(m, "storm "+n+": time until all connected upstream / konnect", "konnect", "upstream", "connect s", false, 1)
		add(m, "storm "+n+": TokenReviews upstream / konnect", "konnect", "upstream", "TokenReviews", false, 1)
		add(m, "storm "+n+": server CPU upstream / konnect", "konnect", "upstream", "server CPU s", false, 0)
		add(m, "storm "+n+": reconnect time upstream / konnect", "konnect", "upstream", "reconnect s", false, 1)
		add(m, "storm "+n+": reconnect TokenReviews upstream / konnect", "konnect", "upstream", "reconnect TokenReviews", false, 1)
	}
	socks := find("5. SOCKS5")
	add(socks, "SOCKS5 bulk: konnect / ssh -D (defaults)", "konnect", "ssh -D", "MB/s", true, 1.3)
	add(socks, "SOCKS5 bulk: konnect / ssh -D (same cipher)", "konnect", "ssh -D -c "+b.o.socksCipher, "MB/s", true, 0)
	add(socks, "SOCKS5 bulk: konnect / direct", "konnect", "direct", "MB/s", true, 0)
	add(socks, "SOCKS5 bulk: proxy CPU per GiB ssh -D / konnect", "konnect", "ssh -D", "proxy CPU s/GiB", false, 0)
	add(socks, "SOCKS5 bulk: sshd CPU per GiB serving ssh -D / konnect", "konnect", "ssh -D", "sshd CPU s/GiB", false, 0)
	par := find("9. SOCKS5")
	add(par, "SOCKS5 4 downloads: konnect --ssh-connections 4 / ssh -D", "konnect --ssh-connections 4", "ssh -D", "MB/s", true, 1.5)
	add(par, "SOCKS5 4 downloads: konnect (1 connection) / ssh -D", "konnect", "ssh -D", "MB/s", true, 0)
	sl := find("6. SOCKS5 connect")
	add(sl, "SOCKS5 connect p50: ssh -D / konnect", "konnect", "ssh -D", "p50 ms", false, 1)
	add(sl, "SOCKS5 connect p99: ssh -D / konnect", "konnect", "ssh -D", "p99 ms", false, 1)
	for _, m := range b.results {
		if !strings.HasPrefix(m.title, "7. API proxy") {
			continue
		}
		_, backend, _ := strings.Cut(m.title, "/api, ")
		add(m, "API proxy req/s ("+backend+"): konnect / kubectl proxy", "konnect", "kubectl proxy", "req/s", true, 1.3)
		add(m, "API proxy p99 ("+backend+"): kubectl proxy / konnect", "konnect", "kubectl proxy", "p99 ms", false, 1)
	}
	return out
}

func cpuLine() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "model name") {
			if _, v, ok := strings.Cut(line, ":"); ok {
				return fmt.Sprintf("%s, %d logical CPUs", strings.TrimSpace(v), runtime.NumCPU())
			}
		}
	}
	return fmt.Sprintf("%d logical CPUs", runtime.NumCPU())
}

func (b *bench) report() error {
	ratios := b.ratios()
	var sb strings.Builder
	sb.WriteString("# Benchmarks\n\n")
	sb.WriteString("konnect side by side with the programs its users would otherwise run, on one network-namespace\n")
	sb.WriteString("topology, in one run. Each pair ran alternately (A B A B …) after a warm-up round; cells are the\n")
	sb.WriteString("median with the spread (min–max) in brackets. The machine is shared and noisy: read the ratios,\n")
	sb.WriteString("not the absolute figures.\n\n")
	fmt.Fprintf(&sb, "- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&sb, "- CPU: %s\n", cpuLine())
	fmt.Fprintf(&sb, "- Command: `%s`\n", strings.Join(os.Args, " "))
	fmt.Fprintf(&sb, "- Rounds: %d measured per pair, after one warm-up", b.o.rounds)
	if b.wantRows()["10"] {
		fmt.Fprintf(&sb, "; row 10: %d per storm size and contender, without a warm-up (each on a fresh server)", b.o.stormRounds)
	}
	sb.WriteString("\n")
	if v, err := exec.Command(b.o.konnect, "version").Output(); err == nil {
		fmt.Fprintf(&sb, "- %s", v)
	}
	sb.WriteString("\nTopology: namespaces cp (konnect/upstream server, sshd, proxies), w1 (agents, backend on the pod\n")
	sb.WriteString("address 198.19.0.10) and lap (SOCKS5 clients), joined by veth pairs in 198.18.0.0/15, no default\n")
	sb.WriteString("routes. Tunnel clients dial through the server's UDS with konnectivity-client, one single-use\n")
	sb.WriteString("tunnel per connection, as kube-apiserver does. Both tunnels run with the same drop-in arguments\n")
	sb.WriteString("and mTLS agent authentication (row 10: ServiceAccount tokens reviewed by a real kube-apiserver);\n")
	sb.WriteString("both SSH proxies use the same sshd (OpenSSH, Debian) and key. Every tunnel server and agent,\n")
	sb.WriteString("konnect's and upstream's, runs from its own copy of its executable, as on a node of its own:\n")
	sb.WriteString("the kernel does not reclaim pages that several processes map.\n\n")

	sb.WriteString("## Ratios\n\nLarger is better for konnect in every row.\n\n| comparison | ratio | target | met |\n|---|---|---|---|\n")
	for _, r := range ratios {
		target, met := "–", "–"
		if r.target > 0 {
			target = fmt.Sprintf("≥ %.2g", r.target)
			met = map[bool]string{true: "yes", false: "**no**"}[r.ok]
		}
		fmt.Fprintf(&sb, "| %s | %.2f | %s | %s |\n", r.label, r.value, target, met)
	}
	sb.WriteString("\n## Measures\n")
	for _, m := range b.results {
		fmt.Fprintf(&sb, "\n### %s\n\n| | %s |\n|---|%s\n", m.title, strings.Join(m.metrics, " | "), strings.Repeat("---|", len(m.metrics)))
		for _, c := range m.order {
			var cells []string
			for _, metric := range m.metrics {
				cells = append(cells, m.cell(c, metric))
			}
			fmt.Fprintf(&sb, "| %s | %s |\n", c, strings.Join(cells, " | "))
		}
		if m.note != "" {
			fmt.Fprintf(&sb, "\n%s\n", m.note)
		}
	}
	fmt.Fprintf(&sb, "\n![ratios](%s)\n", filepath.Base(b.o.svg))
	fmt.Print("\n" + sb.String())
	if b.o.out != "" {
		if err := os.WriteFile(b.o.out, []byte(sb.String()), 0o644); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}
	if b.o.svg != "" {
		if err := os.WriteFile(b.o.svg, []byte(plot(ratios)), 0o644); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
	}
	return nil
}

// plot draws one horizontal bar per ratio on a log scale, with 1.0 (parity) and each target marked.
func plot(ratios []ratio) string {
	const (
		left, barH, gap, width = 330, 22, 8, 820
		plotW                  = width - left - 60
	)
	height := 60 + len(ratios)*(barH+gap) + 30
	// log2 scale from 1/8 to 16: parity sits in the middle-left, big wins stay on the chart.
	const lo, hi = -3.0, 4.0
	x := func(v float64) float64 {
		l := log2(v)
		if l < lo {
			l = lo
		}
		if l > hi {
			l = hi
		}
		return left + (l-lo)/(hi-lo)*plotW
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="22" font-size="15" font-weight="bold">konnect vs peers: ratio of medians (log scale, right of 1× = konnect better)</text>`+"\n")
	top := 45
	for _, t := range []float64{0.25, 0.5, 1, 2, 4, 8} {
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/><text x="%.1f" y="%d" text-anchor="middle" fill="#555">%g×</text>`+"\n",
			x(t), top, x(t), height-25, map[bool]string{true: "#333", false: "#ddd"}[t == 1], x(t), height-10, t)
	}
	for i, r := range ratios {
		y := top + 5 + i*(barH+gap)
		color := "#4a7fc1"
		if r.target > 0 {
			color = map[bool]string{true: "#3a9a50", false: "#c8553d"}[r.ok]
		}
		x0, x1 := x(1), x(r.value)
		if x1 < x0 {
			x0, x1 = x1, x0
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+barH-7, html.EscapeString(r.label))
		fmt.Fprintf(&sb, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y, x1-x0+1, barH, color)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d">%.2f×</text>`+"\n", x(r.value)+4, y+barH-7, r.value)
		if r.target > 0 {
			fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black" stroke-width="2" stroke-dasharray="3,2"/>`+"\n", x(r.target), y-2, x(r.target), y+barH+2)
		}
	}
	sb.WriteString(`<text x="10" y="` + fmt.Sprint(height-10) + `" fill="#555">green: target met, red: not met, blue: no target; dashed: target</text>` + "\n</svg>\n")
	return sb.String()
}

func log2(v float64) float64 {
	if v <= 0 {
		return -10
	}
	return math.Log2(v)
}
