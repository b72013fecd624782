package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
)

// Agent keeps a stream to every known server and dials backends for them. Create it with New, then Run.
type Agent struct {
	cfg   Config
	m     *metrics
	creds *credentials
	tiers []int // read buffer sizes

	started   atomic.Bool
	startedAt atomic.Int64 // Run's start, in Unix nanoseconds
	synced    atomic.Bool  // every known server was connected at once, at some moment since the start
	draining  atomic.Bool
	openConns atomic.Int64
	connsGone chan struct{} // signalled when a connection closes, for the drain wait
	wake      chan struct{} // signalled when a session ends, to reconnect without waiting for the tick

	mu        sync.Mutex
	sessions  map[string]*session   // by server ID
	endpoints map[string]*epState   // by dial address
	resolved  map[string][]endpoint // configured server → its endpoints, as last resolved
	resolveAt map[string]time.Time  // configured server → when to look its name up again; absent: now
	hdrCount  int                   // serverCount from the most recent new connection
	lb        backoff               // extra dials that look for more servers behind one address
	lbBusy    bool
	lbNext    int

	wg sync.WaitGroup
}

// endpoint is one address to dial. A configured host name that resolves to several addresses gives several
// endpoints, each verified against the host name.
type endpoint struct {
	addr       string // ip:port, or host:port when the name could not be resolved ahead
	serverName string // TLS server name
}

type epState struct {
	ep       endpoint
	sessions int
	// aliasOf is set when this address led to a server already connected through another one (a dual-stack
	// name, or a name and an IP of the same server). It counts as connected while that server is.
	aliasOf string
	busy    bool // a connect attempt is running
	retry   backoff
	lastErr error
	errAt   time.Time
}

// backoff follows upstream's agent: the delay starts at --sync-interval, grows by 1.5x with 10% jitter and
// stops at --sync-interval-cap.
type backoff struct {
	next  time.Time
	delay time.Duration
}

func (b *backoff) failed(cfg *Config) {
	if b.delay < cfg.SyncInterval {
		b.delay = cfg.SyncInterval
	}
	b.next = time.Now().Add(jitter(b.delay))
	b.delay = min(time.Duration(float64(b.delay)*1.5), cfg.SyncIntervalCap)
}

func (b *backoff) reset(cfg *Config) {
	b.delay = cfg.SyncInterval
	b.next = time.Now().Add(jitter(cfg.SyncInterval))
}

// spread schedules the next look for another server behind a load balancer at a random point between half
// and one and a half --sync-interval. Agents that retry on a shared beat through one round-robin balancer
// each land on the server they already have, round after round (three agents, three servers); a wide random
// delay reorders them every round.
func (b *backoff) spread(cfg *Config) {
	b.delay = cfg.SyncInterval
	b.next = time.Now().Add(cfg.SyncInterval/2 + time.Duration(rand.Int64N(int64(cfg.SyncInterval)+1)))
}

func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Float64()*0.1*float64(d))
}

// New checks cfg and loads the credentials once, so that a missing or unparsable file is an error now.
// It opens no connection; Run does.
func New(cfg Config) (*Agent, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	creds, err := newCredentials(&c)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a := &Agent{
		cfg: c, m: m, creds: creds, tiers: readTiers(c.ReadBuffer),
		connsGone: make(chan struct{}, 1),
		wake:      make(chan struct{}, 1),
		sessions:  make(map[string]*session),
		endpoints: make(map[string]*epState),
		resolved:  make(map[string][]endpoint),
		resolveAt: make(map[string]time.Time),
	}
	return a, nil
}

// StartGate is something Run waits for before it connects (Config.StartAfter).
type StartGate interface {
	// WaitForSync returns nil once the agent may connect, or an error once ctx ends.
	WaitForSync(ctx context.Context) error
	// Waiting says what it waits for, for the initial-sync check.
	Waiting() string
}

