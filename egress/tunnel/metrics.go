package tunnel

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// konnect's own tunnel metrics, next to upstream's konnectivity_network_proxy_server_* (which upstream
// registers on the default registry when its server package loads).
var (
	queuedBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "konnect", Subsystem: "tunnel_server", Name: "frontend_queued_bytes",
		Help: "Bytes from agents waiting in per-connection frontend queues.",
	})
	stalledWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "konnect", Subsystem: "tunnel_server", Name: "frontend_full_waits_total",
		Help: "Times an agent stream waited for a full frontend queue.",
	})
	stalledClosed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "konnect", Subsystem: "tunnel_server", Name: "frontend_stalled_closed_total",
		Help: "Frontend connections closed because their reader stalled (ANP issue 180).",
	})
	chunkedPackets = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "konnect", Subsystem: "tunnel_server", Name: "data_packets_split_total",
		Help: "DATA packets split because they exceeded the chunk size.",
	})
	mergedPackets = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "konnect", Subsystem: "tunnel_server", Name: "data_packets_merged_total",
		Help: "Small DATA packets combined into larger frontend messages.",
	})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		for _, c := range []prometheus.Collector{queuedBytes, stalledWaits, stalledClosed, chunkedPackets, mergedPackets} {
			// Another instance in the same process may have registered already; that is fine.
			_ = prometheus.DefaultRegisterer.Register(c)
		}
	})
}
