// Package sshdial keeps one SSH connection to a host (or several, when asked; optionally through jump hosts)
// and dials TCP connections through it, the way `ssh -D` does, with OpenSSH's trust model: host keys are verified against
// known_hosts, unknown hosts are refused unless the user accepts new ones, and a changed key is always refused.
//
// It authenticates with ssh-agent and identity files, reads ~/.ssh/config (Host, HostName, User, Port,
// IdentityFile, IdentitiesOnly, IdentityAgent, ProxyJump, ProxyCommand, ProxyUseFdpass, StrictHostKeyChecking,
// ServerAliveInterval, ServerAliveCountMax, UserKnownHostsFile, GlobalKnownHostsFile, HostKeyAlias,
// HashKnownHosts), sends keepalives, and reconnects when
// the connection drops: in the background with backoff, and at once when a dial needs the connection. Dials
// made meanwhile wait, bounded by the connect timeout. A dial whose answer is late checks, with a keepalive,
// that the server is still there, and moves to a fresh connection when it is not.
//
// Its errors say which hop failed: a dial refused by the destination (as the SSH server reports it) is a
// *TargetError, a dial that found no SSH connection is a *ServerError, and both say so in their text.
//
// It is not an SSH client for sessions, commands or remote forwards, and it knows nothing about the
// protocols spoken over the dialled connections. Typical use:
//
//	d, err := sshdial.New(cfg)
//	go d.Run(ctx)                      // connects, keeps and re-establishes the session
//	conn, err := d.DialContext(ctx, "tcp", "10.0.0.1:6443")
package sshdial

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
)

// ErrStopped is returned by DialContext after Run has returned.
var ErrStopped = errors.New("ssh dialer stopped")

// dialProbeAfter is how long a dial waits for the server's answer before it checks, with a keepalive, that
// the server is still there. Channel opens on a live connection take a round trip and the destination's
// connect; a second is long for both, and one keepalive per slow dial costs nothing.
const dialProbeAfter = time.Second

// demandGap spaces connection attempts while dials wait for a connection: close enough that the server is
// used within a fraction of a second of its return, far enough that a burst of requests cannot hammer it.
const demandGap = 250 * time.Millisecond

// Dialer dials TCP connections through the SSH connections that Run maintains: one by default, or
// Config.Connections of them to the same destination, each new dial going to the live connection that
// carries the fewest open dials. It is safe for concurrent use.
type Dialer struct {
	plan  *plan
	log   logr.Logger
	keys  *keyring
	known *knownHosts

	mu      sync.Mutex
	slots   []*slot       // plan.connections of them
	live    int           // slots with a session
	up      chan struct{} // closed while at least one slot has a session; replaced when none has
	wake    chan struct{} // closed (and replaced) when a dial starts waiting: slots in backoff retry at once
	waiting int           // dials waiting for a session
	lastErr error         // why the last attempt or session failed
	wasUp   bool          // a connection has been up once: refusals are no longer start-up mistakes
	stopped bool
	running bool
	next    int // where the search for the least loaded session starts, so that ties rotate

	procs sync.WaitGroup // ProxyCommands not reaped yet; Run waits for them before it returns
}

// slot is one of the SSH connections Run keeps, reconnected on its own.
type slot struct {
	n    int      // 1-based, for logs
	sess *session // nil while disconnected
}

// session is one established SSH connection, with the jump-host connections under it.
type session struct {
	client *ssh.Client
	chain  []*ssh.Client // jump hosts, first hop first
	heard  *activity     // when bytes last came from the server
	once   sync.Once
	open   atomic.Int64 // dialled connections not yet closed

	pingMu  sync.Mutex
	pinging bool // a keepalive is in flight
}

func (s *session) close() {
	s.once.Do(func() {
		s.client.Close()
		for i := len(s.chain) - 1; i >= 0; i-- {
			s.chain[i].Close()
		}
	})
}

