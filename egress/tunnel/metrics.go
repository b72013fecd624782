package tunnel

import (
	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/prometheus/client_golang/prometheus"
	servermetrics "sigs.k8s.io/apiserver-network-proxy/pkg/server/metrics"
)

// metrics are konnect's own tunnel metrics, next to upstream's konnectivity_network_proxy_server_*. Each
// Server has its own set, registered on Config.Registerer.
type metrics struct {
	queuedBytes    prometheus.Gauge
	stalledWaits   prometheus.Counter
	stalledClosed  prometheus.Counter
	chunkedPackets prometheus.Counter
	mergedPackets  prometheus.Counter
	pendingDials   prometheus.Gauge
	dialTimeouts   prometheus.Counter
	dialsRefused   prometheus.Counter
	flowViolations *prometheus.CounterVec
	creditWait     prometheus.Counter
	agentStreams   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		queuedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "frontend_queued_bytes",
			Help: "Bytes from agents waiting in per-connection frontend queues.",
		}),
		stalledWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "frontend_full_waits_total",
			Help: "Times an agent stream waited for a full frontend queue.",
		}),
		stalledClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "frontend_stalled_closed_total",
			Help: "Frontend connections closed because their reader stalled (ANP issue 180).",
		}),
		chunkedPackets: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "data_packets_split_total",
			Help: "DATA packets split because they exceeded the chunk size.",
		}),
		mergedPackets: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "data_packets_merged_total",
			Help: "Small DATA packets combined into larger frontend messages.",
		}),
		pendingDials: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "pending_dials",
			Help: "Dials from the frontend waiting for an agent's DIAL_RSP (bounded by --max-pending-dials).",
		}),
		dialTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "dial_timeouts_total",
			Help: "Dials failed because no agent answered within --backend-dial-timeout.",
		}),
		dialsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "pending_dials_refused_total",
			Help: "Dials refused because --max-pending-dials dials were already pending.",
		}),
		flowViolations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "flow_control_violations_total",
			Help: "Tunnels (or, for a malformed grant, agent streams) closed because an agent broke flow control, by reason (window_exceeded, credit_overflow, malformed).",
		}, []string{"reason"}),
		creditWait: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "flow_credit_wait_seconds_total",
			Help: "Time tunnels spent with data from kube-apiserver and no credit from the agent, summed over tunnels: a slow backend's, or windows too small for the path.",
		}),
		agentStreams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "konnect", Subsystem: "tunnel_server", Name: "agent_streams",
			Help: "Agent streams connected, by flow control: v1, or none (an upstream or older agent, one offering only versions this server does not know, or --flow-control=false), whose connections share the stream's pace as with upstream.",
		}, []string{"flow_control"}),
	}
	// Both series exist from the start, so that a dashboard reads 0 rather than nothing.
	m.agentStreams.WithLabelValues(flow.Version)
	m.agentStreams.WithLabelValues(flow.None)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.queuedBytes, m.stalledWaits, m.stalledClosed, m.chunkedPackets, m.mergedPackets,
		m.pendingDials, m.dialTimeouts, m.dialsRefused, m.flowViolations, m.creditWait, m.agentStreams} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// UpstreamMetrics gathers upstream's konnectivity_network_proxy_server_* metrics, which the ProxyServer at
// the heart of every Server updates in prometheus' default registry.
func UpstreamMetrics() prometheus.Gatherer {
	return konnectivity.UpstreamMetrics(servermetrics.Namespace + "_" + servermetrics.Subsystem + "_")
}
