package sshdial

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
)

// proxyKillAfter is how long a ProxyCommand has to exit after its connection ends (its stdin closed and
// SIGHUP, as OpenSSH sends) before it is killed.
const proxyKillAfter = 2 * time.Second

// stderrTailLines is how many of a ProxyCommand's last stderr lines an error quotes.
const stderrTailLines = 5

// expandProxyCommand expands the tokens OpenSSH expands in ProxyCommand: %%, %h (HostName), %n (the name as
// given), %p and %r. Any other %x is an error, as with OpenSSH.
func expandProxyCommand(cmd string, e endpoint) (string, error) {
	var b strings.Builder
	for i := 0; i < len(cmd); i++ {
		if cmd[i] != '%' {
			b.WriteByte(cmd[i])
			continue
		}
		if i+1 == len(cmd) {
			return "", fmt.Errorf("ProxyCommand %q ends with a lone %%", cmd)
		}
		i++
		switch cmd[i] {
		case '%':
			b.WriteByte('%')
		case 'h':
			b.WriteString(e.hostName)
		case 'n':
			b.WriteString(e.alias)
		case 'p':
			b.WriteString(strconv.Itoa(e.port))
		case 'r':
			b.WriteString(e.user)
		default:
			return "", fmt.Errorf("ProxyCommand %q: unknown token %%%c (ProxyCommand takes %%%%, %%h, %%n, %%p and %%r)", cmd, cmd[i])
		}
	}
	return b.String(), nil
}

// commandConn is the transport of a hop reached through ProxyCommand: the command's stdin and stdout. Closing
// it ends the command: its stdin is closed, it gets SIGHUP, and SIGKILL proxyKillAfter later if it is still
// there. A goroutine reaps it, so no zombie is left; procs counts the commands not reaped yet.
type commandConn struct {
	command string
	addr    pipeAddr
	cmd     *exec.Cmd
	stdin   *os.File // our end: the command's stdin
	stdout  *os.File // our end: the command's stdout
	done    chan struct{}
	waitErr error // set before done closes
	tail    stderrTail

	closeOnce sync.Once
}

// startProxyCommand runs command with the user's shell, as OpenSSH does ("exec" so that no shell lingers),
// and returns its stdio as a connection to hop. Its stderr lines go to log, as ssh passes them to its own.
func startProxyCommand(command string, hop endpoint, log logr.Logger, procs *sync.WaitGroup) (*commandConn, error) {
	shell := os.Getenv("SHELL")
	if shell == "" {
		shell = "/bin/sh"
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd := exec.Command(shell, "-c", "exec "+command)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	err = cmd.Start()
	// The child holds its ends now; ours would keep its stdin open and its stdout from ever ending.
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, &ProxyCommandError{Command: command, Endpoint: hop.String(), Exited: true, Status: err, Err: errors.New("the command did not start")}
	}
	c := &commandConn{command: command, addr: pipeAddr(hop.addr()), cmd: cmd, stdin: inW, stdout: outR, done: make(chan struct{})}
	log.V(1).Info("ProxyCommand started", "target", hop.String(), "command", command, "pid", cmd.Process.Pid)
	procs.Add(1)
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		defer errR.Close()
		c.tail.follow(errR, log, hop.String())
	}()
	go func() {
		defer procs.Done()
		c.waitErr = cmd.Wait()
		// A child of the command may hold stderr open; its last lines are worth a moment, not more.
		select {
		case <-stderrDone:
		case <-time.After(100 * time.Millisecond):
		}
		close(c.done)
	}()
	return c, nil
}

func (c *commandConn) Read(p []byte) (int, error)  { return c.stdout.Read(p) }
func (c *commandConn) Write(p []byte) (int, error) { return c.stdin.Write(p) }

func (c *commandConn) Close() error {
	c.closeOnce.Do(func() {
		c.stdin.Close()
		c.stdout.Close()
		// Signalling a reaped process is a no-op: os.Process does not reuse its pid.
		_ = c.cmd.Process.Signal(syscall.SIGHUP)
		go func() {
			t := time.NewTimer(proxyKillAfter)
			defer t.Stop()
			select {
			case <-c.done:
			case <-t.C:
				_ = c.cmd.Process.Kill()
			}
		}()
	})
	return nil
}

func (c *commandConn) LocalAddr() net.Addr  { return pipeAddr("") }
func (c *commandConn) RemoteAddr() net.Addr { return c.addr }

// Deadlines are the pipes' own: os.Pipe's ends are pollable, as sockets are.
func (c *commandConn) SetReadDeadline(t time.Time) error  { return c.stdout.SetReadDeadline(t) }
func (c *commandConn) SetWriteDeadline(t time.Time) error { return c.stdin.SetWriteDeadline(t) }
func (c *commandConn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// failure explains a handshake that failed over the command: whether the command exited (with its status and
// last stderr lines) or not. It waits a moment for the command, which usually exits right after its output.
func (c *commandConn) failure(endpoint string, err error) error {
	pe := &ProxyCommandError{Command: c.command, Endpoint: endpoint, Err: err}
	select {
	case <-c.done:
		pe.Exited = true
		pe.Status = c.waitErr
	case <-time.After(500 * time.Millisecond):
	}
	pe.Stderr = c.tail.lines()
	return pe
}

// pipeAddr is a ProxyCommand's address: the host:port it stands for, as known_hosts lookups need.
type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

// ProxyCommandError is a connection through an ssh_config ProxyCommand that failed: the command could not
// start, exited, or what it connected to did not complete the SSH handshake.
type ProxyCommandError struct {
	Command  string // expanded
	Endpoint string // user@host:port the command was to reach
	Exited   bool
	Status   error    // the command's exit, when Exited; nil means status 0
	Stderr   []string // its last stderr lines
	Err      error
}

func (e *ProxyCommandError) Error() string {
	msg := fmt.Sprintf("ProxyCommand %q for %s: %v", e.Command, e.Endpoint, e.Err)
	var ns *NotSSHError
	if e.Exited && errors.As(e.Err, &ns) && ns.Sent == "" {
		// "Closed before the version line" says nothing more than that the command ended.
		msg = fmt.Sprintf("ProxyCommand %q for %s: no SSH server answered through it", e.Command, e.Endpoint)
	}
	if e.Exited {
		if e.Status == nil {
			msg += "; the command exited with status 0"
		} else {
			msg += "; the command ended: " + e.Status.Error()
		}
	}
	if len(e.Stderr) > 0 {
		msg += "; its stderr ended with: " + strings.Join(e.Stderr, " | ")
	}
	return msg
}

func (e *ProxyCommandError) Unwrap() error { return e.Err }