// ping sends a keepalive@openssh.com request unless one is in flight. The answer shows up in s.heard, as
// does any other byte from the server. The library sends one global request at a time anyway; sharing it
// keeps a burst of slow dials to one.
func (s *session) ping() {
	s.pingMu.Lock()
	defer s.pingMu.Unlock()
	if s.pinging {
		return
	}
	s.pinging = true
	go func() {
		// Any answer, even a refusal, proves the server is alive; the call returns when the connection
		// closes otherwise.
		_, _, _ = s.client.SendRequest("keepalive@openssh.com", true, nil)
		s.pingMu.Lock()
		s.pinging = false
		s.pingMu.Unlock()
	}()
}

// activity records when bytes last arrived on a connection.
type activity struct{ last atomic.Int64 } // UnixNano

func (a *activity) mark() { a.last.Store(time.Now().UnixNano()) }

// since reports whether bytes arrived after t.
func (a *activity) since(t time.Time) bool { return a.last.Load() > t.UnixNano() }

// New checks cfg, reads the SSH config file and prepares authentication. It does not connect; Run does. It
// fails when there is no identity at all to authenticate with, which no connection attempt could fix.
func New(cfg Config) (*Dialer, error) { return NewContext(context.Background(), cfg) }

// NewContext is New, stopping when ctx ends: the config file's Match exec commands, which run while it is
// read, are killed, and NewContext returns ctx's error.
func NewContext(ctx context.Context, cfg Config) (*Dialer, error) {
	p, err := resolveContext(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d := &Dialer{
		plan:  p,
		log:   cfg.Log,
		keys:  newKeyring(cfg.Passphrase, p.allowOpenKeys, cfg.Log),
		known: &knownHosts{files: p.knownHosts, global: p.globalKnown, acceptNew: p.acceptNew, log: cfg.Log},
		up:    make(chan struct{}),
		wake:  make(chan struct{}),
	}
	for i := range p.connections {
		d.slots = append(d.slots, &slot{n: i + 1})
	}
	if err := d.checkIdentities(); err != nil {
		return nil, err
	}
	return d, nil
}

// Target describes the destination, "user@host:port", with the jump hosts before it.
func (d *Dialer) Target() string {
	var parts []string
	for _, h := range d.plan.hops {
		parts = append(parts, h.String())
	}
	return strings.Join(parts, " -> ")
}

// server is the SSH server that opens the dialled connections, the last hop.
func (d *Dialer) server() endpoint { return d.plan.hops[len(d.plan.hops)-1] }

// Ready reports nil while an SSH connection is up (with several, while at least one is), and otherwise why
// none is.
func (d *Dialer) Ready() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.live > 0:
		return nil
	case d.stopped:
		return ErrStopped
	case d.lastErr != nil:
		return fmt.Errorf("ssh connection to %s is down: %w", d.server(), d.lastErr)
	default:
		return fmt.Errorf("ssh connection to %s not established yet", d.server())
	}
}

// Connections reports how many SSH connections are up, and how many the Dialer keeps.
func (d *Dialer) Connections() (up, total int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live, len(d.slots)
}