// Run connects to the servers and serves them until ctx ends; with Config.StartAfter, it waits for it
// first. Then it drains: it sends DRAIN to every
// server (which then sends it a dial only when no other agent serves the destination), serves such dials,
// waits for open connections to finish for at most Config.GracefulTimeout, closes what is left and returns
// nil.
func (a *Agent) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("agent: Run called twice")
	}
	if g := a.cfg.StartAfter; g != nil {
		// Rather than failing and waiting out the kubelet's back-off once the wait is over; a stop during
		// the wait is a clean one.
		if err := g.WaitForSync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	a.startedAt.Store(time.Now().UnixNano())
	// Sessions outlive ctx: they must stay up while draining.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	klog.InfoS("Agent starting", "agentID", a.cfg.AgentID, "servers", a.cfg.Servers, "identifiers", a.cfg.Identifiers)
	// Not a ticker: a retry due between two ticks would wait for the second, and agents retrying through one
	// round-robin balancer on a shared beat reach the same server every time (see backoff.spread).
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		timer.Reset(a.sync(ctx, runCtx))
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-a.wake:
		}
	}
	a.drain()
	stop()
	a.wg.Wait()
	klog.InfoS("Agent stopped", "agentID", a.cfg.AgentID)
	return nil
}

func (a *Agent) drain() {
	a.draining.Store(true)
	a.mu.Lock()
	for _, s := range a.sessions {
		s.drain()
	}
	a.mu.Unlock()
	open := a.openConns.Load()
	if open == 0 || a.cfg.GracefulTimeout <= 0 {
		return
	}
	klog.InfoS("Draining: waiting for open connections", "connections", open, "timeout", a.cfg.GracefulTimeout)
	end := time.Now().Add(a.cfg.GracefulTimeout)
	deadline := time.NewTimer(a.cfg.GracefulTimeout)
	defer deadline.Stop()
	quietFrom := time.NewTimer(a.cfg.GracefulTimeout - a.cfg.GracefulTimeout/4)
	defer quietFrom.Stop()
	var tick <-chan time.Time
	seen := map[*conn]quietSince{}
	quietFor := min(time.Second, a.cfg.GracefulTimeout/10) // a tenth: still well within the last quarter
	for a.openConns.Load() > 0 {
		select {
		case <-deadline.C:
			klog.InfoS("Graceful timeout reached; closing open connections", "connections", a.openConns.Load())
			return
		case <-a.connsGone:
		case <-quietFrom.C:
			t := time.NewTicker(quietTick)
			defer t.Stop()
			tick = t.C
		case <-tick:
			// In the last stretch, a connection still busy now and then (a request every 100 ms on one
			// kept-alive connection) never rests quietFor, and would be cut at the deadline, in the middle of
			// a request or not: take a rest from one tick to the next, so that it ends between two requests
			// instead (half a tick, as ticks may come a little early).
			rest := quietFor
			if time.Until(end) <= quietFor {
				rest = quietTick / 2
			}
			a.closeQuietConns(seen, rest)
		}
	}
}

// quietTick is how often the drain looks for quiet connections in the last quarter of the graceful timeout.
const quietTick = 50 * time.Millisecond

// quietSince is a connection's activity count when it was first seen at rest.
type quietSince struct {
	activity uint64
	at       time.Time
}

// closeQuietConns closes every connection that has been at rest for quietFor: no byte moved and none queued.
//
// A connection still open in the last quarter of the graceful timeout would be cut at the deadline, wherever
// it is. Most such connections are kept-alive ones that kube-apiserver reuses for request after request (an
// HTTP/2 connection to an aggregated API server or a webhook), and a cut in the middle of a request fails that
// request. Closed between requests instead, the client sees an idle connection end and sends its next request
// on a new one, through another agent. A backend still working on a request looks just as quiet, and which
// side spoke last does not tell (an HTTP/2 client acknowledges a response with WINDOW_UPDATE): so the rest
// must last quietFor, up to a second, which a request that would finish before the deadline rarely takes.
func (a *Agent) closeQuietConns(seen map[*conn]quietSince, quietFor time.Duration) {
	a.mu.Lock()
	sessions := slices.Collect(maps.Values(a.sessions))
	a.mu.Unlock()
	now := time.Now()
	for _, s := range sessions {
		s.mu.Lock()
		conns := slices.Collect(maps.Values(s.conns))
		s.mu.Unlock()
		for _, c := range conns {
			n := c.activity.Load()
			if last, ok := seen[c]; !ok || last.activity != n || !c.quiet() {
				seen[c] = quietSince{n, now}
				continue
			} else if now.Sub(last.at) < quietFor {
				continue
			}
			delete(seen, c)
			klog.V(2).InfoS("Draining: closing a quiet connection", "serverID", s.serverID, "connectionID", c.id)
			// finish sends CLOSE_RSP on the stream, which may be slow; Run waits for a.wg after the drain.
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				c.finish("")
			}()
		}
	}
}

