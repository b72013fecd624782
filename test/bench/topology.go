package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
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
	// swarmSources are the swarm's source addresses in w1 (a local route there, routed to w1 from cp): as
	// many agents' nodes, 1,022 of them.
	swarmSources = "198.18.8.0/22"
)

func (t *topology) ns(name string) string { return t.prefix + "-" + name }

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
	cp, w1, lap := t.ns("cp"), t.ns("w1"), t.ns("lap")
	err := harness.CreateNetns([]string{cp, w1, lap}, []harness.Link{
		{A: cp, ADev: "to-w1", AAddr: cpAddr + "/30", B: w1, BDev: "to-cp", BAddr: w1Addr + "/30"},
		{A: cp, ADev: "to-lap", AAddr: cpLapAddr + "/30", B: lap, BDev: "to-cp", BAddr: lapAddr + "/30"},
	}, []string{"-n", w1, "addr", "add", podAddr + "/32", "dev", "lo"},
		[]string{"-n", w1, "route", "add", "local", swarmSources, "dev", "lo"},
		[]string{"-n", cp, "route", "add", swarmSources, "via", w1Addr})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// close stops every process and deletes the namespaces, with whatever still runs in them.
func (t *topology) close() {
	for i := len(t.procs) - 1; i >= 0; i-- {
		t.procs[i].stop()
	}
	harness.DeleteNetns(t.ns("cp"), t.ns("w1"), t.ns("lap"))
}

// proc is a harness.Proc in one of the namespaces.
type proc struct{ *harness.Proc }

// start runs a long-lived program in a namespace, its output in DIR/logs/NAME.log.
func (t *topology) start(name, ns string, argv ...string) (*proc, error) {
	logDir := filepath.Join(t.dir, "logs")
	_ = os.MkdirAll(logDir, 0o755)
	p := &proc{&harness.Proc{Name: name, LogPath: filepath.Join(logDir, name+".log"), Argv: argv, Via: harness.NetnsExec(t.ns(ns)), Keep: t.keep}}
	// A fresh log for each start: the swarm's report is read from its log, and a second round must not
	// find the first one's.
	if err := os.WriteFile(p.LogPath, nil, 0o644); err != nil {
		return nil, err
	}
	if err := p.Launch(); err != nil {
		return nil, err
	}
	t.procs = append(t.procs, p)
	return p, nil
}

// stop sends SIGTERM to the process group, then SIGKILL after a grace period.
func (p *proc) stop() { _ = p.Stop(syscall.SIGTERM, 5*time.Second) }

// rssKiB reads the resident set size of the process (ip netns exec execs, so the pid is the program's).
func (p *proc) rssKiB() (int64, error) {
	info, err := p.info()
	return int64(info.RSSKiB), err
}

// cpuSeconds reads the user and system CPU time the process has used.
func (p *proc) cpuSeconds() (float64, error) {
	info, err := p.info()
	return info.CPU.Seconds(), err
}

func (p *proc) info() (harness.ProcInfo, error) {
	info, ok := harness.Process(p.Pid())
	if !ok {
		return info, fmt.Errorf("%s (pid %d) is gone", p.Name, p.Pid())
	}
	return info, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times; 100 on every Linux this runs on.
const clockTicks = 100

// poll is harness.Poll that also gives up when p (if not nil) exits meanwhile, and shows p's log tail.
func poll(what string, within, interval time.Duration, p *proc, fn func() error) error {
	err := harness.Poll(what, within, interval, func() error {
		if p != nil {
			if err := p.Exited(); err != nil {
				return err
			}
		}
		return fn()
	})
	if err != nil && p != nil && p.Running() {
		return fmt.Errorf("%w:\n%s", err, p.LogTail(20))
	}
	return err
}

// waitHTTP polls url from inside ns until it answers 200 or the deadline passes.
func (t *topology) waitHTTP(ns, url string, within time.Duration, p *proc) error {
	return poll(url, within, 200*time.Millisecond, p, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := harness.Run(ctx, t.ns(ns), "curl", "-fsS", "-o", "/dev/null", url)
		return err
	})
}

// waitTCP polls until addr accepts a TCP connection from inside ns.
func (t *topology) waitTCP(ns, addr string, within time.Duration, p *proc) error {
	return poll(addr+" accepting connections", within, 200*time.Millisecond, p, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := harness.DialIn(ctx, t.ns(ns), addr)
		if err == nil {
			c.Close()
		}
		return err
	})
}
