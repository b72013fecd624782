package tunnel

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/pkg/server"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// agentStream is one agent stream as upstream's handler sees it. It splits DATA packets bound for the agent
// below maxChunk (upstream's Backend serialises its sends, so the pieces of one packet are never interleaved
// with another packet), and, when the agent took flow control up, does the accounting of agentFlow.
type agentStream struct {
	grpc.ServerStream
	split prometheus.Counter // counts the packets cut
	flow  *agentFlow         // nil: the agent did not offer flow control, or the server does not use it
	offer string             // the server's answer to the agent's offer, sent with the response headers

	// sendMu serialises upstream's sends, which its Backend already orders, with the flow-control grants
	// that konnect sends on the same stream.
	sendMu sync.Mutex
}

func (a *agentStream) SendMsg(m any) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	p, ok := m.(*client.Packet)
	if !ok {
		return a.ServerStream.SendMsg(m)
	}
	return sendChunked(a.ServerStream.SendMsg, p, maxChunk, a.split)
}

// SendHeader answers the agent's flow-control offer next to upstream's server ID and count.
func (a *agentStream) SendHeader(md metadata.MD) error {
	if a.offer != "" {
		md = md.Copy()
		md.Set(flow.Header, a.offer)
	}
	return a.ServerStream.SendHeader(md)
}

// RecvMsg takes grants out of the stream, and accounts the dials and data that go on to upstream.
func (a *agentStream) RecvMsg(m any) error {
	for {
		if err := a.ServerStream.RecvMsg(m); err != nil || a.flow == nil {
			return err
		}
		p, ok := m.(*client.Packet)
		if !ok {
			return nil
		}
		switch p.Type {
		case flow.GrantType:
			if err := a.flow.grant(p); err != nil {
				a.flow.s.metrics.flowViolations.WithLabelValues(flowMalformed).Inc()
				return status.Error(codes.InvalidArgument, err.Error())
			}
			continue
		case client.PacketType_DIAL_RSP:
			a.flow.dialed(p.GetDialResponse())
		case client.PacketType_DATA:
			if !a.flow.received(p.GetData()) {
				continue
			}
		}
		return nil
	}
}

// AgentStatus is what the server knows about one agent, for `konnect doctor status`.
type AgentStatus struct {
	ID          string    `json:"id"`
	Identifiers string    `json:"identifiers,omitempty"`
	Remote      string    `json:"remote,omitempty"`
	Connected   bool      `json:"connected"`
	Connections int       `json:"connections"`
	Since       time.Time `json:"since,omitzero"`
	LastSeen    time.Time `json:"lastSeen"`
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// FlowControl counts the agent's connected streams by their per-connection flow control: the version
	// negotiated (flow.Version) or flow.None, the label of konnect_tunnel_server_agent_streams. A stream
	// without it lets one slow reader hold up the agent's other connections (docs/flow-control.md). It is
	// empty while the agent is not connected, and absent from the status of servers that predate it: a
	// reader takes a connected agent without it as unknown.
	FlowControl map[string]int `json:"flowControl,omitempty"`
}

// Status is the server's answer on its status endpoint.
type Status struct {
	ServerID    string        `json:"serverID"`
	ServerCount int           `json:"serverCount"`
	Mode        string        `json:"mode"`
	Frontend    string        `json:"frontend"`
	Agent       string        `json:"agentAddress"`
	Frontends   int64         `json:"openFrontends"`
	Draining    bool          `json:"draining"`
	Agents      []AgentStatus `json:"agents"`
	// FlowControl is the flow-control version this server takes up from agents that offer it, or
	// flow.None when it runs with --flow-control=false. Servers that predate the field leave it out.
	FlowControl string `json:"flowControl,omitempty"`
}

// maxRemembered bounds how many disconnected agents are remembered, and maxRefused how many agent IDs under
// which no agent authenticated and a stream was refused. A peer that cannot authenticate may claim any ID;
// its refusals push out only each other, never what is remembered of agents that did authenticate.
const (
	maxRemembered = 256
	maxRefused    = 64
)

type agentTracker struct {
	mu       sync.Mutex
	agents   map[string]*AgentStatus // by agent ID: agents that authenticated, connected or not
	refusals map[string]*AgentStatus // by agent ID: refused streams under IDs not in agents
}

