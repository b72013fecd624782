package apiproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/socks/internal/localproxy"
	"golang.org/x/net/http/httpguts"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/klog/v2"
)

// DialFunc dials the API server, for example through an SSH connection.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// HandlerConfig says where requests go and which of them may go there.
type HandlerConfig struct {
	// REST is the API server and the credentials to reach it with, as loaded from a kubeconfig: client
	// certificates, tokens, exec and auth-provider plugins, proxy-url. It is not modified.
	REST *rest.Config
	// APIPrefix is the local path under which the API is served; it starts and ends with "/". As with
	// kubectl, a prefix that does not start with "/api" is stripped before the request is forwarded.
	APIPrefix string
	// StaticDir, when set, is served as files under StaticPrefix (which starts and ends with "/").
	StaticDir    string
	StaticPrefix string
	// Filter guards the API (not the static files). Nil serves every request, as --disable-filter does.
	Filter *Filter
	// AppendServerPath prefixes every forwarded path with the path of the kubeconfig's server URL.
	AppendServerPath bool
	// Dial, when set, dials every connection to the API server (and any proxy-url and the environment's
	// proxy settings are then ignored: the dialer decides the route).
	Dial DialFunc
	// Keepalive is the TCP keep-alive period of connections to the API server: 0 means 30s, as client-go
	// uses, and a negative value turns keep-alives off.
	Keepalive time.Duration
	// HTTP2 speaks HTTP/2 to the API server for plain requests, over one connection. HTTP/1.1 with a pool of
	// connections is the default because it costs the API server less CPU per request; protocol upgrades
	// always use HTTP/1.1.
	HTTP2 bool
}

// Backend connection pool limits. MaxIdleConnsPerHost is large because every concurrent client request
// needs its own HTTP/1.1 connection; client-go's 25 would make a burst of 50 clients redial (and redo TLS).
const (
	maxIdleConnsPerHost = 256
	idleConnTimeout     = 90 * time.Second
	tlsHandshakeTimeout = 10 * time.Second
	dialTimeout         = 30 * time.Second
	defaultKeepalive    = 30 * time.Second
	copyBufferSize      = 32 << 10
)

// Handler is the proxy's whole HTTP handler: the API under APIPrefix (filtered), and static files under
// StaticPrefix when StaticDir is set.
type Handler struct {
	mux        *http.ServeMux
	transports []*http.Transport
	// target and backend are where and how the API is reached; Probe uses them too.
	target  *url.URL
	backend http.RoundTripper
	// failures rate-limits the log lines of failed requests, as konnect socks does.
	failures localproxy.FailureLog
}

// NewHandler builds the handler and its connections' configuration; it dials nothing yet.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	if cfg.REST == nil {
		return nil, errors.New("apiproxy: no API server configuration")
	}
	for _, p := range []struct{ field, v string }{{"APIPrefix", cfg.APIPrefix}, {"StaticPrefix", cfg.StaticPrefix}} {
		if p.field == "StaticPrefix" && cfg.StaticDir == "" {
			continue
		}
		if err := checkPrefix(p.v); err != nil {
			return nil, field.Wrap(p.field, err)
		}
	}
	if cfg.StaticDir != "" && cfg.StaticPrefix == cfg.APIPrefix {
		return nil, field.Errorf("{StaticPrefix}: %q is also the API prefix ({APIPrefix})", cfg.StaticPrefix)
	}
	h := &Handler{mux: http.NewServeMux()}
	h.failures.Logger = klog.NewKlogr()
	api, err := h.newAPIHandler(cfg)
	if err != nil {
		return nil, err
	}
	h.mux.Handle(cfg.APIPrefix, api)
	if cfg.StaticDir != "" {
		h.mux.Handle(cfg.StaticPrefix, http.StripPrefix(cfg.StaticPrefix, http.FileServer(http.Dir(cfg.StaticDir))))
	}
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// CloseIdleConnections closes the idle connections to the API server; a server that stops calls it so
// that nothing is left behind.
func (h *Handler) CloseIdleConnections() {
	for _, t := range h.transports {
		t.CloseIdleConnections()
	}
}

// Probe asks the API server for its /readyz with the kubeconfig's credentials, over the same connections as
// the requests it proxies, and returns nil if it answered 200. The error says what failed: the connection,
// the credentials (401, 403) or the API server's own readiness.
func (h *Handler) Probe(ctx context.Context) error {
	u := *h.target
	u.Path = strings.TrimSuffix(u.Path, "/") + "/readyz"
	u.RawPath = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := h.backend.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("the API server at %s: %w", h.target.Host, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so that the connection is reused
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the API server at %s answered %s to GET %s", h.target.Host, resp.Status, u.Path)
	}
	return nil
}