// Run connects and keeps the SSH connections up until ctx ends, each reconnecting on its own: at once when
// a dial waits for it, and otherwise with exponential backoff (MinBackoff up to MaxBackoff) after failures.
// The first connection is made alone, so that a host key is accepted or a passphrase asked once; the others
// follow once it is up. Run returns nil when ctx ends, and an error for failures that retrying cannot fix, on
// any connection: an untrusted host key, failed authentication, an unusable key file, and, unless
// RetryFirst is set, a refusal before any connection was up. Run may be called once. Its errors are meant
// to be printed once, by the caller: Run does not log them.
func (d *Dialer) Run(ctx context.Context) error {
	d.mu.Lock()
	if d.running || d.stopped {
		d.mu.Unlock()
		return errors.New("sshdial: Run called twice")
	}
	d.running = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.stopped = true
		for _, sl := range d.slots {
			if sl.sess != nil {
				sl.sess.close()
				sl.sess = nil
			}
		}
		d.live = 0
		// Wake waiting dials so they see ErrStopped.
		select {
		case <-d.up:
		default:
			close(d.up)
		}
		d.mu.Unlock()
		d.procs.Wait()
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := make(chan struct{})
	errs := make(chan error, len(d.slots))
	for i, sl := range d.slots {
		go func() {
			if i > 0 {
				select {
				case <-first:
				case <-ctx.Done():
					errs <- nil
					return
				}
			}
			err := d.keep(ctx, sl, first)
			if err != nil {
				cancel() // a permanent failure stops every connection
			}
			errs <- err
		}()
	}
	var err error
	for range d.slots {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// keep connects one slot and keeps it connected until ctx ends or a permanent failure. It closes first
// (once) when its first connection is up.
func (d *Dialer) keep(ctx context.Context, sl *slot, first chan struct{}) error {
	backoff := d.plan.minBackoff
	logArgs := func(kv ...any) []any {
		kv = append([]any{"target", d.Target()}, kv...)
		if len(d.slots) > 1 {
			kv = append(kv, "connection", sl.n)
		}
		return kv
	}
	for attempt := 1; ; attempt++ {
		demanded := d.demand()
		s, err := d.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d.setErr(err)
			if permanent(err) || d.unaskable(err) {
				return err
			}
			if err := d.startMistake(err); err != nil {
				return err
			}
			// Attempts made for waiting dials come every demandGap while the server is away; the first of
			// them and every background one are worth a line at the default level.
			if demanded && attempt > 1 {
				d.log.V(1).Info("SSH connection failed; a proxied connection is waiting, retrying", logArgs("attempt", attempt, "err", err)...)
			} else {
				d.log.Info("SSH connection failed; retrying", logArgs("attempt", attempt, "err", err)...)
			}
			if !d.pause(ctx, backoff) {
				return nil
			}
			backoff = min(backoff*2, d.plan.maxBackoff)
			continue
		}
		attempt, backoff = 0, d.plan.minBackoff
		d.setSession(sl, s)
		if sl.n == 1 {
			select {
			case <-first:
			default:
				close(first)
			}
		}
		d.log.Info("SSH connection established", logArgs("server", string(s.client.ServerVersion()))...)

		lost := make(chan error, 1)
		go func() { lost <- s.client.Wait() }()
		kaDone := make(chan struct{})
		kaCtx, kaCancel := context.WithCancel(ctx)
		go func() { defer close(kaDone); d.keepalive(kaCtx, s) }()

		var why error
		select {
		case <-ctx.Done():
		case why = <-lost:
		}
		kaCancel()
		s.close()
		<-kaDone
		if ctx.Err() != nil {
			return nil
		}
		if why == nil {
			why = errors.New("connection closed")
		}
		d.clearSession(sl, s, fmt.Errorf("connection lost: %w", why))
		d.log.Info("SSH connection lost; reconnecting, new proxied connections wait up to the connect timeout",
			logArgs("err", why, "connectTimeout", d.plan.connectTimeout)...)
	}
}

// pause waits before the next connection attempt: a jittered backoff while no dial waits, and at most
// demandGap after the failed attempt once one does (a dial that starts waiting cuts the backoff short). It
// reports false when ctx ended.
func (d *Dialer) pause(ctx context.Context, backoff time.Duration) bool {
	failed := time.Now()
	background := failed.Add(backoff/2 + rand.N(backoff/2+1))
	for {
		d.mu.Lock()
		wake, demanded := d.wake, d.waiting > 0
		d.mu.Unlock()
		until := background
		if next := failed.Add(demandGap); demanded && next.Before(until) {
			until = next
		}
		t := time.NewTimer(time.Until(until))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
			return true
		case <-wake:
			t.Stop()
		}
	}
}

// demand reports whether a dial is waiting for a connection.
func (d *Dialer) demand() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiting > 0
}

