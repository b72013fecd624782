package konnectivity

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// UpstreamMetrics gathers the metric families whose names start with prefix from prometheus' default
// registry. Upstream's libraries that konnect runs (the ProxyServer at the heart of every server, the
// agent's lease informer) register their metrics there when their package loads, and export neither the
// collectors nor a way to register them elsewhere, so the default registry is the only place to read them
// from. Keeping only prefix keeps the rest of it (Go and process collectors, the other daemon's families)
// from showing up twice or colliding with a daemon's own registry. The families are process-wide, as
// upstream's package state is.
func UpstreamMetrics(prefix string) prometheus.Gatherer {
	return upstreamGatherer(prefix)
}

type upstreamGatherer string

func (prefix upstreamGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	out := mfs[:0]
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), string(prefix)) {
			out = append(out, mf)
		}
	}
	return out, err
}