func newAgentTracker() agentTracker {
	return agentTracker{agents: map[string]*AgentStatus{}, refusals: map[string]*AgentStatus{}}
}

// get returns id's status among the agents that authenticated, remembering it if it is new (with what was
// refused under its ID before); the caller holds t.mu.
func (t *agentTracker) get(id string) *AgentStatus {
	a := t.agents[id]
	if a == nil {
		if a = t.refusals[id]; a != nil {
			delete(t.refusals, id)
		} else {
			a = &AgentStatus{ID: id}
		}
		t.agents[id] = a
	}
	return a
}

// connected records a stream of agent id that was accepted with flow control fc (flow.Version or flow.None).
func (t *agentTracker) connected(id, idents, remote, fc string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.get(id)
	now := time.Now()
	if a.Connections == 0 {
		a.Since = now
		a.FlowControl = map[string]int{}
	}
	a.Connections++
	a.FlowControl[fc]++
	a.Connected = true
	a.Identifiers, a.Remote, a.LastSeen = idents, remote, now
}

// disconnected records the end of a stream that connected recorded with the same fc.
func (t *agentTracker) disconnected(id, fc string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.agents[id]
	if a == nil {
		return
	}
	now := time.Now()
	a.Connections--
	a.LastSeen = now
	if a.FlowControl[fc]--; a.FlowControl[fc] <= 0 {
		delete(a.FlowControl, fc)
	}
	if a.Connections <= 0 {
		a.Connections, a.Connected, a.Since, a.FlowControl = 0, false, time.Time{}, nil
	}
	if err != nil && status.Code(err) != codes.Canceled {
		a.LastError, a.LastErrorAt = err.Error(), now
	}
	prune(t.agents, maxRemembered)
}

// failed records an agent stream that authenticated but never got connected (for example, upstream
// refused it).
func (t *agentTracker) failed(id, idents, remote string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	record(t.get(id), idents, remote, err)
	prune(t.agents, maxRemembered)
}