// startMistake turns a refusal into a permanent error until a connection has been up once, unless
// RetryFirst: "connection refused", a host name that does not resolve, a peer that is no SSH server (it
// closes before the SSH version line or speaks another protocol) or a ProxyCommand that exits at start-up
// means a wrong host, port or command far more often than a server that is briefly away.
func (d *Dialer) startMistake(err error) error {
	d.mu.Lock()
	wasUp := d.wasUp
	d.mu.Unlock()
	if wasUp || d.plan.retryFirst {
		return nil
	}
	var dnsErr *net.DNSError
	var notSSH *NotSSHError
	var pce *ProxyCommandError
	var fam *familyError
	if errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dnsErr) && dnsErr.IsNotFound || errors.As(err, &notSSH) ||
		errors.As(err, &pce) && pce.Exited || errors.As(err, &fam) {
		return &StartError{Target: d.Target(), Err: err}
	}
	return nil
}

// familyError: the first hop has no address in the family that -4, -6 or AddressFamily allows, as
// OpenSSH's "Address family for hostname not supported". Like a name that does not resolve, it is a start
// mistake.
type familyError struct {
	network string // "tcp4" or "tcp6"
	err     error
}

func (e *familyError) Error() string {
	family := map[string]string{"tcp4": "IPv4", "tcp6": "IPv6"}[e.network]
	return fmt.Sprintf("%v (%s only, as -4, -6 or AddressFamily asks)", e.err, family)
}

func (e *familyError) Unwrap() error { return e.err }

// StartError is a refusal before the first connection was ever up: it suggests a mistake (a wrong host or
// port, sshd not running) rather than a server that is briefly away. Config.RetryFirst retries it instead.
type StartError struct {
	Target string
	Err    error
}

func (e *StartError) Error() string { return e.Named(fieldName) }

// Named is Error with the Config field that retries (RetryFirst) spelled as name returns it.
func (e *StartError) Named(name func(field string) string) string {
	check := "the host and port"
	var pce *ProxyCommandError
	if errors.As(e.Err, &pce) {
		check = "the ProxyCommand"
	}
	return fmt.Sprintf("cannot connect to %s: %v; check %s, or pass %s to keep trying until the server answers",
		e.Target, e.Err, check, name("RetryFirst"))
}

func (e *StartError) Unwrap() error { return e.Err }

func (d *Dialer) setErr(err error) {
	d.mu.Lock()
	d.lastErr = err
	d.mu.Unlock()
}

func (d *Dialer) setSession(sl *slot, s *session) {
	d.mu.Lock()
	sl.sess = s
	d.live++
	d.lastErr = nil
	d.wasUp = true
	if d.live == 1 {
		close(d.up)
	}
	d.mu.Unlock()
}

func (d *Dialer) clearSession(sl *slot, s *session, why error) {
	d.mu.Lock()
	if sl.sess == s {
		sl.sess = nil
		d.live--
		d.lastErr = why
		if d.live == 0 {
			d.up = make(chan struct{})
		}
	}
	d.mu.Unlock()
}

// pick returns the live session carrying the fewest open dials (ties rotate), or the channel that is
// closed when there is one.
func (d *Dialer) pick() (*slot, *session, <-chan struct{}, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best *slot
	var bestOpen int64
	for i := range d.slots {
		sl := d.slots[(d.next+i)%len(d.slots)]
		if sl.sess == nil {
			continue
		}
		if n := sl.sess.open.Load(); best == nil || n < bestOpen {
			best, bestOpen = sl, n
		}
	}
	if best == nil {
		return nil, nil, d.up, d.stopped
	}
	d.next = (d.next + 1) % len(d.slots)
	// Counted before the dial, so that concurrent dials spread; DialContext takes it back on failure.
	best.sess.open.Add(1)
	return best, best.sess, d.up, d.stopped
}

