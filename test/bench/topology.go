package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// topology is the benchmark's small world: a control-plane namespace (cp), a worker (w1) with a pod address
// on its lo, and a laptop (lap), joined by veth pairs. No namespace has a default route, so nothing here can
// reach anything outside.
type topology struct {
	prefix string
	dir    string
	procs  []*proc
	// keep leaves processes running after the run (for debugging); otherwise they die with it.
	keep bool
}

const (
	cpAddr     = "198.18.0.1"
	w1Addr     = "198.18.0.2"
	cpLapAddr  = "198.18.1.1"
	lapAddr    = "198.18.1.2"
	podAddr    = "198.19.0.10"
	podPort    = "8080"
	sshPort    = "2222"
	cpBackend  = "127.0.0.1:8081" // the SOCKS target, as sshd in cp sees it
	cpTLSAddr  = "127.0.0.1:8443" // the static HTTPS backend of the API-proxy row
	socksPort  = "1080"
	sshDPort   = "1081"
	sshDCipher = "1082"
	socksPortN = "1083" // konnect socks --ssh-connections 4
	relayPort  = "8140" // the far relay of the tunnel's ceiling, in w1
)

func (t *topology) ns(name string) string { return t.prefix + "-" + name }

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newTopology(dir string) (*topology, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the benchmarks need root for network namespaces (run as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("the benchmarks need `ip` from iproute2: %w", err)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	t := &topology{prefix: "kb" + hex.EncodeToString(b), dir: dir}
	steps := [][]string{
		{"netns", "add", t.ns("cp")}, {"netns", "add", t.ns("w1")}, {"netns", "add", t.ns("lap")},
		{"link", "add", t.prefix + "a", "netns", t.ns("cp"), "type", "veth", "peer", "name", t.prefix + "b", "netns", t.ns("w1")},
		{"link", "add", t.prefix + "c", "netns", t.ns("cp"), "type", "veth", "peer", "name", t.prefix + "d", "netns", t.ns("lap")},
		{"-n", t.ns("cp"), "addr", "add", cpAddr + "/30", "dev", t.prefix + "a"},
		{"-n", t.ns("w1"), "addr", "add", w1Addr + "/30", "dev", t.prefix + "b"},
		{"-n", t.ns("cp"), "addr", "add", cpLapAddr + "/30", "dev", t.prefix + "c"},
		{"-n", t.ns("lap"), "addr", "add", lapAddr + "/30", "dev", t.prefix + "d"},
		{"-n", t.ns("w1"), "addr", "add", podAddr + "/32", "dev", "lo"},
	}
	for _, n := range []string{"cp", "w1", "lap"} {
		steps = append(steps, []string{"-n", t.ns(n), "link", "set", "lo", "up"})
	}
	steps = append(steps,
		[]string{"-n", t.ns("cp"), "link", "set", t.prefix + "a", "up"}, []string{"-n", t.ns("w1"), "link", "set", t.prefix + "b", "up"},
		[]string{"-n", t.ns("cp"), "link", "set", t.prefix + "c", "up"}, []string{"-n", t.ns("lap"), "link", "set", t.prefix + "d", "up"})
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			t.close()
			return nil, err
		}
	}
	// The guarantee that nothing leaves the machine rests on this: no namespace may have a default route.
	for _, n := range []string{"cp", "w1", "lap"} {
		for _, fam := range []string{"-4", "-6"} {
			out, err := exec.Command("ip", fam, "-n", t.ns(n), "route", "show", "default").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.close()
				return nil, fmt.Errorf("namespace %s: default route check (%v): %q; refusing to run", t.ns(n), err, strings.TrimSpace(string(out)))
			}
		}
	}
	return t, nil
}

// close stops every process and deletes the namespaces (the veth pairs go with them). What still runs in
// a namespace after that (sshd's per-connection children leave its process group) is killed, so that no
// namespace outlives the run.
func (t *topology) close() {
	for i := len(t.procs) - 1; i >= 0; i-- {
		t.procs[i].stop()
	}
	for _, n := range []string{"cp", "w1", "lap"} {
		out, _ := exec.Command("ip", "netns", "pids", t.ns(n)).Output()
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = run("ip", "netns", "del", t.ns(n))
	}
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs a long-lived program in a namespace, its output in DIR/logs/NAME.log.
func (t *topology) start(name, ns string, argv ...string) (*proc, error) {
	logDir := filepath.Join(t.dir, "logs")
	_ = os.MkdirAll(logDir, 0o755)
	logFile := filepath.Join(logDir, name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", t.ns(ns)}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !t.keep {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	t.procs = append(t.procs, p)
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after a grace period.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// rssKiB reads the resident set size of the process (ip netns exec execs, so the pid is the program's).
func (p *proc) rssKiB() (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			var kb int64
			_, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:")), "%d kB", &kb)
			return kb, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for %s", p.name)
}

// cpuSeconds reads the user and system CPU time the process has used.
func (p *proc) cpuSeconds() (float64, error) { return procCPU(p.cmd.Process.Pid) }

// procStat returns the fields of /proc/PID/stat after the command name (field 3, the state, first).
func procStat(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// The fields after the command name, which may hold spaces, start after the last ')'.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return nil, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return f, nil
}

// procCPU reads the user and system CPU time a process has used, in seconds.
func procCPU(pid int) (float64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	var utime, stime float64
	if _, err := fmt.Sscan(f[11], &utime); err != nil {
		return 0, err
	}
	if _, err := fmt.Sscan(f[12], &stime); err != nil {
		return 0, err
	}
	return (utime + stime) / clockTicks, nil
}

// cpuOf is procCPU, 0 for a process that is gone.
func cpuOf(pid int) float64 {
	s, _ := procCPU(pid)
	return s
}

// descendants returns pid and every process under it, from /proc.
func descendants(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(n)
		if err != nil {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], n)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times; 100 on every Linux this runs on.
const clockTicks = 100

func (p *proc) tail(n int) string {
	data, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// exec runs a short command in a namespace and returns its stdout.
func (t *topology) exec(ctx context.Context, ns string, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.ns(ns)}, argv...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// poll calls fn every interval until it returns nil or within passes, and fails at once when p (if not
// nil) exits meanwhile. The error names what was awaited and carries fn's last error and p's log tail.
func poll(what string, within, interval time.Duration, p *proc, fn func() error) error {
	deadline := time.Now().Add(within)
	for {
		if p != nil && p.exited() {
			return fmt.Errorf("%s: %s exited:\n%s", what, p.name, p.tail(20))
		}
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			msg := ""
			if p != nil {
				msg = ":\n" + p.tail(20)
			}
			return fmt.Errorf("%s: not within %v: %w%s", what, within, err, msg)
		}
		time.Sleep(interval)
	}
}

// waitHTTP polls url from inside ns until it answers 200 or the deadline passes.
func (t *topology) waitHTTP(ns, url string, within time.Duration, p *proc) error {
	return poll(url, within, 200*time.Millisecond, p, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := t.exec(ctx, ns, "curl", "-fsS", "-o", "/dev/null", url)
		return err
	})
}

// waitTCP polls until addr accepts a TCP connection from inside ns.
func (t *topology) waitTCP(ns, addr string, within time.Duration, p *proc) error {
	host, port, _ := strings.Cut(addr, ":")
	return poll(addr+" accepting connections", within, 200*time.Millisecond, p, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := t.exec(ctx, ns, "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%s", host, port))
		return err
	})
}
