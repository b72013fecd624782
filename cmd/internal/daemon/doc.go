// Package daemon is the process plumbing shared by konnect's long-running commands (server, agent, socks,
// proxy): the signal context, listeners bound before Run, HTTP servers with timeouts, and the health,
// metrics and pprof endpoints.
//
// It is not a framework: each daemon keeps its own Options → Config → New → Run(ctx) shape and only calls
// into this package from cmd/. Library packages (agent, egress, socks, ...) never import it.
package daemon
