package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

// Frontend dials through a Konnectivity server's frontend the way kube-apiserver's egress selector does: a
// single-use gRPC tunnel from konnectivity-client, or an HTTP CONNECT request, over the Unix socket or over
// mTLS TCP. `konnect doctor dial` and the tests use it.
type Frontend struct {
	// UDSName is the server's socket; when empty, Addr and TLS name an mTLS TCP frontend.
	UDSName string
	Addr    string
	TLS     *tls.Config
	// Mode is "grpc" (default) or "http-connect".
	Mode string
}

func (f Frontend) rawDial(ctx context.Context) (net.Conn, error) {
	if f.UDSName != "" {
		var d net.Dialer
		return d.DialContext(ctx, "unix", f.UDSName)
	}
	d := tls.Dialer{Config: f.TLS}
	return d.DialContext(ctx, "tcp", f.Addr)
}

func (f Frontend) where() string {
	if f.UDSName != "" {
		return f.UDSName
	}
	return f.Addr
}

// FrontendError is a failure to reach the server itself, as opposed to a dial the server or agent refused.
type FrontendError struct {
	Where string
	Err   error
}

func (e *FrontendError) Error() string {
	return fmt.Sprintf("konnectivity server at %s: %v", e.Where, e.Err)
}

func (e *FrontendError) Unwrap() error { return e.Err }

// DefaultDialTimeout bounds a Dial whose context has no deadline, as kube-apiserver bounds its own.
const DefaultDialTimeout = 30 * time.Second

// Dial opens a connection to addr through the server. ctx bounds the dial only.
func (f Frontend) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDialTimeout)
		defer cancel()
	}
	if f.Mode == "http-connect" {
		return f.dialConnect(ctx, addr)
	}
	return f.dialGRPC(ctx, addr)
}

func (f Frontend) dialGRPC(ctx context.Context, addr string) (net.Conn, error) {
	creds := insecure.NewCredentials()
	target := "passthrough:///" + f.where()
	if f.UDSName == "" {
		creds = credentials.NewTLS(f.TLS)
	}
	// A socket that is missing or refusing, or a server in the other --mode, is a definite answer; do not let
	// gRPC retry it until the timeout.
	if f.UDSName != "" {
		http1, err := f.speaksHTTP1(ctx)
		if err != nil {
			return nil, &FrontendError{Where: f.where(), Err: err}
		}
		if http1 {
			return nil, &FrontendError{Where: f.where(), Err: ErrOtherMode}
		}
	}
	// The tunnel lives as long as the connection; cancelling tunnelCtx on Close releases it.
	tunnelCtx, cancel := context.WithCancel(context.Background())
	tun, err := kclient.CreateSingleUseGrpcTunnelWithContext(ctx, tunnelCtx, target,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			if f.UDSName != "" {
				return d.DialContext(ctx, "unix", f.UDSName)
			}
			return d.DialContext(ctx, "tcp", f.Addr) // gRPC's TLS credentials do the handshake
		}),
		grpc.WithBlock(),                 //nolint:staticcheck // as kube-apiserver does
		grpc.WithReturnConnectionError(), //nolint:staticcheck // as kube-apiserver does
		grpc.WithTransportCredentials(creds),
	)
	if err != nil {
		cancel()
		if http1, _ := f.speaksHTTP1(context.Background()); http1 {
			err = fmt.Errorf("%w: %w", ErrOtherMode, err)
		}
		return nil, &FrontendError{Where: f.where(), Err: err}
	}
	c, err := tun.DialContext(ctx, "tcp", addr)
	if err != nil {
		cancel()
		return nil, err
	}
	return &cancelConn{Conn: c, cancel: cancel}, nil
}

// ErrOtherMode: the server answered in the other protocol of its --mode (the server's flag).
var ErrOtherMode = errors.New("the server speaks HTTP/1.1 (--mode http-connect), not gRPC")

// speaksHTTP1 reports whether the server answers an HTTP/2 connection preface in HTTP/1.1, as an http-connect
// server does; the error is that of reaching the server at all. It tells a --mode mismatch from a server that
// is down, which a failed gRPC dial cannot: its error depends on a race (a frame read as HTTP, or a write to a
// closed connection), and with a socket it retries until the timeout.
func (f Frontend) speaksHTTP1(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := f.rawDial(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return false, nil
	}
	b := make([]byte, len("HTTP/1."))
	n, _ := io.ReadFull(c, b)
	return string(b[:n]) == "HTTP/1.", nil
}

type cancelConn struct {
	net.Conn
	cancel context.CancelFunc
}

func (c *cancelConn) Close() error {
	err := c.Conn.Close()
	// Let the client send CLOSE_REQ before the tunnel goes.
	time.AfterFunc(time.Second, c.cancel)
	return err
}

func (f Frontend) dialConnect(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := f.rawDial(ctx)
	if err != nil {
		return nil, &FrontendError{Where: f.where(), Err: err}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr); err != nil {
		conn.Close()
		return nil, &FrontendError{Where: f.where(), Err: err}
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", konnectivity.ErrDialTimeout, ctx.Err())
		}
		return nil, &FrontendError{Where: f.where(), Err: fmt.Errorf("read CONNECT response: %w", err)}
	}
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		conn.Close()
		return nil, fmt.Errorf("%s: %s", res.Status, strings.TrimSpace(string(body)))
	}
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("%w: %w", konnectivity.ErrDialTimeout, ctx.Err())
	}
	_ = conn.SetDeadline(time.Time{})
	if br.Buffered() == 0 {
		return conn, nil
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
