package sshdial

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fdpassPair is a connected unix socketpair: the end receiveFD reads and the end a command would write.
func fdpassPair(t *testing.T) (*net.UnixConn, int) {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(sp[0]), "ours")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); unix.Close(sp[1]) })
	return c.(*net.UnixConn), sp[1]
}

// openFDs is how many descriptors this process has open.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// receiveFD takes exactly one descriptor, as OpenSSH's mm_receive_fd: it is returned close-on-exec; several
// are refused and closed, none of them left open; bytes with no descriptor, and an end with none, are errors
// that say so.
func TestReceiveFD(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()

	t.Run("one", func(t *testing.T) {
		ours, theirs := fdpassPair(t)
		if err := unix.Sendmsg(theirs, []byte{0}, unix.UnixRights(int(w.Fd())), nil, 0); err != nil {
			t.Fatal(err)
		}
		fd, err := receiveFD(ours)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		var got, want unix.Stat_t
		unix.Fstat(fd, &got)
		unix.Fstat(int(w.Fd()), &want)
		if got.Ino != want.Ino || fd == int(w.Fd()) {
			t.Errorf("received fd %d (inode %d), want a new descriptor of the pipe (inode %d)", fd, got.Ino, want.Ino)
		}
		if flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("received fd is not close-on-exec: a command started later would inherit it")
		}
	})
	t.Run("two", func(t *testing.T) {
		ours, theirs := fdpassPair(t)
		before := openFDs(t)
		if err := unix.Sendmsg(theirs, []byte{0}, unix.UnixRights(int(w.Fd()), int(r.Fd())), nil, 0); err != nil {
			t.Fatal(err)
		}
		_, err := receiveFD(ours)
		if err == nil || !strings.Contains(err.Error(), "passed 2 descriptors") {
			t.Errorf("receiveFD = %v, want an error saying it passed 2 descriptors", err)
		}
		if n := openFDs(t); n != before {
			t.Errorf("%d descriptors open after refusing two, %d before", n, before)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		ours, theirs := fdpassPair(t)
		unix.Write(theirs, []byte("SSH-2.0-OpenSSH_9.2\r\n"))
		if _, err := receiveFD(ours); err == nil || !strings.Contains(err.Error(), `wrote to its stdout "S", not a descriptor`) {
			t.Errorf("receiveFD = %v, want an error saying what it wrote", err)
		}
	})
	t.Run("end", func(t *testing.T) {
		ours, theirs := fdpassPair(t)
		unix.Shutdown(theirs, unix.SHUT_WR)
		if _, err := receiveFD(ours); !errors.Is(err, errStdoutEnded) {
			t.Errorf("receiveFD = %v, want %v", err, errStdoutEnded)
		}
	})
}
