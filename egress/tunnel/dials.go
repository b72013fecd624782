package tunnel

import (
	"fmt"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server"
	servermetrics "sigs.k8s.io/apiserver-network-proxy/pkg/server/metrics"
)

// A pending dial is a DIAL_REQ that no agent has answered yet. Upstream proxy-server keeps them without a
// bound and, by default, without a timeout, so a stuck agent lets them pile up (ANP issues 789 and 855).
// Its --backend-dial-timeout, when set, starts one goroutine and timer per dial that live for the whole
// timeout even after the agent answered. konnect bounds how many dials may be pending on a server
// (--max-pending-dials) and times each one out (--backend-dial-timeout, on by default) with a
// time.AfterFunc timer that is stopped as soon as the dial is answered: no goroutine waits with a pending
// dial.
const (
	// DefaultBackendDialTimeout is konnect's default for upstream's --backend-dial-timeout, whose own
	// default is 0 (off). 30 s is kube-apiserver's own dial timeout, so no dial it still waits for is cut
	// short; agents give up on a backend after 5 s themselves, so only a DIAL_REQ that an agent lost or
	// never read gets this far.
	DefaultBackendDialTimeout = 30 * time.Second
	// DefaultMaxPendingDials bounds the dials waiting for an agent's answer on one server. kube-apiserver's
	// own in-flight limits default to 600 requests, and a healthy agent answers within its 5 s dial
	// timeout, so a healthy server is far below it; beyond it, agents are not answering and each further
	// frontend stream would only add memory.
	DefaultMaxPendingDials = 2000

	// pendingRecheck is how soon a timer looks again when it fired while upstream was not holding the dial:
	// either upstream is handing the agent's answer to the frontend (the dial is released in a moment), or
	// upstream has not registered the dial yet (a frontend that sent several DIAL_REQs on one stream).
	pendingRecheck = time.Second
)

// pendingDials holds one server's pending dials. It sees every DIAL_REQ on its way from a frontend (gRPC or
// HTTP CONNECT, see connect.go) to upstream's handler and every DIAL_RSP or DIAL_CLS on its way back, and
// times dials out itself.
type pendingDials struct {
	ps      *server.ProxyServer
	max     int           // 0: no bound
	timeout time.Duration // 0: no timeout

	mu      sync.Mutex
	n       int // slots in use, gRPC dials and CONNECT requests alike
	metrics *metrics
	held    map[int64]*pendingDial // failed dials whose DIAL_REQ upstream has yet to send; each holds a slot
	dials   map[int64]*pendingDial // gRPC dials by dial ID (the DIAL_REQ's random)
}

type pendingDial struct {
	random int64
	s      *dialStream
	timer  *time.Timer      // nil without a timeout
	agent  *dialAgentStream // the agent stream the DIAL_REQ went to, once upstream sent it
	// sent: upstream's send of the DIAL_REQ to the agent returned. That send blocks while the agent does not
	// read, so a dial failed before it was sent keeps its slot (in pendingDials.held) until the send returns:
	// --max-pending-dials then also bounds the goroutines stuck behind such an agent.
	sent bool
}

func newPendingDials(ps *server.ProxyServer, max int, timeout time.Duration, m *metrics) *pendingDials {
	return &pendingDials{ps: ps, max: max, timeout: timeout, metrics: m, dials: map[int64]*pendingDial{},
		held: map[int64]*pendingDial{}}
}

// pending is how many dials wait for an agent.
func (p *pendingDials) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *pendingDials) fullError() error { return konnectivity.TooManyDials(p.max) }

func (p *pendingDials) timeoutError() string { return konnectivity.DialTimedOut(p.timeout).Text }

// take claims a slot; the caller holds p.mu.
func (p *pendingDials) take() error {
	if p.max > 0 && p.n >= p.max {
		p.metrics.dialsRefused.Inc()
		return p.fullError()
	}
	p.n++
	p.metrics.pendingDials.Inc()
	return nil
}

// give returns a slot; the caller holds p.mu.
func (p *pendingDials) give() {
	p.n--
	p.metrics.pendingDials.Dec()
}

// admit registers a gRPC DIAL_REQ from s, or says why it is refused.
func (p *pendingDials) admit(random int64, s *dialStream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.dials[random]; dup {
		return fmt.Errorf("konnect server: dial ID %d is already pending", random)
	}
	if err := p.take(); err != nil {
		return err
	}
	d := &pendingDial{random: random, s: s}
	p.dials[random] = d
	s.dials = append(s.dials, d)
	if p.timeout > 0 {
		d.timer = time.AfterFunc(p.timeout, func() { p.expire(d) })
	}
	return nil
}

// drop forgets d and gives its slot back; the caller holds p.mu and knows that d is registered.
func (p *pendingDials) drop(d *pendingDial) {
	p.forget(d)
	p.give()
}