// checkPrefix refuses what http.ServeMux would read as something other than a plain path prefix (a host,
// a method, a {wildcard}) instead of panicking on it.
func checkPrefix(p string) error {
	if !strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/") {
		return fmt.Errorf("%q must start and end with /", p)
	}
	if strings.ContainsAny(p, "{} \t\r\n") {
		return fmt.Errorf("%q may not contain braces or white space", p)
	}
	return nil
}

// newAPIHandler builds the filtered reverse proxy to the API server.
func (h *Handler) newAPIHandler(cfg HandlerConfig) (http.Handler, error) {
	// client-go's own reading of the server field, which also takes a bare host:port.
	base := rest.CopyConfig(cfg.REST)
	base.APIPath, base.GroupVersion = "", nil
	target, _, err := rest.DefaultServerUrlFor(base)
	if err != nil {
		// Both errors client-go gives here quote the server's URL, and so a password in it.
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, field.Errorf("the API server's URL (the kubeconfig's server, or {REST.Host}) is not valid: %w", ue.Err)
		}
		return nil, field.Errorf("the API server's URL (the kubeconfig's server, or {REST.Host}) must be a URL with a scheme, or a host:port pair")
	}
	if !cfg.AppendServerPath {
		target.Path, target.RawPath = "", ""
	}
	target.RawQuery, target.Fragment = "", ""

	rt, err := h.newBackendTransport(cfg)
	if err != nil {
		return nil, err
	}
	h.target, h.backend = target, rt
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// As the client sent it: ReverseProxy has already dropped parameters it cannot parse (a ";" in a
			// label selector, a stray "%"), which kubectl proxy forwards and the backend may well accept.
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
			// The API server records X-Forwarded-For in its audit log. Only the address this proxy saw is
			// sent, so that a local client cannot write someone else's address there.
			if host, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
				pr.Out.Header.Set("X-Forwarded-For", host)
			}
		},
		Transport: rt,
		// Responses of unknown length (watches, logs -f) are flushed at once by ReverseProxy itself; the
		// others are complete documents that need no timed flushes.
		FlushInterval: 0,
		BufferPool:    newBufferPool(copyBufferSize),
		ErrorHandler:  h.proxyError,
		ErrorLog:      klog.NewStandardLogger("WARNING"),
	}
	var api http.Handler = rp
	if cfg.Filter != nil {
		api = cfg.Filter.Wrap(api)
	}
	if !strings.HasPrefix(cfg.APIPrefix, "/api") {
		api = stripPrefixKeepSlash(cfg.APIPrefix, api)
	}
	return api, nil
}

// proxyError answers a request that could not be forwarded, as konnect socks answers one: 503 when a hop
// of the dialer's route is down (with --via, the SSH server), 504 when the API server did not answer in
// time, else 502 (the API server refused, as the SSH server reports it with --via). The body is a Status
// whose message is the error, which names the hop. Failures are logged at the default level, rate-limited. A client that went away is
// not an error.
func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		klog.V(4).InfoS("Client went away", "method", r.Method, "path", r.URL.Path, "err", err)
		return
	}
	code := localproxy.HTTPStatus(err)
	h.failures.Log("Proxying to the API server failed", "method", r.Method, "path", r.URL.Path, "answer", code, "err", err)
	writeStatus(w, code, "konnect proxy: "+err.Error())
}

// stripPrefixKeepSlash is http.StripPrefix that leaves the path starting with "/", so that the filter's
// patterns (which start with "^/api") apply to what is forwarded. A path outside the prefix is 404. The
// escaped form of the path is kept, so that "a%2Fb" reaches the API server as sent (only with the filter
// off: the filter refuses an encoded slash, see RoutedPath).
func stripPrefixKeepSlash(prefix string, h http.Handler) http.Handler {
	if prefix == "/" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			writeStatus(w, http.StatusNotFound, fmt.Sprintf("konnect proxy: %s is not under the API prefix %s", r.URL.Path, prefix))
			return
		}
		rp, rok := strings.CutPrefix(r.URL.RawPath, prefix)
		if !rok {
			rp = ""
		}
		r2 := new(http.Request)
		*r2 = *r
		r2.URL = new(url.URL)
		*r2.URL = *r.URL
		r2.URL.Path, r2.URL.RawPath = withLeadingSlash(p), ""
		if rp != "" {
			r2.URL.RawPath = withLeadingSlash(rp)
		}
		h.ServeHTTP(w, r2)
	})
}