// startWaiting registers a dial that waits for a connection and wakes the slots that sit out a backoff, so
// that they try at once. stopWaiting undoes it.
func (d *Dialer) startWaiting() {
	d.mu.Lock()
	d.waiting++
	close(d.wake)
	d.wake = make(chan struct{})
	d.mu.Unlock()
}

func (d *Dialer) stopWaiting() {
	d.mu.Lock()
	d.waiting--
	d.mu.Unlock()
}

// permanent reports whether retrying err is pointless.
func permanent(err error) bool {
	var hk *HostKeyError
	var ae *AuthError
	var ek *EncryptedKeyError
	var uk *UnprotectedKeyError
	return errors.As(err, &hk) || errors.As(err, &ae) || errors.As(err, &ek) || errors.As(err, &uk)
}

// keepalive drops the session when the server has sent nothing (keepalives unanswered) for
// ServerAliveCountMax intervals in a row, as OpenSSH's ServerAliveInterval does, so that a dead path or a
// frozen server is noticed and re-established: within ServerAliveInterval × (ServerAliveCountMax+1).
func (d *Dialer) keepalive(ctx context.Context, s *session) {
	if d.plan.aliveInterval <= 0 {
		return
	}
	t := time.NewTicker(d.plan.aliveInterval)
	defer t.Stop()
	var sent time.Time // when the previous tick asked for an answer
	missed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !sent.IsZero() {
				if s.heard.since(sent) {
					missed = 0
				} else {
					missed++
				}
			}
			if missed >= d.plan.aliveCountMax {
				d.log.Info("SSH server stopped answering keepalives; dropping the connection", "target", d.Target(),
					"unanswered", missed, "interval", d.plan.aliveInterval)
				s.close()
				return
			}
			s.ping()
			sent = now
		}
	}
}

// connect establishes the chain of SSH connections, each hop through the previous one.
func (d *Dialer) connect(ctx context.Context) (*session, error) {
	var chain []*ssh.Client
	fail := func(err error) (*session, error) {
		for i := len(chain) - 1; i >= 0; i-- {
			chain[i].Close()
		}
		return nil, err
	}
	var heard *activity
	for i, hop := range d.plan.hops {
		hctx, cancel := context.WithTimeout(ctx, d.plan.connectTimeout)
		var conn net.Conn
		var err error
		var pc *commandConn
		if i == 0 && hop.proxyCommand != "" && hop.proxyUseFdpass {
			conn, err = fdpassConnect(hctx, hop.proxyCommand, hop, d.log)
			if err != nil && len(d.plan.hops) > 1 {
				err = fmt.Errorf("jump host %s: %w", hop, err)
			}
		} else if i == 0 && hop.proxyCommand != "" {
			pc, err = startProxyCommand(hop.proxyCommand, hop, d.log, &d.procs)
			if pc != nil {
				conn = pc
			}
		} else if i == 0 {
			nd := net.Dialer{KeepAlive: 30 * time.Second}
			conn, err = nd.DialContext(hctx, d.plan.network, hop.addr())
			var noAddr *net.AddrError
			if errors.As(err, &noAddr) && d.plan.network != "tcp" {
				err = &familyError{network: d.plan.network, err: err}
			}
			if err != nil && len(d.plan.hops) > 1 {
				err = fmt.Errorf("jump host %s: %w", hop, err)
			}
		} else {
			conn, err = chain[i-1].DialContext(hctx, "tcp", hop.addr())
			if err != nil {
				err = fmt.Errorf("jump host: %w", channelError(err, hop.addr(), d.plan.hops[i-1].String()))
			}
		}
		cancel()
		if err != nil {
			return fail(err)
		}
		heard = &activity{}
		c, err := d.handshake(ctx, conn, hop, heard)
		if err != nil {
			conn.Close()
			if pc != nil && !permanent(err) {
				err = pc.failure(hop.String(), err)
			}
			if pc != nil && len(d.plan.hops) > 1 {
				err = fmt.Errorf("jump host %s: %w", hop, err)
			}
			return fail(err)
		}
		chain = append(chain, c)
	}
	return &session{client: chain[len(chain)-1], chain: chain[:len(chain)-1], heard: heard}, nil
}

