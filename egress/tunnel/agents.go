package tunnel

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// agentStream splits DATA packets bound for an agent below maxChunk. Upstream's Backend serialises sends
// on the stream, so the pieces of one packet are never interleaved with another packet.
type agentStream struct {
	grpc.ServerStream
	split prometheus.Counter // counts the packets cut
}

func (a agentStream) SendMsg(m any) error {
	p, ok := m.(*client.Packet)
	if !ok {
		return a.ServerStream.SendMsg(m)
	}
	return sendChunked(a.ServerStream.SendMsg, p, maxChunk, a.split)
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
}

// maxRemembered bounds how many disconnected agents are remembered, against an agent ID flood.
const maxRemembered = 256

type agentTracker struct {
	mu     sync.Mutex
	agents map[string]*AgentStatus
}

// get returns id's status, remembering it if it is new; the caller holds t.mu.
func (t *agentTracker) get(id string) *AgentStatus {
	a := t.agents[id]
	if a == nil {
		a = &AgentStatus{ID: id}
		t.agents[id] = a
	}
	return a
}

func (t *agentTracker) connected(id, idents, remote string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.get(id)
	now := time.Now()
	if a.Connections == 0 {
		a.Since = now
	}
	a.Connections++
	a.Connected = true
	a.Identifiers, a.Remote, a.LastSeen = idents, remote, now
}

func (t *agentTracker) disconnected(id string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.agents[id]
	if a == nil {
		return
	}
	now := time.Now()
	a.Connections--
	a.LastSeen = now
	if a.Connections <= 0 {
		a.Connections, a.Connected, a.Since = 0, false, time.Time{}
	}
	if err != nil && status.Code(err) != codes.Canceled {
		a.LastError, a.LastErrorAt = err.Error(), now
	}
	t.prune()
}

// failed records an agent that never got connected (for example, authentication failed).
func (t *agentTracker) failed(id, idents, remote string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.get(id)
	now := time.Now()
	a.Identifiers, a.Remote, a.LastSeen = idents, remote, now
	a.LastError, a.LastErrorAt = err.Error(), now
	t.prune()
}

func (t *agentTracker) prune() {
	if len(t.agents) <= maxRemembered {
		return
	}
	var oldest *AgentStatus
	for _, a := range t.agents {
		if !a.Connected && (oldest == nil || a.LastSeen.Before(oldest.LastSeen)) {
			oldest = a
		}
	}
	if oldest != nil {
		delete(t.agents, oldest.ID)
	}
}

func (t *agentTracker) list() []AgentStatus {
	t.mu.Lock()
	out := make([]AgentStatus, 0, len(t.agents))
	for _, a := range t.agents {
		out = append(out, *a)
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

// agentInterceptor splits large DATA packets and records each agent's connection for Status.
func (s *Server) agentInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	id := first(md.Get(header.AgentID))
	idents := strings.Join(md.Get(header.AgentIdentifiers), ",")
	remote := ""
	if p, ok := peer.FromContext(ctx); ok {
		remote = p.Addr.String()
	}
	if id == "" {
		// Upstream refuses it too; record it so that doctor can say why.
		err := status.Error(codes.InvalidArgument, "agent sent no agentID header")
		s.agents.failed("(no agent ID)", idents, remote, err)
		return err
	}
	// Upstream authenticates inside its handler and returns before SendHeader when that fails; a stream
	// that has sent headers was accepted.
	hs := &headerWatch{ServerStream: agentStream{ss, s.metrics.chunkedPackets}, accepted: func() { s.agents.connected(id, idents, remote) }}
	err := handler(srv, hs)
	if !hs.sent {
		if err == nil {
			err = status.Error(codes.Unknown, "agent stream ended before it was accepted")
		}
		s.agents.failed(id, idents, remote, err)
		return err
	}
	s.agents.disconnected(id, err)
	return err
}

type headerWatch struct {
	grpc.ServerStream
	accepted func()
	sent     bool
}

func (h *headerWatch) SendHeader(md metadata.MD) error {
	err := h.ServerStream.SendHeader(md)
	if err == nil && !h.sent {
		h.sent = true
		h.accepted()
	}
	return err
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
