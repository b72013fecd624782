package tunnel

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// Per-connection flow control (docs/flow-control.md) on the server. The routing stays upstream's: konnect
// sees every packet on its way between the agent streams and the frontend streams, in the stream wrappers of
// agents.go, frontend.go and dials.go, and does the accounting there.
//
//   - Data from an agent: the agent sends a connection no more than its window. The frontend's queue takes
//     whatever arrives without ever making the agent stream wait, and the server grants the agent more as
//     the frontend's reader takes it.
//   - Data to an agent: a frontend stream is read only while its connection has credit from the agent, so a
//     backend that reads slowly holds back its own frontend, through that frontend's own HTTP/2 window or
//     socket, and nothing else.

// errAgentGone ends a frontend that waits for credit from an agent whose stream ended.
var errAgentGone = errors.New("konnect server: the agent's stream ended")

// agentFlow is the flow-control state of one agent stream that took the extension up.
type agentFlow struct {
	s      *Server
	peer   flow.Offer // the agent's windows: the credit each connection starts with towards it
	grants *flow.Grants
	budget *flow.Budget // how far the windows of this agent's connections may grow together

	mu    sync.Mutex
	conns map[int64]*connFlow // by the agent's connection ID
	ended bool
}

func newAgentFlow(s *Server, peer flow.Offer, send func(*client.Packet) error) *agentFlow {
	return &agentFlow{s: s, peer: peer, grants: flow.NewGrants(send), conns: map[int64]*connFlow{},
		budget: flow.NewBudget(flow.StreamBudget(s.cfg.FlowMaxWindow))}
}

// connFlow is the flow-control state of one tunnelled connection.
type connFlow struct {
	agent  *agentFlow
	front  *frontendFlow
	id     int64
	window *flow.Window // data from the agent
	credit *flow.Credit // data to the agent
	// broken: the agent broke flow control on this connection, which is closing; what it still sends for it
	// is dropped without another count.
	broken atomic.Bool
}

// dialed binds a frontend to the connection its dial opened, as the agent's DIAL_RSP passes. It runs on the
// agent stream's receive goroutine, so the binding is in place before the connection's first DATA is read.
func (a *agentFlow) dialed(rsp *client.DialResponse) {
	if rsp.GetError() != "" || rsp.GetConnectID() == 0 {
		return
	}
	f := a.s.dials.frontendOf(rsp.GetRandom())
	if f == nil {
		return // the dial already failed here; upstream closes the agent's connection
	}
	own := a.s.cfg.flowOffer()
	c := &connFlow{agent: a, front: f, id: rsp.GetConnectID(),
		window: flow.NewWindow(own.Window, own.Max, a.budget), credit: flow.NewCredit(a.peer.Window, a.peer.Max)}
	a.mu.Lock()
	if a.ended {
		a.mu.Unlock()
		return
	}
	a.conns[c.id] = c
	a.mu.Unlock()
	if !f.add(c) {
		// The frontend ended as the answer passed: no one would forget the connection.
		a.forget(c)
	}
}

func (a *agentFlow) conn(id int64) *connFlow {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conns[id]
}

func (a *agentFlow) forget(c *connFlow) {
	c.window.Release()
	a.mu.Lock()
	if a.conns[c.id] == c {
		delete(a.conns, c.id)
	}
	a.mu.Unlock()
	a.grants.Forget(c.id)
}

// received accounts DATA from the agent, and reports false for data the connection's window did not allow:
// that connection is closed, and its data, then and after, dropped.
func (a *agentFlow) received(d *client.Data) bool {
	c := a.conn(d.GetConnectID())
	if c == nil {
		return true
	}
	if c.broken.Load() {
		return false
	}
	if err := c.window.Receive(len(d.GetData())); err != nil {
		c.broke(flowWindowExceeded, err)
		return false
	}
	return true
}

// grant applies a grant packet from the agent. A packet that does not decode ends the agent's stream.
func (a *agentFlow) grant(pkt *client.Packet) error {
	return flow.DecodeGrants(pkt, func(id, n int64) error {
		c := a.conn(id)
		if c == nil {
			return nil // the grant crossed the connection's close on the wire
		}
		if err := c.credit.Add(n); err != nil {
			c.broke(flowCreditOverflow, err)
		}
		return nil
	})
}

// end runs when the agent stream ends: frontends waiting for its credit give up.
func (a *agentFlow) end() {
	a.grants.Stop()
	a.mu.Lock()
	a.ended = true
	conns := a.conns
	a.conns = nil
	a.mu.Unlock()
	for _, c := range conns {
		c.credit.Close(errAgentGone)
	}
}

// broke closes a connection whose agent broke the protocol on it, so that the server never holds more for it
// than its window.
func (c *connFlow) broke(reason string, err error) {
	if c.broken.Swap(true) {
		return
	}
	c.agent.s.metrics.flowViolations.WithLabelValues(reason).Inc()
	klog.ErrorS(err, "Closing a tunnel on which the agent broke flow control", "connectionID", c.id)
	c.front.close()
}

// frontendFlow is the flow-control state of one frontend stream: its connections (kube-apiserver's tunnels
// are single-use, so at most one) and how to close it.
type frontendFlow struct {
	close func()
	queue *flow.Queue[*client.Packet] // its queue towards kube-apiserver

	mu    sync.Mutex
	conns map[int64]*connFlow
	ended bool
}

// add binds c to the frontend, and reports false if the frontend has ended: c is then the caller's to
// forget.
func (f *frontendFlow) add(c *connFlow) bool {
	f.mu.Lock()
	if f.ended {
		f.mu.Unlock()
		return false
	}
	if f.conns == nil {
		f.conns = map[int64]*connFlow{}
	}
	f.conns[c.id] = c
	f.mu.Unlock()
	// The connection's window bounds what the agent sends it, so its queue takes that without waiting: a
	// reader that stops holds its window, never the agent's stream.
	f.queue.Unbound()
	return true
}

func (f *frontendFlow) conn(id int64) *connFlow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns[id]
}

// consumed accounts n bytes of connection id that the frontend's reader took, and grants the agent more.
func (f *frontendFlow) consumed(id int64, n int) {
	if c := f.conn(id); c != nil {
		c.agent.grants.Add(id, c.window.Consume(n))
	}
}

// end runs when the frontend stream is over.
func (f *frontendFlow) end() {
	f.mu.Lock()
	conns := f.conns
	f.conns, f.ended = nil, true
	f.mu.Unlock()
	for _, c := range conns {
		c.credit.Close(flow.ErrClosed)
		c.agent.forget(c)
	}
}

// Reasons of konnect_tunnel_server_flow_control_violations_total.
const (
	flowWindowExceeded = "window_exceeded"
	flowCreditOverflow = "credit_overflow"
	flowMalformed      = "malformed"
)