// handshake runs the SSH handshake for one hop over conn, aborting when ctx ends. heard records the bytes
// that arrive on conn for the session's life.
func (d *Dialer) handshake(ctx context.Context, conn net.Conn, hop endpoint, heard *activity) (*ssh.Client, error) {
	algos, err := d.known.algorithms(hop.knownHostsAddr())
	if err != nil {
		return nil, err
	}
	cc := &ssh.ClientConfig{
		User:              hop.user,
		HostKeyCallback:   d.known.callback(hop.knownHostsAddr(), hop.hashKnownHosts, hop.acceptNew),
		HostKeyAlgorithms: algos,
		ClientVersion:     "SSH-2.0-konnect",
	}
	cc.Ciphers = d.plan.ciphers

	// The handshake is bounded by the connect timeout, except while a person types a passphrase.
	var timedOut atomic.Bool
	timer := time.AfterFunc(d.plan.connectTimeout, func() { timedOut.Store(true); conn.Close() })
	defer timer.Stop()
	pause := func() (resume func()) {
		if !timer.Stop() {
			return func() {}
		}
		return func() { timer.Reset(d.plan.connectTimeout) }
	}
	closeAgent, auth := d.authMethods(ctx, cc, hop, pause)
	defer closeAgent()

	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	watch := &versionWatch{Conn: newReadBuffered(conn, heard)}
	c, chans, reqs, err := ssh.NewClientConn(watch, hop.addr(), cc)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("ssh handshake with %s: %w", hop, ctx.Err())
		}
		if timedOut.Load() {
			return nil, fmt.Errorf("ssh handshake with %s: no answer within %s: %w", hop, d.plan.connectTimeout, os.ErrDeadlineExceeded)
		}
		// The library says "ssh: handshake failed: " before every reason; the errors below say more.
		cause := err
		if inner := errors.Unwrap(err); inner != nil && strings.HasPrefix(err.Error(), "ssh: handshake failed: ") {
			cause = inner
		}
		var hk *HostKeyError
		var ek *EncryptedKeyError
		var uk *UnprotectedKeyError
		var ie *InteractiveAuthError
		switch {
		case errors.As(cause, &ie):
			return nil, ie
		case errors.As(cause, &hk):
			return nil, hk
		case errors.As(cause, &ek):
			return nil, ek
		case errors.As(cause, &uk):
			return nil, uk
		case strings.Contains(cause.Error(), "unable to authenticate"), tooManyAuthFailures(cause):
			return nil, auth.authError(cause)
		}
		if notSSH := watch.notSSH(hop.String(), cause); notSSH != nil {
			return nil, notSSH
		}
		return nil, fmt.Errorf("ssh handshake with %s: %w", hop, cause)
	}
	return ssh.NewClient(c, chans, reqs), nil
}

// tooManyAuthFailures reports sshd's disconnect after MaxAuthTries refused identities (SSH_MSG_DISCONNECT
// reason 2): a refused login like any other, which retrying would only repeat.
func tooManyAuthFailures(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "disconnect, reason 2: ") && strings.Contains(msg, "Too many authentication failures")
}

// ServerError is a dial that failed because no SSH connection was up, or came up within the connect timeout:
// the SSH server (or the way to it) failed, not the destination. Hop names the server.
type ServerError struct {
	Server string // user@host:port
	Err    error  // why the SSH connection is down
	// Waited is how long the dial waited for a connection; Cause, when set, why it stopped waiting sooner.
	Waited time.Duration
	Cause  error
}

func (e *ServerError) Error() string {
	msg := fmt.Sprintf("SSH server %s is unreachable: %v (waited %s", e.Server, e.Err, e.Waited.Round(time.Millisecond))
	if e.Cause != nil {
		msg += ", then " + e.Cause.Error()
	}
	return msg + ")"
}