func (a *Agent) connOpened() {
	a.openConns.Add(1)
	a.m.endpointConns.Inc()
}

func (a *Agent) connClosed() {
	a.openConns.Add(-1)
	a.m.endpointConns.Dec()
	select {
	case a.connsGone <- struct{}{}:
	default:
	}
}

// sync resolves the configured servers and starts a connect attempt for every endpoint without a session
// whose retry time has come; then, if the servers report more servers than the agent has reached, it dials
// one more time through an address that already works (the load-balancer case). Lookups end with stopCtx
// (Run's, cancelled by the signal); connections live on runCtx, which outlives the drain.
// It returns how long to wait before the next sync: until the earliest retry falls due, and no longer than
// the pause between connection checks.
func (a *Agent) sync(stopCtx, ctx context.Context) time.Duration {
	wait := min(a.cfg.SyncInterval, time.Second)
	a.resolve(stopCtx)
	if stopCtx.Err() != nil {
		return wait
	}
	now := time.Now()
	due := func(t time.Time) {
		if d := t.Sub(now); d > 0 && d < wait {
			wait = d
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.draining.Load() {
		return wait
	}
	all := true
	var working []*epState
	want := a.serverCount()
	for _, st := range a.sortedEndpoints() {
		if st.sessions > 0 {
			working = append(working, st)
			continue
		}
		// An address still being tried may be the server that is missing; one that failed (the IPv6 address
		// of a dual-stack name without an IPv6 route, a dead address of a load balancer) must not stop the
		// search through the addresses that work.
		if !a.coveredLocked(st) && (st.busy || st.lastErr == nil) {
			all = false
		}
		if st.busy {
			continue
		}
		if now.Before(st.retry.next) {
			due(st.retry.next)
			continue
		}
		// Another address of a connected server: while no server is missing, there is nothing to find
		// there, and dialling it again every round would cost a TLS handshake per agent and address.
		if a.coveredLocked(st) && len(a.sessions) >= want {
			continue
		}
		st.busy = true
		a.wg.Add(1)
		go a.connect(ctx, st, false)
	}
	if all && len(working) > 0 && !a.lbBusy && (len(a.sessions) < want || a.cfg.SyncForever) {
		if now.Before(a.lb.next) {
			due(a.lb.next)
		} else {
			st := working[a.lbNext%len(working)]
			a.lbNext++
			a.lbBusy = true
			a.wg.Add(1)
			go a.connect(ctx, st, true)
		}
	}
	a.m.knownServers.Set(float64(a.knownServersLocked()))
	return wait
}

func (a *Agent) sortedEndpoints() []*epState {
	out := make([]*epState, 0, len(a.endpoints))
	for _, st := range a.endpoints {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ep.addr < out[j].ep.addr })
	return out
}

// resolve refreshes the endpoint list. A name is looked up when Config.ResolveInterval has passed since
// its last lookup, or at once after resolveSoonLocked. A name that cannot be resolved keeps its last result;
// one never resolved is dialled by name, so that the dial error says what is wrong.
func (a *Agent) resolve(ctx context.Context) {
	next := make(map[string][]endpoint, len(a.cfg.Servers))
	for _, srv := range a.cfg.Servers {
		host, port, _ := net.SplitHostPort(srv)
		if _, err := netip.ParseAddr(host); err == nil {
			next[srv] = []endpoint{{addr: srv, serverName: host}}
			continue
		}
		now := time.Now()
		a.mu.Lock()
		prev := a.resolved[srv]
		at, scheduled := a.resolveAt[srv]
		due := !scheduled || !now.Before(at)
		if due {
			// Set before the lookup, so that a stream lost meanwhile asks for another one.
			a.resolveAt[srv] = now.Add(a.cfg.ResolveInterval)
		}
		a.mu.Unlock()
		if len(prev) == 0 {
			prev = []endpoint{{addr: srv, serverName: host}}
		}
		if !due {
			next[srv] = prev
			continue
		}
		// LookupNetIP, not LookupHost: it returns as soon as ctx ends, where the Go resolver's LookupHost
		// waits for the DNS server's answer or its own timeout.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ips, err := a.cfg.Resolver.LookupNetIP(rctx, "ip", host)
		cancel()
		addrs := make([]string, 0, len(ips))
		for _, ip := range ips {
			addrs = append(addrs, ip.Unmap().String())
		}
		if err != nil || len(addrs) == 0 {
			next[srv] = prev
			klog.V(2).InfoS("Cannot resolve server name; using the last result", "server", srv, "err", err)
			continue
		}
		sort.Strings(addrs)
		for _, ip := range addrs {
			next[srv] = append(next[srv], endpoint{addr: net.JoinHostPort(ip, port), serverName: host})
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.resolved = next
	keep := make(map[string]bool)
	for _, eps := range next {
		for _, ep := range eps {
			keep[ep.addr] = true
			if _, ok := a.endpoints[ep.addr]; !ok {
				a.endpoints[ep.addr] = &epState{ep: ep}
			}
		}
	}
	for addr, st := range a.endpoints {
		if !keep[addr] && st.sessions == 0 && !st.busy {
			delete(a.endpoints, addr)
			// Server addresses change with every rollout behind a name: a series per address ever seen
			// would grow without bound.
			a.m.connectFailures.DeleteLabelValues(addr)
		}
	}
}

// resolveSoonLocked makes the next sync look up again every name that gave addr: a stream to it that ended
// or failed to open is the first sign that the servers behind the name changed.
func (a *Agent) resolveSoonLocked(addr string) {
	for srv, eps := range a.resolved {
		for _, ep := range eps {
			if ep.addr == addr {
				delete(a.resolveAt, srv)
				break
			}
		}
	}
}

func (a *Agent) connect(ctx context.Context, st *epState, extra bool) {
	defer a.wg.Done()
	s, err := a.dialServer(ctx, st.ep)
	a.mu.Lock()
	if extra {
		a.lbBusy = false
	} else {
		st.busy = false
	}
	if err != nil {
		if extra {
			a.lb.failed(&a.cfg)
		} else {
			st.retry.failed(&a.cfg)
			st.lastErr, st.errAt = err, time.Now()
		}
		a.resolveSoonLocked(st.ep.addr)
		// Under the lock: once it is released, resolve may drop the address and delete its series, which an
		// increment after that would bring back for good.
		a.m.connectFailures.WithLabelValues(st.ep.addr).Inc()
		a.mu.Unlock()
		if ctx.Err() == nil {
			klog.ErrorS(err, "Cannot connect to server", "server", st.ep.addr, "serverName", st.ep.serverName)
		}
		return
	}
	if a.draining.Load() || ctx.Err() != nil {
		a.mu.Unlock()
		s.fail(errors.New("agent is stopping"))
		s.teardown()
		return
	}
	if _, dup := a.sessions[s.serverID]; dup {
		// Expected behind a load balancer, or when two addresses lead to one server: no backoff, just wait
		// for the next round.
		if extra {
			a.lb.spread(&a.cfg)
		} else {
			// Checked again now and then, in case the address comes to lead somewhere else.
			st.aliasOf, st.lastErr = s.serverID, nil
			st.retry.next = time.Now().Add(jitter(a.cfg.SyncIntervalCap))
		}
		a.mu.Unlock()
		klog.V(4).InfoS("Reached a server already connected; closing the duplicate", "serverID", s.serverID, "server", st.ep.addr)
		s.fail(errors.New("duplicate server"))
		s.teardown()
		return
	}
	a.sessions[s.serverID] = s
	st.sessions++
	st.lastErr, st.aliasOf = nil, ""
	st.retry.reset(&a.cfg)
	if extra {
		a.lb.reset(&a.cfg)
	}
	a.hdrCount = s.count
	known := a.knownServersLocked()
	if len(a.sessions) >= known {
		a.synced.Store(true)
	}
	a.setSessionGaugesLocked()
	a.m.knownServers.Set(float64(known))
	a.wg.Add(1)
	a.mu.Unlock()
	klog.InfoS("Connected to server", "serverID", s.serverID, "server", st.ep.addr, "serverCount", s.count, "flowControl", s.flowControl())
	if s.flow == nil && !a.cfg.DisableFlowControl {
		// Without flow control one slow reader holds up every connection of this agent; in a mixed fleet this
		// is how an operator finds the streams that lost that protection.
		klog.InfoS("Server did not take up flow control: connections of this agent share the stream's pace, as with upstream",
			"serverID", s.serverID, "server", st.ep.addr)
	}
	go func() {
		defer a.wg.Done()
		s.serve()
		a.sessionEnded(s, st)
	}()
}

// setSessionGaugesLocked counts the open sessions, in all and by flow control.
func (a *Agent) setSessionGaugesLocked() {
	n := map[string]int{flow.Version: 0, flow.None: 0}
	for _, s := range a.sessions {
		n[s.flowControl()]++
	}
	a.m.serverConns.Set(float64(len(a.sessions)))
	for fc, v := range n {
		a.m.serverStreams.WithLabelValues(fc).Set(float64(v))
	}
}

func (a *Agent) sessionEnded(s *session, st *epState) {
	err := s.lastErr()
	a.mu.Lock()
	if a.sessions[s.serverID] == s {
		delete(a.sessions, s.serverID)
	}
	st.sessions--
	st.lastErr, st.errAt = err, time.Now()
	st.retry.reset(&a.cfg)
	a.resolveSoonLocked(st.ep.addr)
	a.setSessionGaugesLocked()
	a.mu.Unlock()
	if !a.draining.Load() {
		klog.InfoS("Disconnected from server; will reconnect", "serverID", s.serverID, "server", st.ep.addr, "reason", err)
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// serverCount is how many servers exist, from the servers' headers and, if configured, the lease count.
func (a *Agent) serverCount() int {
	n := a.hdrCount
	if a.cfg.ServerCount != nil {
		leases := a.cfg.ServerCount()
		if a.cfg.ServerCountMax {
			n = max(n, leases)
		} else {
			n = leases
		}
	}
	return max(n, 1)
}

// knownServersLocked is the number of servers the agent should be connected to: what the servers say, but at
// least the servers it is connected to, and one more for each --proxy-server-host entry that leads to none of
// them. An address of a name is not a server of its own: the name's other address may be the same server (a
// dual-stack name whose IPv6 address has no route), and the servers behind a name say how many they are.
func (a *Agent) knownServersLocked() int {
	known := len(a.sessions)
	for _, eps := range a.resolved {
		if !slices.ContainsFunc(eps, func(ep endpoint) bool {
			st := a.endpoints[ep.addr]
			return st != nil && (st.sessions > 0 || a.coveredLocked(st))
		}) {
			known++
		}
	}
	return max(a.serverCount(), known)
}

// coveredLocked reports whether st has no stream of its own but leads to a server that is connected.
func (a *Agent) coveredLocked(st *epState) bool {
	return st.sessions == 0 && st.aliasOf != "" && a.sessions[st.aliasOf] != nil
}

// ServerStatus describes one server endpoint and the stream to it.
type ServerStatus struct {
	Address     string    `json:"address"`              // dial address
	ServerName  string    `json:"serverName,omitempty"` // TLS name
	ServerID    string    `json:"serverID,omitempty"`   // empty when not connected
	Connected   bool      `json:"connected"`
	Since       time.Time `json:"since,omitzero"`      // when the current stream was opened
	Connections int       `json:"connections"`         // tunnelled connections open through it
	Alias       bool      `json:"alias,omitempty"`     // the address leads to ServerID, connected through another address
	LastError   string    `json:"lastError,omitempty"` // the last connect or stream error, if any
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// FlowControl is the per-connection flow control the stream runs (docs/flow-control.md): flow.Version,
	// or flow.None with a server that did not take it up (upstream's), under which one slow reader holds up
	// the agent's other connections through that server. Empty while not connected, and on an alias.
	FlowControl string `json:"flowControl,omitempty"`
	// ServerWindow and ServerMaxWindow are the server's answer under flow control: the window each
	// connection starts with for data to the server, and the largest it grows to.
	ServerWindow    int `json:"serverWindow,omitempty"`
	ServerMaxWindow int `json:"serverMaxWindow,omitempty"`
}

// StatusReport is the agent's answer on its status endpoint (StatusHandler).
type StatusReport struct {
	AgentID string `json:"agentID"`
	// FlowControl is the version the agent offers servers, or flow.None under --flow-control=false.
	FlowControl string         `json:"flowControl"`
	Servers     []ServerStatus `json:"servers"`
}

// StatusHandler serves the agent's StatusReport as JSON; the command mounts it on the loopback admin port
// (/debug/servers), as the server's own status is on its admin port.
func (a *Agent) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fc := flow.Version
		if a.cfg.DisableFlowControl {
			fc = flow.None
		}
		rep := StatusReport{AgentID: a.cfg.AgentID, FlowControl: fc, Servers: a.Status()}
		if rep.Servers == nil {
			rep.Servers = []ServerStatus{}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	})
}

// Status lists the known endpoints and the servers reached through them, sorted by address. Servers
// reached through a load-balanced address share that address.
func (a *Agent) Status() []ServerStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []ServerStatus
	for _, st := range a.sortedEndpoints() {
		base := ServerStatus{Address: st.ep.addr, ServerName: st.ep.serverName}
		if st.lastErr != nil {
			base.LastError, base.LastErrorAt = st.lastErr.Error(), st.errAt
		}
		found := false
		for _, s := range a.sessions {
			if s.ep.addr != st.ep.addr {
				continue
			}
			ss := base
			ss.ServerID, ss.Connected, ss.Since, ss.Connections = s.serverID, true, s.since, s.connCount()
			ss.FlowControl = s.flowControl()
			if s.flow != nil {
				ss.ServerWindow, ss.ServerMaxWindow = s.flow.Window, s.flow.Max
			}
			out = append(out, ss)
			found = true
		}
		if !found {
			if a.coveredLocked(st) {
				base.ServerID, base.Connected, base.Alias = st.aliasOf, true, true
			}
			out = append(out, base)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}

// Connected returns how many distinct servers the agent has a stream to, and how many it knows of.
func (a *Agent) Connected() (connected, known int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sessions), a.knownServersLocked()
}

// OpenConnections is the number of tunnelled backend connections open now.
func (a *Agent) OpenConnections() int { return int(a.openConns.Load()) }

// ReadyChecks are the agent's readiness checks: upstream's "server-connected" (at least one server) and
// "shutdown" (not draining: a draining agent has told its servers, which send it new dials only when no
// other agent serves the destination), and "initial-sync": a new agent is ready once it has reached every
// server it knows of, or after Config.InitialSyncGrace, so that a DaemonSet rollout does not replace an
// agent that serves every server with one that serves one of them. After that, every server is
// AllServersConnected's matter: an agent that is not ready while one control-plane node is down would
// take every agent of the cluster out of its DaemonSet's ready count, and stall its rollouts, for a server
// that no agent can reach.
func (a *Agent) ReadyChecks() []healthz.HealthChecker {
	return []healthz.HealthChecker{
		healthz.NamedCheck("initial-sync", func(*http.Request) error {
			if a.synced.Load() {
				return nil
			}
			startedAt := a.startedAt.Load()
			if startedAt == 0 {
				// No count to report yet: the agent has not started connecting.
				if g := a.cfg.StartAfter; g != nil {
					return errors.New(g.Waiting())
				}
				return errors.New("not started yet")
			}
			up := time.Since(time.Unix(0, startedAt))
			if up >= a.cfg.InitialSyncGrace {
				return nil
			}
			n, known := a.Connected()
			return fmt.Errorf("connected to %d of %d servers %s after the start; ready once every server is reached, or %s after the start",
				n, known, up.Round(time.Second), a.cfg.InitialSyncGrace)
		}),
		healthz.NamedCheck("shutdown", func(*http.Request) error {
			if a.draining.Load() {
				return errors.New("draining: servers send new dials to other agents first")
			}
			return nil
		}),
		healthz.NamedCheck("server-connected", func(*http.Request) error {
			if n, _ := a.Connected(); n == 0 {
				return errors.New("no servers connected")
			}
			return nil
		}),
	}
}

// AllServersConnected checks that the agent has a stream to every server it knows of, and names those it
// lacks. It is served on its own path (/readyz/all-servers-connected), outside /readyz.
func (a *Agent) AllServersConnected() healthz.HealthChecker {
	return healthz.NamedCheck("all-servers-connected", func(*http.Request) error {
		n, known := a.Connected()
		if n >= known {
			return nil
		}
		var missing []string
		for _, s := range a.Status() {
			if !s.Connected {
				m := s.Address
				if s.LastError != "" {
					m += " (" + s.LastError + ")"
				}
				missing = append(missing, m)
			}
		}
		if len(missing) == 0 {
			// The server count is larger than the servers reached so far: the rest are behind the same
			// address (a load balancer) and not reached yet.
			return fmt.Errorf("connected to %d of %d servers; the others are behind the addresses already connected", n, known)
		}
		return fmt.Errorf("connected to %d of %d servers; not connected: %s", n, known, strings.Join(missing, "; "))
	})
}

// LiveChecks are the agent's liveness checks. The agent has none beyond answering: a lost server is a
// readiness matter, and restarting the agent would not bring the server back.
func (a *Agent) LiveChecks() []healthz.HealthChecker { return nil }
