package harness

import (
	"bytes"
	"context"
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

	"golang.org/x/sys/unix"
)

// NetnsExec is the command prefix that runs a program in namespace ns, in a mount namespace of its own.
func NetnsExec(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// NsenterNet is the command prefix that runs a program in namespace ns but in the host's mount namespace,
// where /sys/fs/cgroup is not empty (containerd and kubelet need it).
func NsenterNet(ns string) []string {
	return []string{"nsenter", "--net=" + filepath.Join("/run/netns", ns), "--"}
}

// IP runs `ip args...`.
func IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Link is a veth pair between two namespaces; the addresses carry their prefix length.
type Link struct {
	A, ADev, AAddr string
	B, BDev, BAddr string
}

// CreateNetns creates the namespaces with lo up, joins them with links, runs the extra `ip` commands
// (addresses, routes), and checks that none has a default route. On an error it deletes them again.
func CreateNetns(names []string, links []Link, extra ...[]string) error {
	var steps [][]string
	for _, n := range names {
		steps = append(steps, []string{"netns", "add", n}, []string{"-n", n, "link", "set", "lo", "up"})
	}
	for _, l := range links {
		// Both ends are created inside their namespaces, so device names never meet in the host's.
		steps = append(steps,
			[]string{"link", "add", l.ADev, "netns", l.A, "type", "veth", "peer", "name", l.BDev, "netns", l.B},
			[]string{"-n", l.A, "addr", "add", l.AAddr, "dev", l.ADev},
			[]string{"-n", l.B, "addr", "add", l.BAddr, "dev", l.BDev},
			[]string{"-n", l.A, "link", "set", l.ADev, "up"},
			[]string{"-n", l.B, "link", "set", l.BDev, "up"})
	}
	for _, s := range append(steps, extra...) {
		if err := IP(s...); err != nil {
			DeleteNetns(names...)
			return err
		}
	}
	for _, n := range names {
		if err := checkNoDefaultRoute(n); err != nil {
			DeleteNetns(names...)
			return err
		}
	}
	return nil
}

// checkNoDefaultRoute guards the network rule: a namespace with a default route could leak test traffic
// off the machine.
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

// DeleteNetns kills what still runs in each namespace (sshd's per-connection children leave its process
// group, for one) and deletes it; the veth pairs go with it.
func DeleteNetns(names ...string) {
	for _, n := range names {
		for _, pid := range netnsPids(n) {
			if pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = IP("netns", "del", n)
	}
}

func netnsPids(ns string) []int {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// SweepNetns deletes the namespaces left by earlier runs: those whose name matches owner, whose first
// group is the pid of a process that is gone, and in which nothing runs any more (a run kept for
// debugging leaves live processes behind).
func SweepNetns(owner *regexp.Regexp) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if m := owner.FindStringSubmatch(e.Name()); m != nil && Gone(m[1]) && len(netnsPids(e.Name())) == 0 {
			fmt.Fprintf(os.Stderr, "removing stale namespace %s\n", e.Name())
			_ = IP("netns", "del", e.Name())
		}
	}
}

// Gone reports whether the run with this pid, another than this one, has ended.
func Gone(pid string) bool {
	n, _ := strconv.Atoi(pid)
	return n != os.Getpid() && syscall.Kill(n, 0) != nil
}

// InNetns runs fn on a thread that has joined namespace ns, so that the sockets it creates belong to ns.
// The thread is never returned to the scheduler (locked, then the goroutine exits), so no other
// goroutine ever runs in the wrong namespace.
func InNetns[T any](ns string, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // deliberately never unlocked: the thread is discarded on exit
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
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

// DialIn opens a TCP connection from inside namespace ns (the host's when ns is "").
func DialIn(ctx context.Context, ns, addr string) (net.Conn, error) {
	var d net.Dialer
	if ns == "" {
		return d.DialContext(ctx, "tcp", addr)
	}
	return InNetns(ns, func() (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) })
}
