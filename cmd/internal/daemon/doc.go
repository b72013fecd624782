// Package daemon is the process plumbing shared by konnect's long-running commands (server, agent, socks,
// proxy): the signal context, listeners bound before Run, HTTP servers with timeouts, the health, metrics
// and pprof endpoints, and Group, which runs a daemon's parts and stops them.
//
// It is not a framework, and library packages (agent, egress, socks, ...) never import it. What it asks of
// the four daemons is one contract, each in its command package (cmd/internal/<name>cmd):
//
//   - Options are the flags: NewOptions holds the defaults and AddFlags registers them. Only Options and
//     the command know flag names; a library's errors name its Config fields or files, and the command
//     adds the flag.
//   - Options.Config() validates every flag and returns a *Config, each error naming its flag. It may read
//     the files it is given, but binds, starts and dials nothing.
//   - New(cfg *Config) builds the daemon and binds every listener it will serve, its own and its health
//     and admin endpoints (Endpoints), TCP through Bound.Listen (loopback unless a flag allows more) and
//     Unix sockets through pki/uds, so that an address in use fails the start. It starts nothing: no
//     goroutine, watch or informer runs before Run. Everything bound goes into the daemon's Bound, whose
//     deferred CloseIfFailed leaves nothing bound when New fails.
//   - The daemon New returns is a Daemon. Run(ctx) serves until ctx ends, then stops within the graceful
//     timeout. It adds the endpoints and then the daemon's parts to a Group, which stops them in reverse
//     order on SIGINT/SIGTERM or the first failure, and returns nil after a stop that ctx asked for.
//     Close releases what New bound, for a daemon that never runs. Startup says where it serves.
//
// A command's run function is RunCommand: those steps and SignalContext. It alone reports a daemon's
// Startup: the Line scripts read (the server's addresses, kubectl proxy's "Starting to serve on") on the
// command's standard output, and one klog line "Serving" with the addresses.
//
// Every daemon serves /metrics next to its health endpoints: the server and the agent always, socks and
// the proxy with --health-listen (kubectl proxy has none, so it stays off unless asked for). Each makes a
// fresh registry in New (NewRegistry), so that two daemons in one process (as in tests) never collide.
// The server adds, read-only, upstream ANP's server metrics, which upstream can only register on the
// default registry (tunnel.UpstreamMetrics).
//
// The graceful timeout has one meaning in every daemon: after the stop signal, how long open tunnels or
// connections may continue before they are closed; 0 closes them at once. It is --graceful-timeout for the
// server and the agent (their upstream-compatible defaults stay), apiproxy.DefaultShutdownGrace for the
// proxy's requests in flight (kubectl proxy has no flag for it), and 0 for socks, which has no drain. The
// process exits at most ShutdownGrace after that (Group.StopTimeout).
package daemon