// refused records a stream that failed to authenticate under the agent ID it claims, so that doctor can say
// why an agent cannot get in; but not while an agent of that ID is connected: a peer that did not
// authenticate must not change what the status says of one that did (the server's log has the refusal).
// Under an ID that no agent authenticated with, the refusal is kept apart, in its own bound.
func (t *agentTracker) refused(id, idents, remote string, err error) {
	if id == "" {
		id = noAgentID
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.agents[id]; a != nil {
		if !a.Connected {
			record(a, idents, remote, err)
		}
		return
	}
	a := t.refusals[id]
	if a == nil {
		a = &AgentStatus{ID: id}
		t.refusals[id] = a
	}
	record(a, idents, remote, err)
	prune(t.refusals, maxRefused)
}

// record sets a's last error.
func record(a *AgentStatus, idents, remote string, err error) {
	now := time.Now()
	a.Identifiers, a.Remote, a.LastSeen = idents, remote, now
	a.LastError, a.LastErrorAt = err.Error(), now
}

// prune forgets the disconnected agent of m seen longest ago while m holds more than max.
func prune(m map[string]*AgentStatus, max int) {
	if len(m) <= max {
		return
	}
	var oldest *AgentStatus
	for _, a := range m {
		if !a.Connected && (oldest == nil || a.LastSeen.Before(oldest.LastSeen)) {
			oldest = a
		}
	}
	if oldest != nil {
		delete(m, oldest.ID)
	}
}

func (t *agentTracker) list() []AgentStatus {
	t.mu.Lock()
	out := make([]AgentStatus, 0, len(t.agents)+len(t.refusals))
	for _, m := range []map[string]*AgentStatus{t.agents, t.refusals} {
		for _, a := range m {
			c := *a
			c.FlowControl = maps.Clone(a.FlowControl) // encoded after t.mu is released
			out = append(out, c)
		}
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Connected != out[j].Connected {
			return out[i].Connected
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// noAgentID is what Status calls a stream that sent no agent ID.
const noAgentID = "(no agent ID)"

// agentOf is who a Connect stream says it is: its agent ID and identifiers, and its remote address.
func agentOf(ctx context.Context) (id, idents, remote string) {
	md, _ := metadata.FromIncomingContext(ctx)
	if p, ok := peer.FromContext(ctx); ok {
		remote = p.Addr.String()
	}
	return first(md.Get(header.AgentID)), strings.Join(md.Get(header.AgentIdentifiers), ","), remote
}

// agentInterceptor takes up the agent's flow-control offer, splits large DATA packets and records each
// agent's connection for Status. It runs after agentAuthInterceptor, so that only a stream that
// authenticated gets this far: one that did not can neither skip its connection's one attempt (a bad offer
// is refused here) nor write on an agent's status.
func (s *Server) agentInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	id, idents, remote := agentOf(ctx)
	if id == "" {
		// Upstream refuses it too; record it so that doctor can say why.
		err := status.Error(codes.InvalidArgument, "agent sent no agentID header")
		s.agents.failed(noAgentID, idents, remote, err)
		return err
	}
	as := &agentStream{ServerStream: ss, split: s.metrics.chunkedPackets}
	offers := md.Get(flow.Header)
	var offer flow.Offer
	if !s.cfg.DisableFlowControl {
		var ok bool
		var err error
		offer, ok, err = flow.ParseOffer(offers)
		if err != nil {
			err = status.Error(codes.InvalidArgument, err.Error())
			s.agents.failed(id, idents, remote, err)
			return err
		}
		if ok {
			as.flow = newAgentFlow(s, offer, func(p *client.Packet) error { return as.SendMsg(p) })
			as.offer = s.cfg.flowOffer().String()
			defer as.flow.end()
		}
	}
	// Upstream's handler refuses a stream before it adds the stream's Backend to the backend managers; a
	// stream whose Backend was added was accepted, and dials can reach it from then on (addedWatch).
	var accepted atomic.Bool
	fc := flow.None
	if as.flow != nil {
		fc = flow.Version
	}
	streams := s.metrics.agentStreams.WithLabelValues(fc)
	added := func() {
		if !accepted.Swap(true) {
			// Before connected: a stream that Status shows is already counted, and its flow control logged.
			streams.Inc()
			s.logFlowControl(id, remote, offers, offer, as.flow != nil)
			s.agents.connected(id, idents, remote, fc)
		}
	}
	// Upstream's Backend hands out its stream's context, and nothing else of it: the callback that addedWatch
	// calls once the stream's Backend is registered goes there.
	err := handler(srv, &contextStream{ServerStream: as, ctx: context.WithValue(ctx, backendAddedKey{}, added)})
	if !accepted.Load() {
		if err == nil {
			err = status.Error(codes.Unknown, "agent stream ended before it was accepted")
		}
		s.agents.failed(id, idents, remote, err)
		return err
	}
	streams.Dec()
	s.agents.disconnected(id, fc, err)
	return err
}

// logFlowControl says whether an accepted agent stream runs flow control. Without it, one slow reader holds
// up every connection of the agent, so a server that offers flow control says so at Info: in a mixed fleet
// it is how an operator finds the agents that lost that protection (older, upstream's, or offering only
// versions this server does not know, whose offer is logged).
func (s *Server) logFlowControl(id, remote string, offers []string, offer flow.Offer, on bool) {
	switch {
	case on:
		klog.V(2).InfoS("Agent stream connected; flow control: "+flow.Version, "agentID", id, "remote", remote,
			"agentWindow", offer.Window, "agentMaxWindow", offer.Max)
	case s.cfg.DisableFlowControl:
		klog.V(2).InfoS("Agent stream connected; flow control is off (--flow-control=false)", "agentID", id, "remote", remote)
	case len(offers) > 0:
		klog.InfoS("Agent offered only flow-control versions this server does not know ("+flow.Version+"): connections of this agent share the stream's pace, as with upstream",
			"agentID", id, "remote", remote, "offer", offers)
	default:
		klog.InfoS("Agent did not take up flow control: connections of this agent share the stream's pace, as with upstream",
			"agentID", id, "remote", remote)
	}
}

type backendAddedKey struct{}

// addedWatch wraps the last of upstream's backend managers, to which upstream's handler adds an agent's
// Backend after the others: once it returns, every strategy can pick the agent for a dial. Marking the agent
// connected when its headers were sent, just before, let a dial that followed that mark find no agent.
type addedWatch struct {
	server.BackendManager
}

func (w addedWatch) AddBackend(b *server.Backend) {
	w.BackendManager.AddBackend(b)
	if added, ok := b.Context().Value(backendAddedKey{}).(func()); ok {
		added()
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// StatusHandler serves Status as JSON; the command mounts it on the loopback admin port.
func (s *Server) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Status())
	})
}
