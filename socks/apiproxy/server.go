package apiproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/socks/internal/localproxy"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// Timeouts of the local listener. There is deliberately no read or write timeout on whole requests: a
// watch or an exec session lasts as long as the user wants it to.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultShutdownGrace     = 5 * time.Second
	DefaultMaxConnections    = 1024
	maxHeaderBytes           = 1 << 20
)

// Config is everything New needs.
type Config struct {
	HandlerConfig

	// Listener is where the proxy serves, bound by the caller (the command decides which addresses are
	// allowed). New takes it over: Run closes it.
	Listener net.Listener

	// MaxConnections caps open client connections (0 means DefaultMaxConnections); a connection over the cap
	// gets a 503 and is closed.
	MaxConnections int
	// ReadHeaderTimeout cuts off clients that trickle their request headers (0 means the default).
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes idle keep-alive connections (0 means the default).
	IdleTimeout time.Duration
	// ShutdownGrace bounds how long Run lets requests in flight finish once its context ends; 0 closes them
	// at once. Watches, log follows and upgraded connections are closed at once in any case.
	ShutdownGrace time.Duration
	// Registerer receives the proxy's metrics (konnect_proxy_*); nil means none are kept, and requests
	// pass through no instrumentation.
	Registerer prometheus.Registerer
}

// Server is a running proxy: its listener is bound, and Run serves it.
type Server struct {
	cfg     Config
	ln      net.Listener
	handler *Handler
	metrics *metrics // nil: none kept

	// streams is cancelled when shutdown starts: long-running requests end then.
	streams       context.Context
	cancelStreams context.CancelFunc

	mu       sync.Mutex
	inflight sync.WaitGroup
	stopped  bool
	ran      bool
}

// New builds the handler, so that a bad kubeconfig is an error here and not a log line later. On an error
// the listener stays the caller's to close.
func New(cfg Config) (*Server, error) {
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.ReadHeaderTimeout == 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Listener == nil {
		return nil, errors.New("apiproxy: no listener")
	}
	h, err := NewHandler(cfg.HandlerConfig)
	if err != nil {
		return nil, err
	}
	ln := &cappedListener{Listener: cfg.Listener, limit: localproxy.NewConnLimit(cfg.MaxConnections)}
	s := &Server{cfg: cfg, ln: ln, handler: h}
	if cfg.Registerer != nil {
		if s.metrics, err = newMetrics(cfg.Registerer, ln.limit); err != nil {
			return nil, err
		}
		ln.refused = s.metrics.refusedConns.Inc
	}
	s.streams, s.cancelStreams = context.WithCancel(context.Background())
	return s, nil
}

// Probe reports whether the API server answers, as Handler.Probe does.
func (s *Server) Probe(ctx context.Context) error { return s.handler.Probe(ctx) }

// Addr is the bound address, with the port chosen by the system when the configured port was 0.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Run serves until ctx ends, then stops accepting, ends long-running requests, and gives the others
// ShutdownGrace to finish before closing what is left. It returns nil after a shutdown that ctx asked for,
// and only once every request handler has returned. A Server runs once.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New("apiproxy: Run called twice")
	}
	s.ran = true
	s.mu.Unlock()

	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	h := s.track(s.handler)
	if s.metrics != nil {
		h = s.metrics.instrument(h)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          klog.NewStandardLogger("INFO"),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.ln) }()

	var err error
	select {
	case err = <-errc:
		// The listener failed on its own.
	case <-ctx.Done():
	}
	s.cancelStreams()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownGrace)
	if serr := srv.Shutdown(sctx); serr != nil {
		klog.InfoS("Requests still in flight after the grace period; closing them", "grace", s.cfg.ShutdownGrace)
	}
	cancel()
	cancelBase()
	_ = srv.Close()
	if err == nil {
		err = <-errc
	}

	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.inflight.Wait()
	s.handler.CloseIdleConnections()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("apiproxy: serve %s: %w", s.ln.Addr(), err)
}

// track counts handlers in flight, so that Run returns only after all of them, and ties long-running
// requests to the streams context.
func (s *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			writeStatus(w, http.StatusServiceUnavailable, "konnect proxy is shutting down")
			return
		}
		s.inflight.Add(1)
		s.mu.Unlock()
		defer s.inflight.Done()
		if longRunning(r) {
			ctx, cancel := context.WithCancel(r.Context())
			stop := context.AfterFunc(s.streams, cancel)
			defer func() {
				stop()
				cancel()
			}()
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

// longRunning reports whether a request may stay open indefinitely: watches, followed logs, and protocol
// upgrades. A false positive only means the request is cut at the start of a shutdown rather than at the
// end of the grace period.
func longRunning(r *http.Request) bool {
	if r.Header.Get("Upgrade") != "" || strings.Contains(r.URL.Path, "/watch/") {
		return true
	}
	q := r.URL.RawQuery
	return strings.Contains(q, "watch=") || strings.Contains(q, "follow=")
}

// cappedListener refuses connections beyond a limit with a short 503, so that a client opening
// connections without end gets a clear answer and the proxy keeps its file descriptors.
type cappedListener struct {
	net.Listener
	limit   *localproxy.ConnLimit
	refused func() // counts a refusal; nil when the proxy keeps no metrics
}

// tooManyConnections is the whole answer, written before any request is read; its body is a Status as
// writeStatus's are.
var tooManyConnections = func() []byte {
	body := statusBody(http.StatusServiceUnavailable, "konnect proxy: too many connections; try later")
	return append(fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"+
		"Connection: close\r\nContent-Length: %d\r\n\r\n", len(body)), body...)
}()

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.limit.TryAcquire() {
			return &slotConn{Conn: c, release: l.limit.Release}, nil
		}
		klog.V(2).InfoS("Connection refused: too many connections", "remote", c.RemoteAddr(), "max", l.limit.Max())
		if l.refused != nil {
			l.refused()
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(tooManyConnections)
		_ = c.Close()
	}
}

type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
