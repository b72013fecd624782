package tunnel

import "github.com/prometheus/client_golang/prometheus"

// authMetrics count what the server does with peers before they authenticate (admission.go) and with agents'
// tokens (auth.go), next to the tunnel's metrics (metrics.go).
type authMetrics struct {
	unauthenticated *prometheus.GaugeVec   // listener
	connsRefused    *prometheus.CounterVec // listener
	acceptWaits     *prometheus.CounterVec // listener
	connsExpired    *prometheus.CounterVec // listener, stage
	authRefused     *prometheus.CounterVec // reason
	reviews         *prometheus.CounterVec // result
	cacheHits       *prometheus.CounterVec // result
	reviewsWaiting  prometheus.Gauge
	reviewsInFlight prometheus.Gauge
	reviewDuration  prometheus.Histogram
	readinessReview *prometheus.CounterVec // result
	identsDropped   *prometheus.CounterVec // reason
}

func newAuthMetrics(reg prometheus.Registerer) (*authMetrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "konnect", Subsystem: "tunnel_server", Name: name, Help: help}
	}
	m := &authMetrics{
		unauthenticated: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("unauthenticated_connections",
			"Connections accepted that have not authenticated yet (agent port: no Connect stream accepted; frontend: TLS handshake not done).")),
			[]string{"listener"}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts(opts("unauthenticated_connections_refused_total",
			"Connections reset at once because too many from their source were unauthenticated.")),
			[]string{"listener"}),
		acceptWaits: prometheus.NewCounterVec(prometheus.CounterOpts(opts("unauthenticated_connections_accept_waits_total",
			"Times the listener stopped accepting until a slot freed, because the bound on unauthenticated connections in all was reached.")),
			[]string{"listener"}),
		connsExpired: prometheus.NewCounterVec(prometheus.CounterOpts(opts("unauthenticated_connections_timed_out_total",
			"Connections closed because they did not complete the TLS handshake (stage handshake, 5 s) or authenticate (stage auth, --agent-auth-timeout on the agent port) in time.")),
			[]string{"listener", "stage"}),
		authRefused: prometheus.NewCounterVec(prometheus.CounterOpts(opts("agent_auth_refused_total",
			"Agent Connect streams refused without a TokenReview: no token (no-token), a second stream on a connection that is authenticating or already tried (stream), a source whose tokens were rejected lately (source-backoff), or every waiter gone before the review could start (abandoned).")),
			[]string{"reason"}),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts(opts("agent_token_reviews_total",
			"TokenReviews sent to kube-apiserver for agents' tokens, by result (authenticated, rejected, error: no answer).")),
			[]string{"result"}),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts(opts("agent_token_review_cache_hits_total",
			"Agent tokens answered from memory without a TokenReview: a recent success (authenticated) or a recent rejection (rejected).")),
			[]string{"result"}),
		reviewsWaiting: prometheus.NewGauge(prometheus.GaugeOpts(opts("agent_token_reviews_waiting",
			"Agent TokenReviews waiting for a slot (--max-concurrent-token-reviews)."))),
		reviewsInFlight: prometheus.NewGauge(prometheus.GaugeOpts(opts("agent_token_reviews_in_flight",
			"Agent TokenReviews sent and not answered yet."))),
		reviewDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "konnect", Subsystem: "tunnel_server",
			Name: "agent_token_review_duration_seconds", Help: "How long kube-apiserver took to answer an agent TokenReview.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8)}),
		readinessReview: prometheus.NewCounterVec(prometheus.CounterOpts(opts("readiness_token_reviews_total",
			"TokenReviews sent by /readyz (with their own client and rate budget), by result (ok, error).")),
			[]string{"result"}),
		identsDropped: prometheus.NewCounterVec(prometheus.CounterOpts(opts("agent_identifiers_dropped_total",
			"Agent identifiers the server did not route by, in token mode: a host, ipv4 or ipv6 that is none of the addresses of the node of the agent's token (not-node-address), any cidr or default-route, another type (other-type); unverified counts agent streams whose identifiers were taken as claimed because the TokenReview named no node or the node could not be read.")),
			[]string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.unauthenticated, m.connsRefused, m.acceptWaits, m.connsExpired, m.authRefused, m.reviews,
		m.cacheHits, m.reviewsWaiting, m.reviewsInFlight, m.reviewDuration, m.readinessReview, m.identsDropped} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
