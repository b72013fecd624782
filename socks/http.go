package socks

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/socks/internal/localproxy"
)

// hopHeaders are meaningful only between the client and the proxy (RFC 9110 section 7.6.1), and are not
// forwarded.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// readRequestHead reads one HTTP request head from br. Its size is bounded by the limitedReader under br.
func readRequestHead(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	return req, nil
}

// connectTarget returns the "host:port" of a CONNECT request, which must be in authority form.
func connectTarget(req *http.Request) (string, error) {
	if req.Method != http.MethodConnect {
		return "", fmt.Errorf("method %q is not CONNECT", req.Method)
	}
	host, port, err := net.SplitHostPort(req.RequestURI)
	if err != nil {
		return "", fmt.Errorf("CONNECT target %q is not host:port", req.RequestURI)
	}
	if err := checkHostName([]byte(host)); err != nil {
		return "", fmt.Errorf("CONNECT target %q: %w", req.RequestURI, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("CONNECT target %q: invalid port", req.RequestURI)
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

// forwardTarget returns the "host:port" to dial for an absolute http:// request.
func forwardTarget(req *http.Request) (string, error) {
	if req.URL == nil || req.URL.Scheme != "http" || req.URL.Host == "" {
		return "", fmt.Errorf("only CONNECT and absolute http:// URLs are proxied, not %q", req.RequestURI)
	}
	host, port := req.URL.Hostname(), req.URL.Port()
	if port == "" {
		port = "80"
	}
	if err := checkHostName([]byte(host)); err != nil {
		return "", err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("invalid port in %q", req.URL.Host)
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

// proxyAuthorized checks Proxy-Authorization: Basic against the server's credentials.
func (s *Server) proxyAuthorized(req *http.Request) bool {
	if s.Credentials == nil {
		return true
	}
	scheme, val, ok := strings.Cut(req.Header.Get("Proxy-Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(val))
	if err != nil {
		return false
	}
	user, pass, ok := strings.Cut(string(raw), ":")
	return ok && s.Credentials.match(user, pass)
}

// writeHTTPError writes a short plain-text error response, "name: reason", and asks the client to close.
func writeHTTPError(w io.Writer, name string, code int, reason string, extraHeaders ...string) error {
	body := name + ": " + sanitize(reason) + "\n"
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	for _, h := range extraHeaders {
		b.WriteString(h + "\r\n")
	}
	fmt.Fprintf(&b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	_, err := io.WriteString(w, b.String())
	return err
}

// sanitize keeps error text to one printable line.
func sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

func (s *Server) serveHTTP(ctx context.Context, cl *client) {
	c := cl.Conn
	for first := true; ; first = false {
		if !first {
			// Between requests: bound the idle time and the next head's size again.
			cl.lr.n = MaxHeaderBytes
			c.SetReadDeadline(time.Now().Add(s.idleTimeout()))
		}
		c.SetWriteDeadline(time.Now().Add(s.handshakeTimeout()))
		req, err := readRequestHead(cl.br)
		if err != nil {
			switch {
			case errors.Is(err, errHeaderTooLarge):
				writeHTTPError(c, s.name(), http.StatusRequestHeaderFieldsTooLarge, "request header too large")
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), localproxy.IsTimeout(err):
			default:
				writeHTTPError(c, s.name(), http.StatusBadRequest, "malformed request")
			}
			if first {
				s.logHandshake(cl, "http request", err)
			}
			return
		}
		// Only HTTP/1.x is spoken here; a client that claims another version gets 505 rather than a tunnel
		// whose framing it may misunderstand.
		if req.ProtoMajor != 1 {
			writeHTTPError(c, s.name(), http.StatusHTTPVersionNotSupported, "only HTTP/1.x is supported")
			return
		}
		if !s.proxyAuthorized(req) {
			s.Log.Info("HTTP proxy authentication failed", "remote", c.RemoteAddr())
			writeHTTPError(c, s.name(), http.StatusProxyAuthRequired, "proxy authentication required",
				`Proxy-Authenticate: Basic realm="konnect"`)
			return
		}
		if req.Method == http.MethodConnect {
			s.handleConnect(ctx, cl, req)
			return
		}
		if !s.forward(ctx, cl, req) {
			return
		}
	}
}

func (s *Server) handleConnect(ctx context.Context, cl *client, req *http.Request) {
	c := cl.Conn
	target, err := connectTarget(req)
	if err != nil {
		writeHTTPError(c, s.name(), http.StatusBadRequest, err.Error())
		return
	}
	s.connect(ctx, cl, "HTTP", target, func(_ net.Conn, err error) error {
		if err != nil {
			code := localproxy.HTTPStatus(err)
			s.logDialFailure("http connect", c.RemoteAddr(), target, code, err)
			return writeHTTPError(c, s.name(), code, dialReason(target, err))
		}
		_, err = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		return err
	})
}

// forward proxies one plain http:// request and reports whether the client connection may be reused.
func (s *Server) forward(ctx context.Context, cl *client, req *http.Request) bool {
	c := cl.Conn
	if _, err := forwardTarget(req); err != nil {
		writeHTTPError(c, s.name(), http.StatusBadRequest, err.Error())
		return false
	}
	if req.Header.Get("Upgrade") != "" {
		writeHTTPError(c, s.name(), http.StatusNotImplemented, "protocol upgrades are not forwarded; use CONNECT")
		return false
	}
	// The body may be long and slow (an upload): no size limit and no deadline while it streams.
	cl.lr.n = -1
	c.SetReadDeadline(time.Time{})
	c.SetWriteDeadline(time.Time{})
	clientClose := req.Close
	out := req.Clone(ctx)
	out.RequestURI = ""
	out.Close = false
	removeHopHeaders(out.Header)
	if _, ok := out.Header["User-Agent"]; !ok {
		// net/http would add its own; a proxy passes the client's request as it came.
		out.Header["User-Agent"] = nil
	}
	var body *eofReader
	if req.ContentLength == 0 {
		out.Body = nil
	} else {
		body = &eofReader{ReadCloser: req.Body}
		out.Body = body
	}
	resp, err := s.transport.RoundTrip(out)
	if err != nil {
		code := localproxy.HTTPStatus(err)
		s.logDialFailure("http", c.RemoteAddr(), req.URL.Host, code, err)
		writeHTTPError(c, s.name(), code, dialReason(req.URL.Host, err))
		return false
	}
	defer resp.Body.Close()
	removeHopHeaders(resp.Header)
	resp.Close = resp.Close || clientClose
	if !req.ProtoAtLeast(1, 1) {
		// An HTTP/1.0 client cannot read chunked framing (RFC 9112, 6.1): the body ends when the
		// connection closes instead.
		resp.TransferEncoding = nil
		resp.Close = true
	}
	if resp.ContentLength < 0 && !slices.Contains(resp.TransferEncoding, "chunked") {
		// resp.Write delimits such a body by closing; say so here too, so the connection is not reused.
		resp.Close = true
	}
	if err := resp.Write(c); err != nil {
		return false
	}
	// A request body the origin did not read to the end is still on the client connection: it cannot
	// carry another request.
	return !resp.Close && (body == nil || body.eof.Load())
}

// eofReader records whether its reader reached EOF.
type eofReader struct {
	io.ReadCloser
	eof atomic.Bool // set by the transport's writer goroutine
}

func (r *eofReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == io.EOF {
		r.eof.Store(true)
	}
	return n, err
}
