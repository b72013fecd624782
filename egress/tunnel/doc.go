// Package tunnel is the konnect Konnectivity server: the control-plane end of the tunnel that kube-apiserver
// dials through (gRPC or HTTP CONNECT, over a Unix socket or mTLS TCP) and that agents connect to over TLS.
//
// It speaks the wire protocol of sigs.k8s.io/apiserver-network-proxy v0.36.0 and reuses that module's
// ProxyServer for routing (proxy strategies, agent identifiers, metrics), so it works with upstream
// proxy-agent and with kube-apiserver's konnectivity client. Around it, this package adds what upstream
// lacks:
//
//   - agents must authenticate (client certificate or ServiceAccount token) unless the Config says
//     otherwise; tokens are checked with upstream's checks and errors, but one Connect stream per
//     connection at a time, with successful reviews cached briefly, concurrent reviews bounded, and sources
//     of rejected tokens held back (auth.go);
//   - a peer of a TCP listener that has not authenticated is bounded: a few seconds to authenticate, and a
//     cap on such peers in all and per source (admission.go);
//   - every listener is bound in New, a stale socket is replaced and a live one refused;
//   - Run returns within a bounded graceful timeout even while tunnels are open (ANP issue 866);
//   - DATA packets are cut below gRPC's 4 MiB default message size before they reach an agent or the
//     frontend, so a single large write does not kill the tunnel;
//   - dials waiting for an agent are bounded (--max-pending-dials) and time out by default
//     (--backend-dial-timeout, 30 s; upstream's default is off), without a goroutine per pending dial, and
//     fail at once when their agent disconnects (ANP issues 789 and 855; dials.go);
//   - per-connection flow control with konnect's agent (flow.go, docs/flow-control.md): a slow reader, or a
//     backend that reads slowly, holds back only its own connection, never the agent stream it shares with
//     the others (ANP issue 180); upstream's agent, which does not offer it, gets a bounded queue per
//     connection that holds the stream only once it is full;
//   - larger HTTP/2 windows and buffers on both links, a codec (egress/konnectivity/wire, shared with the
//     agent) that moves DATA payloads without copying them, small packets from upstream's agent merged into
//     larger frontend messages, and TLS records on the agent link batched into fewer system calls;
//   - the agent-facing and frontend certificates are reloaded from disk when they change;
//   - a per-agent status (identifiers, connection age, last error) for `konnect doctor`.
//
// It parses no flags (cmd/internal/servercmd builds its Config), and it does not serve health, metrics or pprof
// endpoints itself: it exposes checks and handlers that the command wires up.
package tunnel
