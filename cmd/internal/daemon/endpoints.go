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
	rejected            *prometheus.CounterVec // RegisterMetrics; nil: not counted
}

// AddTo adds a part to g for each bound endpoint. Added first, they stop last: probes see /readyz fail
// while the daemon drains, and an endpoint that fails stops the daemon rather than leave it unobservable.
func (e *Endpoints) AddTo(g *Group) {
	if e.Health != nil {
		g.Add("health endpoint", func(ctx context.Context) error {
			return serveLimited(ctx, e.limit(e.Health, "health"), e.HealthMux)
		})
	}
	if e.Admin != nil {
		g.Add("admin endpoint", func(ctx context.Context) error {
			return serveLimited(ctx, e.limit(e.Admin, "admin"), e.AdminMux)
		})
	}
}

// RejectedConnsMetric counts, for each port ("health", which serves /metrics too, or "admin") and reason,
// the connections that the bound on connections per source (MaxConnsPerSource) cut: "evicted", a
// connection with no request being served, closed to make room for a new one from its source; "refused",
// a new one reset because every connection of its source was being served.
const RejectedConnsMetric = "konnect_endpoint_connections_rejected_total"

// RegisterMetrics exports RejectedConnsMetric{port,reason} on reg, the daemon's registry, each series of a
// bound endpoint from 0. Call it once the endpoints are bound, before Run.
func (e *Endpoints) RegisterMetrics(reg prometheus.Registerer) error {
	e.rejected = newRejectedConns()
	for port, ln := range map[string]net.Listener{"health": e.Health, "admin": e.Admin} {
		if ln != nil {
			e.rejected.WithLabelValues(port, "evicted")
			e.rejected.WithLabelValues(port, "refused")
		}
	}
	return reg.Register(e.rejected)
}

func newRejectedConns() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: RejectedConnsMetric,
		Help: "Connections to the health or admin port cut by the bound on connections from one source address: " +
			"evicted (one with no request being served, closed for a new one) or refused (the new one, reset " +
			"while every connection of its source was being served).",
	}, []string{"port", "reason"})
}

// limit is ln bounded per source as Serve bounds it, counting into rejected under port.
func (e *Endpoints) limit(ln net.Listener, port string) *SourceLimit {
	return countRejections(LimitPerSource(ln, MaxConnsPerSource), e.rejected, port)
}

// countRejections makes l count its evictions and refusals into rejected (if not nil) under port.
func countRejections(l *SourceLimit, rejected *prometheus.CounterVec, port string) *SourceLimit {
	if rejected != nil {
		l.Evicted = rejected.WithLabelValues(port, "evicted")
		l.Refused = rejected.WithLabelValues(port, "refused")
	}
	return l
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
