package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apiserver/pkg/server/healthz"
)

// Timeouts for the health, metrics and admin endpoints. They are small, plain request/response endpoints, so a
// client that trickles its headers (slowloris) or idles is cut off quickly.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second
	WriteTimeout      = 60 * time.Second // pprof profiles run for up to 30 s by default
	IdleTimeout       = 60 * time.Second
	MaxHeaderBytes    = 64 << 10
	ShutdownGrace     = 5 * time.Second
)

// NewHealthMux serves /livez, /readyz and /healthz (with ?verbose, ?exclude=NAME and /livez/NAME,
// /readyz/NAME for each check, in the format kube-apiserver uses) and /metrics from gatherer, the daemon's
// own registry (NewRegistry). A request from loopback also sees why a check failed (reasonsOnLoopback).
func NewHealthMux(live, ready []healthz.HealthChecker, gatherer prometheus.Gatherer) *http.ServeMux {
	// ping keeps /livez meaningful for a daemon that has no liveness check of its own.
	live = recordReasons(append([]healthz.HealthChecker{healthz.PingHealthz}, live...))
	ready = recordReasons(append([]healthz.HealthChecker{healthz.PingHealthz}, ready...))
	checks := http.NewServeMux()
	healthz.InstallLivezHandler(checks, live...)
	healthz.InstallReadyzHandler(checks, ready...)
	// /healthz reports liveness, as upstream proxy-server's and proxy-agent's do: their manifests point
	// livenessProbes at it, and a server restarted whenever kube-apiserver cannot answer a TokenReview, or an
	// agent whenever one server is down, would drop every open tunnel.
	healthz.InstallHandler(checks, live...)
	mux := http.NewServeMux()
	for _, path := range []string{"/livez", "/readyz", "/healthz"} {
		mux.Handle(path, reasonsOnLoopback(checks))
		mux.Handle(path+"/", checks) // /readyz/NAME names the reason to everyone, as upstream's does
	}
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
}

// NewAdminMux returns the admin port's mux: pprof with profiling (upstream's --enable-profiling), and with
// contention also block and mutex profiles (--enable-contention-profiling). Bind it only on loopback:
// profiles reveal memory contents.
func NewAdminMux(profiling, contention bool) *http.ServeMux {
	mux := http.NewServeMux()
	if !profiling {
		return mux
	}
	if contention {
		runtime.SetBlockProfileRate(1)
		runtime.SetMutexProfileFraction(1)
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// NewHTTPServer returns an http.Server with konnect's timeouts for small request/response endpoints.
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Serve serves h on ln, at most MaxConnsPerSource connections from one source at once (past it, a new
// one takes the place of the source's oldest connection with no request being served), until ctx ends.
// Then it closes the connections with no request being served, waits for the requests being served within
// ShutdownGrace and closes what is left. It returns nil after a shutdown that ctx asked for. It counts
// nothing: Endpoints serves a daemon's ports the same way and counts what the bound cuts (RegisterMetrics).
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	return serveLimited(ctx, LimitPerSource(ln, MaxConnsPerSource), h)
}

// serveLimited is Serve on a listener that limit already bounds per source; tests look into limit.
func serveLimited(ctx context.Context, limit *SourceLimit, h http.Handler) error {
	srv := NewHTTPServer(h)
	srv.ConnState = limit.ConnState
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(limit) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownGrace)
	defer cancel()
	limit.closeWaiting() // Shutdown waits only for requests being served
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
