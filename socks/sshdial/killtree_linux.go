package sshdial

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// killTree kills process pid and its descendants, found in /proc. They are killed before pid: a process
// whose parent died is init's, out of reach. A process group of their own would be simpler, but the command
// runs in konnect's, as under ssh, so that a prompt it opens on the terminal is not stopped as a background
// job's.
func killTree(pid int) error {
	for range 3 { // what forked while the tree was read is found on the next round
		tree := descendants(pid)
		if len(tree) == 0 {
			break
		}
		for _, p := range tree {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// descendants are the processes under pid, read from /proc: each process's parent is in its stat file.
func descendants(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses, the last ")" ends it.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}
