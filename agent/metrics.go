package agent

import (
	"errors"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	commonmetrics "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/common/metrics"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// Metric names follow upstream's proxy-agent (konnectivity_network_proxy_agent_*), so dashboards and alerts
// written for it keep working; konnect_agent_* are konnect's additions.
const (
	metricsNamespace = "konnectivity_network_proxy"
	metricsSubsystem = "agent"

	// UpstreamLeaseMetricsPrefix names the families that upstream's lease informer (--count-server-leases)
	// keeps in prometheus' default registry: lease_lists_total, lease_watches_total and
	// lease_list_latency_seconds.
	UpstreamLeaseMetricsPrefix = metricsNamespace + "_" + metricsSubsystem + "_lease_"
)

type metrics struct {
	dialLatency     prometheus.Histogram
	dialFailures    *prometheus.CounterVec
	serverConns     prometheus.Gauge
	knownServers    prometheus.Gauge
	endpointConns   prometheus.Gauge
	streamPackets   *prometheus.CounterVec
	streamErrors    *prometheus.CounterVec
	serverFailures  *prometheus.CounterVec
	bytes           *prometheus.CounterVec
	overflows       prometheus.Counter
	connectFailures *prometheus.CounterVec
	controlDropped  prometheus.Counter
	flowViolations  *prometheus.CounterVec
	creditWait      prometheus.Counter
	serverStreams   *prometheus.GaugeVec
	dataToServer    prometheus.Counter
	dataFromServer  prometheus.Counter
	bytesToServer   prometheus.Counter
	bytesFromServer prometheus.Counter
}

// Dial failure reasons, as upstream labels them plus konnect's "not_allowed".
const (
	dialFailureTimeout    = "timeout"
	dialFailureUnknown    = "unknown"
	dialFailureNotAllowed = "not_allowed"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		dialLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "dial_duration_seconds",
			Help:    "Latency of dial to the remote endpoint in seconds",
			Buckets: []float64{0.005, 0.025, 0.1, 0.5, 2.5, 10, 30},
		}),
		dialFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "endpoint_dial_failure_total",
			Help: "Number of failures dialing the remote endpoint, by reason (timeout, unknown, not_allowed).",
		}, []string{"reason"}),
		serverConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "open_server_connections",
			Help: "Current number of open server connections.",
		}),
		knownServers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "known_server_count",
			Help: "Current number of servers agent is trying to connect to.",
		}),
		endpointConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "open_endpoint_connections",
			Help: "Current number of open endpoint connections.",
		}),
		streamPackets: commonmetrics.MakeStreamPacketsTotalMetric(metricsNamespace, metricsSubsystem),
		streamErrors:  commonmetrics.MakeStreamErrorsTotalMetric(metricsNamespace, metricsSubsystem),
		// Deprecated upstream in favour of stream_errors_total, and still exported there: alerts use it.
		serverFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "server_connection_failure_count",
			Help: "Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total",
		}, []string{"direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "konnect_agent_data_bytes_total",
			Help: "Payload bytes carried for tunnelled connections, by direction (to_server: read from backends; from_server: written to backends).",
		}, []string{"direction"}),
		overflows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "konnect_agent_connection_overflow_total",
			Help: "Connections closed because their backend read nothing for --connection-stall-timeout with a full queue.",
		}),
		connectFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "konnect_agent_server_connect_failures_total",
			Help: "Failed attempts to open a stream to a server, by server address.",
		}, []string{"address"}),
		controlDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "konnect_agent_control_replies_dropped_total",
			Help: "Control replies (CLOSE_RSP, refused DIAL_RSP, DRAIN) dropped because a server did not read them and the queue was full.",
		}),
		flowViolations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "konnect_agent_flow_control_violations_total",
			Help: "Connections (or, for a malformed grant, server streams) closed because a server broke flow control, by reason (window_exceeded, credit_overflow, malformed).",
		}, []string{"reason"}),
		creditWait: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "konnect_agent_flow_credit_wait_seconds_total",
			Help: "Time connections spent unread because the server had granted no credit, summed over connections: a slow reader's, or windows too small for the path (--flow-control-max-window-bytes).",
		}),
		serverStreams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "konnect_agent_server_streams",
			Help: "Streams open to servers, by flow control: v1, or none (upstream's or an older server, or --flow-control=false), whose connections share the stream's pace as with upstream.",
		}, []string{"flow_control"}),
	}
	m.dataToServer = m.streamPackets.WithLabelValues(string(commonmetrics.SegmentFromAgent), client.PacketType_DATA.String())
	m.dataFromServer = m.streamPackets.WithLabelValues(string(commonmetrics.SegmentToAgent), client.PacketType_DATA.String())
	m.bytesToServer = m.bytes.WithLabelValues("to_server")
	m.bytesFromServer = m.bytes.WithLabelValues("from_server")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.dialLatency, m.dialFailures, m.serverConns, m.knownServers,
		m.endpointConns, m.streamPackets, m.streamErrors, m.serverFailures, m.bytes, m.overflows, m.connectFailures, m.controlDropped,
		m.flowViolations, m.creditWait, m.serverStreams} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) packetSent(t client.PacketType) {
	if t == client.PacketType_DATA {
		m.dataToServer.Inc()
		return
	}
	commonmetrics.ObservePacket(m.streamPackets, commonmetrics.SegmentFromAgent, t)
}

func (m *metrics) packetReceived(t client.PacketType) {
	if t == client.PacketType_DATA {
		m.dataFromServer.Inc()
		return
	}
	commonmetrics.ObservePacket(m.streamPackets, commonmetrics.SegmentToAgent, t)
}

func (m *metrics) sendError(err error, t client.PacketType) {
	if !errors.Is(err, io.EOF) {
		m.serverFailures.WithLabelValues("to_server").Inc()
	}
	commonmetrics.ObserveStreamError(m.streamErrors, commonmetrics.SegmentFromAgent, err, t)
}

func (m *metrics) recvError(err error) {
	m.serverFailures.WithLabelValues("from_server").Inc()
	commonmetrics.ObserveStreamErrorNoPacket(m.streamErrors, commonmetrics.SegmentToAgent, err)
}

func (m *metrics) dialed(d time.Duration) { m.dialLatency.Observe(d.Seconds()) }

// Reasons of konnect_agent_flow_control_violations_total.
const (
	flowWindowExceeded = "window_exceeded"
	flowCreditOverflow = "credit_overflow"
	flowMalformed      = "malformed"
)

func (m *metrics) flowViolation(reason string) { m.flowViolations.WithLabelValues(reason).Inc() }