// forget removes d from the table and its stream, and stops its timer, keeping its slot.
func (p *pendingDials) forget(d *pendingDial) {
	delete(p.dials, d.random)
	for i, o := range d.s.dials {
		if o == d {
			d.s.dials = append(d.s.dials[:i], d.s.dials[i+1:]...)
			break
		}
	}
	if d.timer != nil {
		d.timer.Stop()
	}
}

// release ends the dial random of stream s, if it is still pending: its answer reached the frontend, or the
// frontend cancelled it.
func (p *pendingDials) release(random int64, s *dialStream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.dials[random]; d != nil && d.s == s {
		p.drop(d)
	}
}

// cancel ends the dial random of stream s, which its frontend cancelled (DIAL_CLS).
func (p *pendingDials) cancel(random int64, s *dialStream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.dials[random]; d != nil && d.s == s {
		p.drop(d)
		s.cancelled = append(s.cancelled, random)
	}
}

// releaseStream ends every dial of a frontend stream that is over. Upstream cancels them on the agent.
//
// Upstream's handler, which has returned, forgot the stream's pending dials without updating its
// konnectivity_network_proxy_server_pending_backend_dials gauge (PendingDialManager.removeForStream), and a
// dial the frontend cancelled may have gone the same way. Only its Add and Remove set the gauge, from its
// table, and konnect's agent never answers a dial it cancelled, so no late DIAL_RSP comes to correct it:
// removing those dials again, by ID, sets it right.
func (p *pendingDials) releaseStream(s *dialStream) {
	p.mu.Lock()
	gone := s.cancelled
	s.cancelled = nil
	for len(s.dials) > 0 {
		gone = append(gone, s.dials[0].random)
		p.drop(s.dials[0])
	}
	p.mu.Unlock()
	for _, random := range gone {
		p.ps.PendingDial.Remove(random)
	}
}

// expire runs on d's timer. If the dial is still pending in upstream, it fails; if upstream does not hold it
// (it is handing the agent's answer to the frontend, or has not registered the dial yet), the timer looks
// again shortly.
func (p *pendingDials) expire(d *pendingDial) {
	p.mu.Lock()
	live := p.dials[d.random] == d
	p.mu.Unlock()
	if !live {
		return
	}
	if p.fail(d, p.timeoutError(), servermetrics.DialFailureBackendDialTimeout) {
		return
	}
	p.mu.Lock()
	if p.dials[d.random] == d {
		d.timer.Reset(pendingRecheck)
	}
	p.mu.Unlock()
}

// fail ends a pending dial with a failed DIAL_RSP to the frontend, and reports whether it did. Removing the
// dial from upstream's table decides the race with the agent's answer: whoever removes it owns the outcome.
// If fail wins, the agent's late DIAL_RSP finds no pending dial, so upstream answers it with CLOSE_REQ and
// the agent closes the connection it opened.
func (p *pendingDials) fail(d *pendingDial, msg string, reason servermetrics.DialFailureReason) bool {
	if p.ps.PendingDial.Remove(d.random) == nil {
		return false
	}
	p.mu.Lock()
	if p.dials[d.random] == d {
		p.forget(d)
		if d.sent {
			p.give()
		} else {
			// Upstream registered the dial, so its goroutine sends the DIAL_REQ now or soon; the slot is
			// given back when that send returns (dialAgentStream.SendMsg).
			p.held[d.random] = d
		}
	}
	p.mu.Unlock()
	// Counted before the frontend hears of it, so that whoever saw the failure finds it in the metrics.
	servermetrics.Metrics.ObserveDialFailure(reason)
	if reason == servermetrics.DialFailureBackendDialTimeout {
		p.metrics.dialTimeouts.Inc()
	}
	klog.V(2).InfoS("Pending dial failed", "dialID", d.random, "reason", msg)
	// The frontend's send path is safe for concurrent use (upstream sends from several goroutines).
	if err := d.s.ServerStream.SendMsg(dialFailed(d.random, msg)); err != nil {
		klog.V(5).InfoS("Failed to send DIAL_RSP for a failed pending dial", "dialID", d.random, "err", err)
	}
	return true
}

// agentInterceptor notes which agent stream each DIAL_REQ goes to, so that the dials still pending when that
// stream ends fail at once instead of at the timeout (upstream leaves them pending, its TODO #126).
func (p *pendingDials) agentInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	as := &dialAgentStream{ServerStream: ss, p: p}
	err := handler(srv, as)
	p.mu.Lock()
	var orphans []*pendingDial
	for _, d := range p.dials {
		if d.agent == as {
			orphans = append(orphans, d)
		}
	}
	p.mu.Unlock()
	for _, d := range orphans {
		p.fail(d, agentGoneText, servermetrics.DialFailureBackendClose)
	}
	return err
}

// agentGoneText is the error of a dial whose agent went away before it answered.
const agentGoneText = "konnect server: the agent's connection ended before it answered the dial"

// dialAgentStream is one agent stream as upstream's handler sees it.
type dialAgentStream struct {
	grpc.ServerStream
	p *pendingDials
}