func (e *ServerError) Unwrap() error { return e.Err }

// Hop names the hop that failed, for proxies that tell their clients which side failed.
func (e *ServerError) Hop() string { return "SSH server " + e.Server }

// TargetError is a dial that the SSH server tried and reported as failed: the destination refused it, cannot
// be reached from the server, or the server's policy forbids it. It wraps the matching errno (ECONNREFUSED,
// EHOSTUNREACH, ENETUNREACH, ETIMEDOUT, EACCES for a refusal by policy), so that callers can map it without
// knowing SSH.
type TargetError struct {
	Addr    string // the destination, host:port
	Server  string // the SSH server that reported the failure, user@host:port
	Reason  ssh.RejectionReason
	Message string // the server's words, e.g. "Connection refused"
	errno   syscall.Errno
	err     error
}

func (e *TargetError) Error() string {
	msg := fmt.Sprintf("SSH server %s could not open %s: %s", e.Server, e.Addr, e.Reason)
	if e.Message != "" {
		msg += " (" + e.Message + ")"
	}
	return msg
}

func (e *TargetError) Unwrap() []error { return []error{e.err, e.errno} }

// ReportedBy names who reported the destination's failure.
func (e *TargetError) ReportedBy() string { return "SSH server " + e.Server }

// DialContext opens a TCP connection from the SSH server to addr ("host:port"; a host name is resolved by
// the server, like ssh -D). network must be tcp, tcp4 or tcp6. While the SSH connection is down it waits for
// it to come back, at most the connect timeout or until ctx ends, and has Run try at once. A refusal by the
// far side is a *TargetError; no SSH connection is a *ServerError.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("ssh dial %s %s: network not supported", network, addr)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("ssh dial %s: %w", addr, err)
	}
	// Checked here as x/crypto/ssh checks it: its error would otherwise look like a dead session, and
	// close a healthy one.
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, fmt.Errorf("ssh dial %s: port %q: want a number 0-65535", addr, port)
	}
	// The wait for a connection is bounded by the connect timeout from when it begins: a dial whose
	// connection died under it (or froze) still gets the full wait for the next one.
	var wait *time.Timer
	var began time.Time
	defer func() {
		if wait != nil {
			wait.Stop()
			d.stopWaiting()
		}
	}()
	for {
		sl, s, up, stopped := d.pick()
		if stopped {
			return nil, ErrStopped
		}
		if s == nil {
			if wait == nil {
				wait, began = time.NewTimer(d.plan.connectTimeout), time.Now()
				d.startWaiting()
			}
			select {
			case <-up:
				continue
			case <-ctx.Done():
				return nil, &ServerError{Server: d.server().String(), Err: d.downReason(), Waited: time.Since(began), Cause: ctx.Err()}
			case <-wait.C:
				return nil, &ServerError{Server: d.server().String(), Err: d.downReason(), Waited: time.Since(began)}
			}
		}
		conn, err := d.open(ctx, s, addr)
		if err == nil {
			return &countedConn{Conn: conn, s: s}, nil
		}
		s.open.Add(-1)
		var oe *ssh.OpenChannelError
		if errors.As(err, &oe) {
			return nil, channelError(err, addr, d.server().String())
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("SSH server %s did not open %s in time: %w", d.server(), addr, ctx.Err())
		}
		// The session died under us: drop it and try another, or wait for Run to bring one up.
		d.log.V(1).Info("SSH dial failed on a dying connection; trying again", "addr", addr, "err", err)
		s.close()
		d.clearSession(sl, s, fmt.Errorf("connection lost: %w", err))
	}
}

// downReason is why no connection is up, for errors.
func (d *Dialer) downReason() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lastErr != nil {
		return d.lastErr
	}
	return errors.New("still connecting")
}

