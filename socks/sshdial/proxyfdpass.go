package sshdial

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// fdpassMaxFDs is how many descriptors a message may carry and still be read whole: a command that passes
// more than one has every one closed, none taken.
const fdpassMaxFDs = 8

// fdpassConnect reaches hop as OpenSSH's ProxyUseFdpass does (sshconnect.c, ssh_proxy_fdpass_connect): the
// command runs with one end of a unix socketpair as its stdin and stdout, connects, passes the connected
// socket back over it with SCM_RIGHTS, in one message with one byte of data (monitor_fdpass.c, mm_receive_fd),
// and exits; ssh waits for it and talks to that socket itself. The command's exit status is not looked at
// once the socket has come, as ssh does not look at it. ctx bounds the whole: a command that passes nothing,
// or passes a socket and does not exit, is killed and reaped when ctx ends, where ssh would wait for ever.
func fdpassConnect(ctx context.Context, command string, hop endpoint, log logr.Logger) (net.Conn, error) {
	fail := func(exited bool, status error, tail *stderrTail, err error) error {
		return &ProxyCommandError{Command: command, Endpoint: hop.String(), Exited: exited, Status: status, Stderr: tail.lines(), Err: err}
	}
	shell := os.Getenv("SHELL")
	if shell == "" {
		shell = "/bin/sh"
	}
	// Under ForkLock, as os/exec wants for descriptors opened without close-on-exec: none is inherited by
	// another command started meanwhile.
	syscall.ForkLock.RLock()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.CloseOnExec(sp[0])
		unix.CloseOnExec(sp[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("ProxyUseFdpass: socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(sp[0]), "fdpass-command")
	oursFile := os.NewFile(uintptr(sp[1]), "fdpass")
	fc, err := net.FileConn(oursFile) // a duplicate, non-blocking, so that ctx can interrupt the wait
	oursFile.Close()
	if err != nil {
		theirs.Close()
		return nil, fmt.Errorf("ProxyUseFdpass: %w", err)
	}
	ours := fc.(*net.UnixConn)
	defer ours.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		theirs.Close()
		return nil, err
	}
	cmd := exec.Command(shell, "-c", "exec "+command)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = theirs, theirs, errW
	err = cmd.Start()
	// The child holds its ends now; ours would keep the socketpair from ending when it exits.
	theirs.Close()
	errW.Close()
	if err != nil {
		errR.Close()
		return nil, fail(true, err, nil, errors.New("the command did not start"))
	}
	log.V(1).Info("ProxyCommand started (ProxyUseFdpass)", "target", hop.String(), "command", command, "pid", cmd.Process.Pid)
	tail := &stderrTail{}
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		tail.follow(errR, log, hop.String())
	}()
	exited := make(chan struct{})
	var waitErr error // set before exited closes
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	// reap returns once the command has exited, killing it if needed, and its stderr has been read, or has
	// had a moment: a child of the command may hold it open.
	reap := func(kill bool) {
		if kill {
			_ = cmd.Process.Kill()
		}
		<-exited
		select {
		case <-stderrDone:
		case <-time.After(100 * time.Millisecond):
		}
		errR.Close() // os.Pipe's end is pollable: closing it ends the read
		<-stderrDone
	}

	stop := context.AfterFunc(ctx, func() { ours.SetReadDeadline(time.Now()) })
	defer stop()
	fd, err := receiveFD(ours)
	if err != nil {
		if ctx.Err() != nil {
			reap(true)
			return nil, fail(false, nil, tail, fmt.Errorf("ProxyUseFdpass yes: the command passed back no connection: %w", ctx.Err()))
		}
		// A command that ended its stdout has exited, or is about to; one that wrote something else is killed.
		// Either way it has ended, as a command that exits at once: a mistake in it, which a retry repeats.
		kill := !errors.Is(err, errStdoutEnded)
		if !kill {
			select {
			case <-exited:
			case <-ctx.Done():
				kill = true
			}
		}
		reap(kill)
		return nil, fail(true, waitErr, tail, fmt.Errorf("ProxyUseFdpass yes: the command passed back no connection: %w", err))
	}
	f := os.NewFile(uintptr(fd), "fdpass-connection")
	select {
	case <-exited:
		reap(false)
	case <-ctx.Done():
		f.Close()
		reap(true)
		return nil, fail(true, waitErr, tail, fmt.Errorf("ProxyUseFdpass yes: the command passed back a connection but did not exit, as ssh waits for it to: %w", ctx.Err()))
	}
	if waitErr != nil {
		log.V(1).Info("ProxyCommand (ProxyUseFdpass) passed back a connection, then ended with an error; going on, as ssh does",
			"target", hop.String(), "status", waitErr.Error())
	}
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fail(true, waitErr, tail, fmt.Errorf("ProxyUseFdpass yes: the descriptor the command passed back is not a connected socket: %w", err))
	}
	log.V(1).Info("ProxyCommand passed back a connection (ProxyUseFdpass)", "target", hop.String(),
		"local", conn.LocalAddr().String(), "remote", conn.RemoteAddr().String())
	return conn, nil
}