func (a *dialAgentStream) SendMsg(m any) error {
	pkt, ok := m.(*client.Packet)
	if !ok || pkt.Type != client.PacketType_DIAL_REQ {
		return a.ServerStream.SendMsg(m)
	}
	random := pkt.GetDialRequest().GetRandom()
	a.p.mu.Lock()
	d := a.p.dials[random]
	if d != nil {
		d.agent = a
	}
	a.p.mu.Unlock()
	err := a.ServerStream.SendMsg(m)
	a.p.mu.Lock()
	if d != nil {
		d.sent = true
	}
	if a.p.held[random] != nil {
		delete(a.p.held, random)
		a.p.give()
	}
	a.p.mu.Unlock()
	return err
}

func dialFailed(random int64, msg string) *client.Packet {
	return &client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
		DialResponse: &client.DialResponse{Random: random, Error: msg}}}
}

// interceptor wraps each gRPC frontend stream so that its dials are counted, bounded and timed out.
func (p *pendingDials) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ds := &dialStream{ServerStream: ss, p: p, flow: frontendFlowOf(ss)}
	defer p.releaseStream(ds)
	return handler(srv, ds)
}

// frontendOf is the flow-control state of the frontend whose dial random is pending, or nil.
func (p *pendingDials) frontendOf(random int64) *frontendFlow {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.dials[random]; d != nil {
		return d.s.flow
	}
	return nil
}

// dialStream is one gRPC frontend stream as upstream's handler sees it.
type dialStream struct {
	grpc.ServerStream
	p     *pendingDials
	dials []*pendingDial // guarded by p.mu; kube-apiserver's single-use tunnels have at most one
	// cancelled: the IDs of dials the frontend cancelled, guarded by p.mu (releaseStream).
	cancelled []int64

	flow *frontendFlow // nil when the server does not use flow control
	// rest is what is left of a DATA packet that was larger than its connection's credit: the next RecvMsg
	// hands it on, as credit allows.
	rest *client.Data
}

// RecvMsg admits each DIAL_REQ before upstream sees it. A refused one is answered here and never reaches
// upstream, so it costs no agent anything. DATA for a connection under flow control is handed on only as
// the agent grants credit for it, and in pieces no larger than that credit.
func (s *dialStream) RecvMsg(m any) error {
	for {
		if s.rest != nil {
			return s.take(m.(*client.Packet), s.rest)
		}
		if err := s.ServerStream.RecvMsg(m); err != nil {
			return err
		}
		pkt, ok := m.(*client.Packet)
		if !ok {
			return nil
		}
		switch pkt.Type {
		case client.PacketType_DATA:
			if s.flow != nil {
				return s.take(pkt, pkt.GetData())
			}
		case client.PacketType_DIAL_REQ:
			random := pkt.GetDialRequest().GetRandom()
			if err := s.p.admit(random, s); err != nil {
				klog.V(2).InfoS("Dial refused", "dialID", random, "dialAddress", pkt.GetDialRequest().GetAddress(), "err", err)
				if err := s.ServerStream.SendMsg(dialFailed(random, err.Error())); err != nil {
					return err
				}
				continue
			}
		case client.PacketType_DIAL_CLS:
			s.p.cancel(pkt.GetCloseDial().GetRandom(), s)
		}
		return nil
	}
}

// take fills pkt with as much of d as its connection has credit for, waiting for credit while there is
// none, and keeps the rest for the next RecvMsg. A packet that fits its credit goes on as it is.
func (s *dialStream) take(pkt *client.Packet, d *client.Data) error {
	s.rest = nil
	if c := s.flow.conn(d.GetConnectID()); c != nil {
		n, waited, err := c.credit.Wait(s.Context())
		if waited > 0 {
			c.agent.s.metrics.creditWait.Add(waited.Seconds())
		}
		if err != nil {
			return err
		}
		if n < len(d.Data) {
			s.rest = &client.Data{ConnectID: d.ConnectID, Data: d.Data[n:]}
			d = &client.Data{ConnectID: d.ConnectID, Data: d.Data[:n]}
		}
		c.credit.Use(len(d.Data))
	}
	if pkt.GetData() != d {
		setData(pkt, d)
	}
	return nil
}

func setData(pkt *client.Packet, d *client.Data) {
	proto.Reset(pkt)
	pkt.Type = client.PacketType_DATA
	pkt.Payload = &client.Packet_Data{Data: d}
}

// SendMsg releases a dial when its answer (or the agent's DIAL_CLS) goes to the frontend.
func (s *dialStream) SendMsg(m any) error {
	if pkt, ok := m.(*client.Packet); ok {
		switch pkt.Type {
		case client.PacketType_DIAL_RSP:
			s.p.release(pkt.GetDialResponse().GetRandom(), s)
		case client.PacketType_DIAL_CLS:
			s.p.release(pkt.GetCloseDial().GetRandom(), s)
		}
	}
	return s.ServerStream.SendMsg(m)
}
