package daemon

import (
	"bufio"
	"context"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// madvPageout is Linux's MADV_PAGEOUT (5.4 and later): reclaim these pages now. The kernel skips pages that
// another process also maps, so it frees only what this process alone holds.
const madvPageout = 21

// startupSettle is how long a daemon runs before the pages its start-up touched are given back: long enough
// for the first connections, after which what it runs on is faulted back in and stays.
const startupSettle = 10 * time.Second

// releaseStartupPagesLater gives back, startupSettle after it is called, the memory that only start-up
// needed, unless ctx ends first.
func releaseStartupPagesLater(ctx context.Context) {
	t := time.NewTimer(startupSettle)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	n, err := releaseStartupPages()
	if err != nil {
		klog.V(2).InfoS("Could not give back start-up pages", "err", err)
		return
	}
	klog.V(2).InfoS("Gave back start-up pages", "advisedBytes", n)
}

// releaseStartupPages returns the heap that start-up left free to the kernel, and asks it to reclaim the
// executable's read-only pages (code, type data, tables) that this process holds. konnect is one binary
// for every command, and its start-up runs every package's initialisation and builds every command's flags:
// a daemon that then idles needs a small share of those pages, and the rest would stay resident for its
// whole life. Pages it touches again are read back in (from the page cache if they are still there) and
// stay. It returns how many bytes of mappings it advised.
func releaseStartupPages() (advised int, err error) {
	debug.FreeOSMemory()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvPageout); e != 0 {
			return advised, e // EINVAL: a kernel older than 5.4
		}
		advised += int(end - start)
	}
	return advised, sc.Err()
}
