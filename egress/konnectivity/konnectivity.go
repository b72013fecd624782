// Package konnectivity holds, once, the names and numbers that the Konnectivity server, its agents,
// kube-apiserver and konnect's manifests and certificates must agree on, as kubeadm's constants package does.
//
// It is a leaf: it imports nothing of konnect's, so that egress, agent, manifests and cmd can all use it. The
// certificates' common names are not here but in pki, on the certificate table.
// It holds no logic beyond reading the refusal reasons that a tunnel carries as text, and reading upstream's
// metrics from prometheus' default registry. Its subpackages are the rest of the kit the server and the agent
// share: wire (the one gRPC codec both ends speak), flow (per-connection flow control and its queue) and
// batchtls (TLS records batched under the agent link).
package konnectivity

import "time"

// Identities.
const (
	// Namespace holds the agents, their ServiceAccount and the server's static pod.
	Namespace = "kube-system"
	// AgentServiceAccount is the ServiceAccount whose tokens the server accepts from agents.
	AgentServiceAccount = "konnectivity-agent"
	// Audience is the audience of the agents' tokens. The server's TokenReviews name it; kube-apiserver's
	// --api-audiences must not, or the tokens would also be credentials for its API.
	Audience = "system:konnectivity-server"
)

// Default ports: the server's are those the Kubernetes documentation uses, the agent's are upstream
// proxy-agent's defaults.
const (
	AgentPort       = 8132 // server: where agents connect (--agent-port)
	AdminPort       = 8133 // server: admin and pprof (--admin-port)
	HealthPort      = 8134 // server: health and metrics (--health-port)
	AgentHealthPort = 8093 // agent: health and metrics (--health-server-port)
	FrontendPort    = 8090 // server: kube-apiserver's TCP frontend (--server-port) when not on a socket
)

// MaxHeaderList bounds the decoded headers of one gRPC stream, on every Konnectivity link and at both ends.
// gRPC's default is 16 MiB, and gRPC decodes a stream's headers before any interceptor runs, so on the
// agent port a peer without a token could make the server hold tens of MiB per stream: HPACK sends a
// repeated field in one byte. An agent's headers (its ID, identifiers, token and flow-control offer) take a
// few KiB, kube-apiserver's and the server's answers less.
const MaxHeaderList = 64 << 10

// FirstDataHold works around a race in konnectivity-client (v0.34, kube-apiserver's client): its receive
// loop hands DIAL_RSP to the dialing goroutine and goes on to the next packet before that goroutine has
// registered the connection, so DATA that follows DIAL_RSP closely is dropped as "Connection not recognized",
// and the client reports a clean end of stream after a truncated one. Over HTTP CONNECT, kube-apiserver's
// dialer refuses a 200 that arrives in the same read as data. Both hit backends that speak first (SSH, SMTP,
// MySQL banners). So a connection's first data towards kube-apiserver is held until the client has sent
// something on it (it can only write once it has registered the connection, and once it has read the 200)
// or for this long after the dial's answer. konnect's agent holds it (agent/conn.go), for any server; the
// server holds it too (egress/tunnel/frontend.go), for agents that do not (upstream's proxy-agent).
// Client-first protocols such as HTTP and TLS never wait; a server-first banner waits at most this long,
// which is long enough for the client's goroutine to be scheduled on a loaded node (20 ms was not, 1 run
// in 6 under a saturated 2-core machine).
const FirstDataHold = 100 * time.Millisecond
