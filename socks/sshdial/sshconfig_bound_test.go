package sshdial

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigIncludeBound: one reading of the SSH config files, ~/.ssh/config, the system file and every file
// they Include together, reads at most maxConfigFiles files and maxConfigBytes bytes; the file that passes
// a bound stops the start, named with the bound, and a config within both is read whole.
func TestConfigIncludeBound(t *testing.T) {
	// configs writes ~/.ssh/config including conf.d/*.conf, of the sizes in user, and the system file
	// including sys.d/*.conf, of the sizes in system (the last file of each sets the user for host h), and
	// returns the paths of the included files, in the order they are read. A total other than 0 sets the
	// size of the last file of user so that all the files make total bytes.
	configs := func(t *testing.T, user, system []int, total int) (userIncludes, systemIncludes []string) {
		t.Helper()
		home, dir := t.TempDir(), t.TempDir()
		setHome(t, home)
		prev := systemConfigFile
		t.Cleanup(func() { systemConfigFile = prev })
		userHead, systemHead := "Include conf.d/*.conf\n", "Include "+filepath.Join(dir, "sys.d", "*.conf")+"\n"
		systemConfigFile = writeConfig(t, dir, "ssh_config", systemHead)
		writeConfig(t, home, ".ssh/config", userHead)
		if total != 0 {
			rest := total - len(userHead) - len(systemHead)
			for _, size := range append(user[:len(user)-1:len(user)-1], system...) {
				rest -= size
			}
			user[len(user)-1] = rest
		}
		write := func(dir string, sizes []int, last string) (paths []string) {
			for i, size := range sizes {
				content := ""
				if i == len(sizes)-1 {
					content = "Host h\n  User " + last + "\n"
				}
				paths = append(paths, writeConfig(t, dir, fmt.Sprintf("%03d.conf", i), content+filler(size-len(content))))
			}
			return paths
		}
		return write(filepath.Join(home, ".ssh", "conf.d"), user, "fromuser"), write(filepath.Join(dir, "sys.d"), system, "fromsystem")
	}
	sizes := func(n, size int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = size
		}
		return s
	}
	wantRead := func(t *testing.T, user string) {
		t.Helper()
		p, err := resolve(Config{Destination: "h"})
		if err != nil {
			t.Fatal(err)
		}
		if p.hops[0].user != user {
			t.Errorf("user %q, want %q: not every file was read", p.hops[0].user, user)
		}
	}
	wantRefused := func(t *testing.T, file, bound string) {
		t.Helper()
		_, err := resolve(Config{Destination: "h"})
		if want := "ssh config " + file + ": "; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), bound) {
			t.Fatalf("err = %v, want one with %q and %q", err, want, bound)
		}
	}

	// 256 files: ~/.ssh/config, 254 files it includes, the system file.
	t.Run("256 files", func(t *testing.T) {
		configs(t, sizes(254, 30), nil, 0)
		wantRead(t, "fromuser")
	})
	// The 257th file, included by the system file: the two files' includes count together.
	t.Run("257 files, the last in the system file", func(t *testing.T) {
		_, sys := configs(t, sizes(254, 30), sizes(1, 30), 0)
		wantRefused(t, sys[0], "more than 256 files")
	})
	// The 257th file of ~/.ssh/config's own includes.
	t.Run("257 files in one glob", func(t *testing.T) {
		inc, _ := configs(t, sizes(300, 30), nil, 0)
		wantRefused(t, inc[255], "more than 256 files")
	})

	// The bound on bytes, lowered to keep the test fast: the parser reads some MiB a second.
	prev := maxConfigBytes
	t.Cleanup(func() { maxConfigBytes = prev })
	maxConfigBytes = 1 << 20
	// 256 files of maxConfigBytes in all, the files that Include the others counted too.
	t.Run("256 files of the bound in bytes", func(t *testing.T) {
		configs(t, sizes(254, int(maxConfigBytes)/254), nil, int(maxConfigBytes))
		wantRead(t, "fromuser")
	})
	// One byte more: the file read last, the system file, passes the bound.
	t.Run("a byte more than the bound", func(t *testing.T) {
		configs(t, sizes(254, int(maxConfigBytes)/254), nil, int(maxConfigBytes)+1)
		wantRefused(t, systemConfigFile, "more than 1 MiB")
	})
	// Included files of 300 KiB: the fourth passes 1 MiB.
	t.Run("included files past the bound", func(t *testing.T) {
		inc, _ := configs(t, sizes(5, 300<<10), nil, 0)
		wantRefused(t, inc[3], "more than 1 MiB")
	})
}

// filler is n bytes of comment lines, short ones: the parser is slow on long lines.
func filler(n int) string {
	var b strings.Builder
	for n >= 64 {
		b.WriteString("#" + strings.Repeat("x", 62) + "\n")
		n -= 64
	}
	switch {
	case n == 1:
		b.WriteString("\n")
	case n > 1:
		b.WriteString("#" + strings.Repeat("x", n-2) + "\n")
	}
	return b.String()
}
