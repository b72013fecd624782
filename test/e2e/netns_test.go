//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses of the simulated hosts. Everything is in 198.18.0.0/15, the
// range set aside for benchmark tests, and no namespace has a default route:
// a packet for anything else has nowhere to go.
const (
	cpAddr     = "198.18.0.1" // control plane, on the cp<->w1 link
	w1Addr     = "198.18.0.2"
	cpW2Addr   = "198.18.0.5" // cp's end of the cp<->w2 link
	w2Addr     = "198.18.0.6"
	cpLapAddr  = "198.18.1.1" // cp's end of the cp<->lap link; sshd listens here
	lapAddr    = "198.18.1.2"
	podAddr    = "198.19.0.10" // the "pod" on w1's lo; only w1 can reach it
	podPort    = 8443
	apiPort    = 6443
	serviceNet = "198.18.128.0/24" // --service-cluster-ip-range; never dialled
)

// Namespace roles.
const (
	nsCP  = "cp"
	nsW1  = "w1"
	nsW2  = "w2"
	nsLap = "lap"
)

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// topology is one set of network namespaces: cp, w1, w2 and lap.
type topology struct {
	prefix string            // e.g. kn1234-ab12-grpc
	names  map[string]string // role -> namespace name
}

func (tp *topology) ns(role string) string {
	n, ok := tp.names[role]
	if !ok {
		panic("unknown namespace role " + role)
	}
	return n
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// newTopology creates the namespaces and links:
//
//	w1 198.18.0.2/30 ── 198.18.0.1/30 cp 198.18.0.5/30 ── 198.18.0.6/30 w2
//	                                   cp 198.18.1.1/30 ── 198.18.1.2/30 lap
//
// plus the pod address 198.19.0.10/32 on w1's lo. w2 gets one host route to
// 198.18.0.1 so that every agent dials the same server address. lap has no
// route to 198.18.0.0/30: it reaches the API server only through sshd.
func newTopology(tag string) (*topology, error) {
	tp := &topology{prefix: runID + "-" + tag, names: map[string]string{}}
	for _, role := range []string{nsCP, nsW1, nsW2, nsLap} {
		name := tp.prefix + "-" + role
		if err := ipCmd("netns", "add", name); err != nil {
			tp.destroy()
			return nil, err
		}
		tp.names[role] = name
		track("netns "+name, func() { _ = ipCmd("netns", "del", name) })
		if err := ipCmd("-n", name, "link", "set", "lo", "up"); err != nil {
			tp.destroy()
			return nil, err
		}
	}
	type link struct {
		a, b         string // roles
		aDev, bDev   string
		aAddr, bAddr string
	}
	links := []link{
		{nsCP, nsW1, "to-w1", "to-cp", cpAddr + "/30", w1Addr + "/30"},
		{nsCP, nsW2, "to-w2", "to-cp", cpW2Addr + "/30", w2Addr + "/30"},
		{nsCP, nsLap, "to-lap", "to-cp", cpLapAddr + "/30", lapAddr + "/30"},
	}
	steps := [][]string{}
	for _, l := range links {
		a, b := tp.ns(l.a), tp.ns(l.b)
		// Both ends are created directly inside their namespaces, so the
		// device names never meet in the host's namespace.
		steps = append(steps,
			[]string{"link", "add", l.aDev, "netns", a, "type", "veth", "peer", "name", l.bDev, "netns", b},
			[]string{"-n", a, "addr", "add", l.aAddr, "dev", l.aDev},
			[]string{"-n", b, "addr", "add", l.bAddr, "dev", l.bDev},
			[]string{"-n", a, "link", "set", l.aDev, "up"},
			[]string{"-n", b, "link", "set", l.bDev, "up"},
		)
	}
	steps = append(steps,
		[]string{"-n", tp.ns(nsW1), "addr", "add", podAddr + "/32", "dev", "lo"},
		[]string{"-n", tp.ns(nsW2), "route", "add", cpAddr + "/32", "dev", "to-cp"},
	)
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			tp.destroy()
			return nil, err
		}
	}
	for _, n := range tp.names {
		if err := checkNoDefaultRoute(n); err != nil {
			tp.destroy()
			return nil, err
		}
	}
	return tp, nil
}

// checkNoDefaultRoute guards the network rule: a namespace with a default
// route could leak test traffic off the machine.
func checkNoDefaultRoute(ns string) error {
	for _, fam := range []string{"-4", "-6"} {
		out, err := exec.Command("ip", fam, "-n", ns, "route", "show", "default").CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s -n %s route show default: %w: %s", fam, ns, err, out)
		}
		if len(bytes.TrimSpace(out)) > 0 {
			return fmt.Errorf("namespace %s has a default route (%s); refusing to run", ns, bytes.TrimSpace(out))
		}
	}
	return nil
}

func (tp *topology) destroy() {
	if keepEnv {
		return
	}
	for _, n := range tp.names {
		killNamespacePids(n)
		_ = ipCmd("netns", "del", n)
	}
}

// killNamespacePids kills whatever still runs in ns; it is the last resort
// behind the per-process cleanup.
func killNamespacePids(ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

var staleNS = regexp.MustCompile(`^kn(\d+)-[0-9a-f]{4}-`)

// sweepStale deletes namespaces left by earlier runs whose test process is
// gone and in which nothing runs any more (KONNECT_E2E_KEEP=1 leaves live
// processes behind, and those namespaces are kept).
func sweepStale() {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		m := staleNS.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		out, _ := exec.Command("ip", "netns", "pids", e.Name()).Output()
		if len(bytes.TrimSpace(out)) > 0 {
			continue
		}
		fmt.Fprintf(os.Stderr, "e2e: removing stale namespace %s\n", e.Name())
		_ = ipCmd("netns", "del", e.Name())
	}
	// Work dirs of dead runs go too, unless that run's namespaces were kept.
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kn-e2e-kn*-*"))
	for _, d := range dirs {
		m := staleWorkDir.FindStringSubmatch(filepath.Base(d))
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[2])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		if kept, _ := filepath.Glob(filepath.Join("/run/netns", m[1]+"-*")); len(kept) > 0 {
			continue
		}
		fmt.Fprintf(os.Stderr, "e2e: removing stale work dir %s\n", d)
		_ = os.RemoveAll(d)
	}
}

var staleWorkDir = regexp.MustCompile(`^kn-e2e-(kn(\d+)-[0-9a-f]{4})-\d+$`)

// inNetns runs create on a thread that has joined namespace ns, so that the socket it creates belongs to ns.
// That thread is never returned to the scheduler (locked, then the goroutine exits), so no other goroutine
// ever runs in the wrong namespace.
func inNetns[T any](ns string, create func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread: the thread is discarded on exit.
		var zero T
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			ch <- result{zero, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{zero, fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		v, err := create()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

// dialIn opens a TCP connection from inside namespace ns.
func dialIn(ctx context.Context, ns, addr string) (net.Conn, error) {
	return inNetns(ns, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
}

// expectUnreachable checks that a direct TCP dial from ns to addr fails with
// "network is unreachable": there is no route, so any success elsewhere in
// the test went through the tunnel.
func expectUnreachable(ns, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dialIn(ctx, ns, addr)
	if err == nil {
		c.Close()
		return fmt.Errorf("direct dial from %s to %s succeeded; the tunnel is not the only path", ns, addr)
	}
	if !errors.Is(err, syscall.ENETUNREACH) {
		return fmt.Errorf("direct dial from %s to %s: want ENETUNREACH, got %w", ns, addr, err)
	}
	return nil
}
