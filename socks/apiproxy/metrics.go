package apiproxy

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's own: what clients asked for and got, and how its connection cap is doing.
type metrics struct {
	requests      *prometheus.CounterVec
	headerLatency prometheus.Histogram
	inFlight      prometheus.Gauge
	refusedConns  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, limit interface{ Active() int }) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "konnect_proxy_requests_total",
			Help: "Requests answered, by HTTP status code (101 for exec, attach and port-forward upgrades; 403 for " +
				"requests the filter refused; 502 when the API server could not be reached) and method.",
		}, []string{"code", "method"}),
		headerLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "konnect_proxy_response_header_seconds",
			Help: "Time from a request's arrival until its response headers: the API server's latency plus the " +
				"proxy's, also for watches and upgrades, whose bodies last as long as the client wants.",
			Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10, 30},
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "konnect_proxy_requests_in_flight",
			Help: "Requests being served, watches and upgraded connections included.",
		}),
		refusedConns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "konnect_proxy_refused_connections_total",
			Help: "Client connections refused with 503 because --max-connections were open.",
		}),
	}
	clientConns := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "konnect_proxy_client_connections",
		Help: "Client connections open, counted against --max-connections.",
	}, func() float64 { return float64(limit.Active()) })
	for _, c := range []prometheus.Collector{m.requests, m.headerLatency, m.inFlight, m.refusedConns, clientConns} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// instrument counts next's requests by the status each was answered with.
func (m *metrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.inFlight.Inc()
		defer m.inFlight.Dec()
		rec := &statusRecorder{ResponseWriter: w, start: time.Now(), observe: m.headerLatency.Observe}
		next.ServeHTTP(rec, r)
		rec.headers(http.StatusOK) // a handler that wrote nothing answered 200
		m.requests.WithLabelValues(strconv.Itoa(rec.code), method(r.Method)).Inc()
	})
}

// method keeps the label's values few: a client may send any token as its method.
func method(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return m
	}
	return "OTHER"
}

// statusRecorder notes the status of a response and when its headers went out. ReverseProxy reaches Flush
// through Unwrap (http.ResponseController), and an upgrade through Hijack, which answers 101 on the raw
// connection.
type statusRecorder struct {
	http.ResponseWriter
	code    int
	start   time.Time
	observe func(float64)
}

func (s *statusRecorder) headers(code int) {
	if s.code == 0 {
		s.code = code
		s.observe(time.Since(s.start).Seconds())
	}
}

func (s *statusRecorder) WriteHeader(code int) {
	if code >= 200 { // 1xx responses are informational; the final status follows
		s.headers(code)
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.headers(http.StatusOK)
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		s.headers(http.StatusSwitchingProtocols)
	}
	return c, rw, err
}