var errStdoutEnded = errors.New("its stdout ended without a descriptor (sent with SCM_RIGHTS)")

// receiveFD reads one message from c, as OpenSSH's mm_receive_fd: one byte of data carrying exactly one
// descriptor with SCM_RIGHTS. The descriptor is close-on-exec. Any other descriptors are closed.
func receiveFD(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var (
		buf   [1]byte
		oob   = make([]byte, unix.CmsgSpace(fdpassMaxFDs*4))
		n     int
		oobn  int
		flags int
		rerr  error
		fds   []int
	)
	err = rc.Read(func(s uintptr) bool {
		// Under ForkLock until the descriptors are close-on-exec (MSG_CMSG_CLOEXEC is Linux's alone).
		syscall.ForkLock.RLock()
		defer syscall.ForkLock.RUnlock()
		n, oobn, flags, _, rerr = unix.Recvmsg(int(s), buf[:], oob, 0)
		if rerr == unix.EAGAIN || rerr == unix.EINTR {
			return false
		}
		if rerr == nil {
			fds, rerr = parseRights(oob[:oobn])
			for _, fd := range fds {
				unix.CloseOnExec(fd)
			}
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	switch {
	case err != nil:
		closeAll()
		return -1, err
	case n == 0 && len(fds) == 0:
		return -1, errStdoutEnded
	case flags&unix.MSG_CTRUNC != 0:
		closeAll() // the kernel closed those that did not fit
		return -1, fmt.Errorf("it passed more than %d descriptors; it must pass one, the connected socket", fdpassMaxFDs)
	case len(fds) > 1:
		closeAll()
		return -1, fmt.Errorf("it passed %d descriptors; it must pass one, the connected socket", len(fds))
	case len(fds) == 0:
		return -1, fmt.Errorf("it wrote to its stdout %q, not a descriptor sent with SCM_RIGHTS (ProxyUseFdpass yes is for a command that passes one)", buf[:n])
	}
	return fds[0], nil
}

// parseRights is the descriptors in a message's control data.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, r...)
	}
	return fds, nil
}

// stderrTail keeps a ProxyCommand's last stderr lines, which errors quote, and logs each line.
type stderrTail struct {
	mu   sync.Mutex
	tail []string
}

func (s *stderrTail) add(line string) {
	s.mu.Lock()
	s.tail = append(s.tail, line)
	if len(s.tail) > stderrTailLines {
		s.tail = s.tail[1:]
	}
	s.mu.Unlock()
}

func (s *stderrTail) lines() []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tail...)
}

// follow logs each line of r, a ProxyCommand's stderr, as ssh passes them to its own, and keeps the last ones.
func (s *stderrTail) follow(r io.Reader, log logr.Logger, target string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		log.Info("ProxyCommand stderr", "target", target, "line", line)
		s.add(line)
	}
}
