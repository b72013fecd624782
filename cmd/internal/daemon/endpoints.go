package daemon

import (
	"context"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Endpoints are a daemon's health and admin listeners and what they serve. A daemon's New binds them with
// a Bound; its Run adds them to its Group before the daemon's own parts.
type Endpoints struct {
	Health, Admin       net.Listener // nil: not served
	HealthMux, AdminMux http.Handler
}

// AddTo adds a part to g for each bound endpoint. Added first, they stop last: probes see /readyz fail
// while the daemon drains, and an endpoint that fails stops the daemon rather than leave it unobservable.
func (e *Endpoints) AddTo(g *Group) {
	if e.Health != nil {
		g.Add("health endpoint", func(ctx context.Context) error { return Serve(ctx, e.Health, e.HealthMux) })
	}
	if e.Admin != nil {
		g.Add("admin endpoint", func(ctx context.Context) error { return Serve(ctx, e.Admin, e.AdminMux) })
	}
}

// ListenHealthAdmin binds, through b, the health endpoint on healthAddr and the admin endpoint on adminAddr.
// The health endpoint carries no secrets, so any address given is taken; the admin endpoint serves pprof and
// is refused beyond loopback unless allowRemoteAdmin (--allow-remote-admin). The flags name the addresses in
// errors.
func (e *Endpoints) ListenHealthAdmin(b *Bound, healthAddr, healthFlags, adminAddr, adminFlags string, allowRemoteAdmin bool) (err error) {
	if e.Health, err = b.Listen("tcp", healthAddr, true, healthFlags); err != nil {
		return err
	}
	e.Admin, err = b.Listen("tcp", adminAddr, allowRemoteAdmin, adminFlags, "--allow-remote-admin")
	return err
}

// NewRegistry returns a fresh metrics registry holding the Go runtime and process collectors. Each daemon
// has its own, so that two daemons in one process (as in tests) do not collide.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
