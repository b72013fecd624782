// Package agent is konnect's Konnectivity tunnel agent: it runs next to the workloads that kube-apiserver must
// reach (nodes, pods, extension API servers), keeps a gRPC stream to every konnectivity server, and dials
// backends on their behalf.
//
// It speaks upstream apiserver-network-proxy's agent protocol (proto/agent AgentService.Connect carrying
// konnectivity-client Packets: DIAL_REQ/DIAL_RSP/DATA/CLOSE_REQ/CLOSE_RSP/DIAL_CLS/DRAIN, with the agentID,
// agentIdentifiers, serverID, serverCount and Authorization metadata), so it works with the upstream
// proxy-server as well as with konnect's own server. It accepts every flag of upstream proxy-agent v0.36.0.
//
// Beyond upstream it:
//   - connects to every server it is given (a comma-separated --proxy-server-host, or a DNS name that
//     resolves to several addresses) without a load balancer (ANP issue 394), and still supports dialing one
//     load-balanced address until it has reached serverCount distinct servers;
//   - looks server names up again every 30 s and when a stream to one of their addresses ends, so that
//     servers that come and go behind a name are followed without a restart (ANP issue 273);
//   - reloads its CA bundle, client certificate and token from disk when they change, without a restart and
//     without touching open tunnels;
//   - reads backends in large pooled buffers and accepts large DATA messages; with konnect's server,
//     per-connection flow control keeps a slow backend from holding up the shared stream (ANP issue 180).
//     With a server without it (upstream's), each backend has a bounded queue: once it is full the shared
//     stream waits while that backend keeps reading, and one that reads nothing for the stall timeout is
//     closed alone;
//   - batches TLS records under the server link, so a large gRPC write is a few system calls instead of
//     one per 16 KiB record;
//   - can restrict the destinations it dials (--allow-destination);
//   - drains on shutdown: DRAIN to every server, which then sends it only dials no other agent can take;
//     open connections finish within a bound; in
//     its last quarter a connection is closed at its first quiet moment rather than cut at the deadline, so
//     that a kept-alive connection ends between two requests, not in the middle of one.
//
// It is not the server side of the tunnel, and it holds no process plumbing (flags, signals, HTTP
// listeners): `konnect agent` (cmd/internal/agentcmd) turns proxy-agent's flags into a Config and wires the
// agent's health checks and metrics registry into its endpoints.
package agent