// open opens a direct-tcpip channel to addr on s. When the server has not answered within dialProbeAfter, a
// keepalive checks that it is still there; if neither its answer nor any other byte arrives within the
// keepalive interval, the server is frozen (or the path to it dead): the session is closed, which fails this
// open so that DialContext moves it to a fresh connection.
func (d *Dialer) open(ctx context.Context, s *session, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := s.client.DialContext(ctx, "tcp", addr)
		res <- result{c, err}
	}()
	probe := time.NewTimer(dialProbeAfter)
	defer probe.Stop()
	var verdict <-chan time.Time
	var asked time.Time
	for {
		select {
		case r := <-res:
			return r.c, r.err
		case asked = <-probe.C:
			s.ping()
			verdict = time.After(d.plan.probeTimeout())
		case <-verdict:
			verdict = nil
			if s.heard.since(asked) {
				// Alive: the destination is slow. Check again later.
				probe.Reset(dialProbeAfter)
				continue
			}
			d.log.Info("SSH server did not answer a keepalive while a proxied connection waited; dropping the connection and reconnecting",
				"target", d.Target(), "dest", addr, "waited", d.plan.probeTimeout()+dialProbeAfter)
			s.close()
			r := <-res
			if r.c != nil {
				r.c.Close()
			}
			return nil, fmt.Errorf("SSH server stopped answering: %w", net.ErrClosed)
		}
	}
}

// countedConn is a dialled connection that its session counts until it is closed, for pick.
type countedConn struct {
	net.Conn
	s    *session
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.s.open.Add(-1) })
	return c.Conn.Close()
}

// CloseWrite half-closes the connection (sends EOF on the SSH channel), like the connection underneath.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("ssh: connection cannot half-close")
}

// channelError turns an SSH server's refusal of a direct-tcpip channel to addr into a *TargetError with the
// matching errno; other errors are returned as they are. OpenSSH's sshd puts strerror() text in the message.
func channelError(err error, addr, server string) error {
	var oe *ssh.OpenChannelError
	if !errors.As(err, &oe) {
		return err
	}
	msg := strings.ToLower(oe.Message)
	var errno syscall.Errno
	switch {
	case oe.Reason == ssh.Prohibited:
		errno = syscall.EACCES
	case strings.Contains(msg, "refused"):
		errno = syscall.ECONNREFUSED
	case strings.Contains(msg, "network is unreachable"):
		errno = syscall.ENETUNREACH
	case strings.Contains(msg, "no route"), strings.Contains(msg, "host is unreachable"):
		errno = syscall.EHOSTUNREACH
	case strings.Contains(msg, "timed out"):
		errno = syscall.ETIMEDOUT
	default:
		// Name resolution failures and anything else: the destination cannot be reached.
		errno = syscall.EHOSTUNREACH
	}
	return &TargetError{Addr: addr, Server: server, Reason: oe.Reason, Message: oe.Message, errno: errno, err: oe}
}

// readBufSize is the read buffer under the SSH transport. The library reads through a 4 KiB bufio.Reader,
// which costs two or three read syscalls per 32 KiB packet; a large buffer below it brings bulk transfers
// to about one syscall per several packets.
const readBufSize = 256 << 10

// readBuffered is a net.Conn whose reads go through a large buffer.
type readBuffered struct {
	net.Conn
	br *bufio.Reader
}

func newReadBuffered(c net.Conn, heard *activity) net.Conn {
	return &readBuffered{Conn: c, br: bufio.NewReaderSize(&heardConn{Conn: quickAck(c), heard: heard}, readBufSize)}
}

func (r *readBuffered) Read(p []byte) (int, error) { return r.br.Read(p) }

// heardConn records when bytes arrive, for keepalives: any byte from the server shows it is alive. It sits
// under the large buffer, so it costs a clock read per socket read, not per packet.
type heardConn struct {
	net.Conn
	heard *activity
}

func (h *heardConn) Read(p []byte) (int, error) {
	n, err := h.Conn.Read(p)
	if n > 0 {
		h.heard.mark()
	}
	return n, err
}
