package harness

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ProcInfo is one process as /proc shows it.
type ProcInfo struct {
	Pid, PPid int
	CPU       time.Duration // user plus system time so far
	RSSKiB    int           // resident set size
	Args      []string
}

// Process reads /proc/pid; ok is false when the process is gone.
func Process(pid int) (p ProcInfo, ok bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return p, false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return p, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return p, false
	}
	p.Pid = pid
	p.PPid, _ = strconv.Atoi(f[1])
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	p.CPU = time.Duration(utime+stime) * 10 * time.Millisecond // clock ticks, 100 a second on Linux
	rss, _ := strconv.Atoi(f[21])
	p.RSSKiB = rss * os.Getpagesize() / 1024
	if cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		p.Args = strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	}
	return p, true
}

// Processes lists every process on the host; those that exit while it reads are left out.
func Processes() []ProcInfo {
	entries, _ := os.ReadDir("/proc")
	var ps []ProcInfo
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if p, ok := Process(pid); ok {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// Descendants returns the pids of pid's children, their children, and so on.
func Descendants(pid int) []int {
	children := map[int][]int{}
	for _, p := range Processes() {
		children[p.PPid] = append(children[p.PPid], p.Pid)
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			out = append(out, c)
			walk(c)
		}
	}
	walk(pid)
	return out
}

// CPUTime is the user plus system CPU time a process has used so far; 0 once it is gone.
func CPUTime(pid int) time.Duration {
	p, _ := Process(pid)
	return p.CPU
}

// AnonRSSKiB is the part of pid's resident set that is anonymous memory (heap, stacks): what the process
// itself allocated, as opposed to the pages of its executable, which every process running the same file
// shares and the kernel can drop and read back.
func AnonRSSKiB(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, errors.New("no RssAnon in /proc/" + strconv.Itoa(pid) + "/status")
}