func withLeadingSlash(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	return "/" + p
}

// newBackendTransport builds the round tripper to the API server from client-go's own pieces (TLS
// configuration and authentication wrappers), the way kubectl builds its upgrade transport, but with a pool
// sized for a proxy. Upgrade requests go over a separate HTTP/1.1-only transport: SPDY and WebSocket cannot
// be carried over HTTP/2.
func (h *Handler) newBackendTransport(cfg HandlerConfig) (http.RoundTripper, error) {
	rc := rest.CopyConfig(cfg.REST)
	if cfg.Dial != nil {
		rc.Dial = cfg.Dial
		rc.Proxy = nil
	}
	tc, err := rc.TransportConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig credentials: %w", err)
	}
	tlsConfig, err := transport.TLSConfigFor(tc)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig TLS settings: %w", err)
	}

	dial := (&net.Dialer{Timeout: dialTimeout, KeepAlive: keepalive(cfg.Keepalive)}).DialContext
	if tc.DialHolder != nil && tc.DialHolder.Dial != nil {
		// The injected dialer, possibly wrapped by an exec plugin that closes connections when its
		// certificate rotates.
		dial = tc.DialHolder.Dial
	}
	var proxy func(*http.Request) (*url.URL, error)
	switch {
	case cfg.Dial != nil:
		// The dialer decides the route.
	case tc.Proxy != nil:
		proxy = tc.Proxy // the kubeconfig's proxy-url
	default:
		proxy = utilnet.NewProxierWithNoProxyCIDR(http.ProxyFromEnvironment)
	}

	newTransport := func(http2 bool) http.RoundTripper {
		t := &http.Transport{
			Proxy:               proxy,
			DialContext:         dial,
			TLSClientConfig:     tlsConfig.Clone(),
			TLSHandshakeTimeout: tlsHandshakeTimeout,
			MaxIdleConnsPerHost: maxIdleConnsPerHost,
			IdleConnTimeout:     idleConnTimeout,
			// As kubectl proxy's transport does: ask for gzip when the client did not, and decompress for it,
			// so that large lists cross SSH or a WAN compressed (--disable-compression turns it off). A
			// client's own Accept-Encoding passes through, and its body back untouched.
			DisableCompression: cfg.REST.DisableCompression,
			WriteBufferSize:    copyBufferSize,
			ReadBufferSize:     copyBufferSize,
		}
		t.Protocols = new(http.Protocols)
		t.Protocols.SetHTTP1(true)
		if !http2 && t.TLSClientConfig != nil {
			// Offer only HTTP/1.1 in ALPN, whatever the kubeconfig asks for.
			t.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		if http2 {
			t.Protocols.SetHTTP2(true)
			// The same health check client-go configures: a dead connection is noticed within 45s.
			t.HTTP2 = &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second}
		}
		h.transports = append(h.transports, t)
		return t
	}
	main, err := transport.HTTPWrappersForConfig(tc, newTransport(cfg.HTTP2))
	if err != nil {
		return nil, fmt.Errorf("kubeconfig credentials: %w", err)
	}
	upgrade := main
	if cfg.HTTP2 {
		if upgrade, err = transport.HTTPWrappersForConfig(tc, newTransport(false)); err != nil {
			return nil, fmt.Errorf("kubeconfig credentials: %w", err)
		}
	}
	return &splitTransport{plain: main, upgrade: upgrade}, nil
}

func keepalive(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return defaultKeepalive
	case d < 0:
		return -1
	default:
		return d
	}
}

// splitTransport sends protocol upgrades over HTTP/1.1 and everything else over the plain transport.
type splitTransport struct {
	plain, upgrade http.RoundTripper
}

func (t *splitTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if httpguts.HeaderValuesContainsToken(r.Header["Connection"], "upgrade") {
		return t.upgrade.RoundTrip(r)
	}
	return t.plain.RoundTrip(r)
}

// bufferPool recycles ReverseProxy's copy buffers.
type bufferPool struct {
	size int
	pool sync.Pool
}

func newBufferPool(size int) *bufferPool {
	return &bufferPool{size: size}
}

func (p *bufferPool) Get() []byte {
	if b, ok := p.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, p.size)
}

func (p *bufferPool) Put(b []byte) {
	if cap(b) != p.size {
		return
	}
	b = b[:p.size]
	p.pool.Put(&b)
}
