package extensions

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/tunnel"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport/spdy"
)

// TunnelDialer dials an endpoint through a Konnectivity server's frontend socket, exactly as
// kube-apiserver's egress selector does on a control-plane node.
type TunnelDialer struct {
	Frontend tunnel.Frontend
}

func (d TunnelDialer) DialEndpoint(ctx context.Context, ep Endpoint) (net.Conn, error) {
	return d.Frontend.Dial(ctx, ep.String())
}

func (d TunnelDialer) Via() string { return "konnectivity socket " + d.Frontend.UDSName }

// portForwardProtocol is the SPDY sub-protocol of pods/portforward (client-go tools/portforward).
const portForwardProtocol = "portforward.k8s.io"

// ErrNotPod is returned by PortForwardDialer for an endpoint that is not a pod (cause CauseNotPod).
var ErrNotPod = errors.New("the endpoint is not a pod, and pods/portforward reaches only pods")

// PortForwardDialer reaches an endpoint's pod through kube-apiserver's pods/portforward, from wherever
// kubectl works (a laptop through `konnect socks`, say). kube-apiserver reaches the pod's kubelet through
// the same egress selector, so a missing agent shows here too. It is used rather than the service proxy
// because the service proxy ends TLS in kube-apiserver without checking the server's certificate, and the
// certificate is what this check is about.
type PortForwardDialer struct {
	Config *rest.Config
	Kube   kubernetes.Interface
}

func (d PortForwardDialer) Via() string { return "kube-apiserver pods/portforward" }

func (d PortForwardDialer) DialEndpoint(ctx context.Context, ep Endpoint) (net.Conn, error) {
	if ep.Pod == nil || ep.Pod.Kind != "Pod" {
		return nil, ErrNotPod
	}
	u := d.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ep.Pod.Namespace).Name(ep.Pod.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(d.Config)
	if err != nil {
		return nil, err
	}
	type dialed struct {
		conn httpstream.Connection
		err  error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, _, err := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u).Dial(portForwardProtocol)
		ch <- dialed{c, err}
	}()
	var streams httpstream.Connection
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ep.Pod.Namespace, ep.Pod.Name, r.err)
		}
		streams = r.conn
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ep.Pod.Namespace, ep.Pod.Name, ctx.Err())
	}
	h := http.Header{}
	h.Set(corev1.PortHeader, strconv.Itoa(int(ep.Port)))
	h.Set(corev1.PortForwardRequestIDHeader, "0")
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	errStream, err := streams.CreateStream(h)
	if err != nil {
		streams.Close()
		return nil, fmt.Errorf("port-forward error stream: %w", err)
	}
	errStream.Close() // this side sends nothing on it
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := streams.CreateStream(h)
	if err != nil {
		streams.Close()
		return nil, fmt.Errorf("port-forward data stream: %w", err)
	}
	c := &streamConn{streams: streams, data: data, ep: ep, remoteErr: make(chan struct{})}
	go func() {
		msg, _ := io.ReadAll(io.LimitReader(errStream, 4096))
		if len(msg) > 0 {
			c.mu.Lock()
			c.err = fmt.Errorf("port-forward to pod %s/%s port %d: %s", ep.Pod.Namespace, ep.Pod.Name, ep.Port, strings.TrimSpace(string(msg)))
			c.mu.Unlock()
		}
		close(c.remoteErr)
	}()
	return c, nil
}

// streamConn is a port-forward data stream as a net.Conn. The kubelet reports a failure to reach the
// port on the error stream; a read that ends returns that failure.
type streamConn struct {
	streams   httpstream.Connection
	data      httpstream.Stream
	ep        Endpoint
	mu        sync.Mutex
	err       error
	remoteErr chan struct{}
}

func (c *streamConn) Read(p []byte) (int, error) {
	n, err := c.data.Read(p)
	if err != nil {
		select {
		case <-c.remoteErr:
		case <-time.After(time.Second):
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err != nil {
			return n, c.err
		}
	}
	return n, err
}

func (c *streamConn) Write(p []byte) (int, error) { return c.data.Write(p) }

func (c *streamConn) Close() error {
	c.data.Close()
	return c.streams.Close()
}

func (c *streamConn) LocalAddr() net.Addr  { return portForwardAddr("local") }
func (c *streamConn) RemoteAddr() net.Addr { return portForwardAddr(c.ep.String()) }

// Deadlines are enforced by closing the connection when the caller's context ends (tls.Conn's
// HandshakeContext does that).
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

type portForwardAddr string

func (a portForwardAddr) Network() string { return "portforward" }
func (a portForwardAddr) String() string  { return string(a) }

// DialCause names why a dial or handshake failed, in the causes above; "" when none fits. The tunnel's
// reasons are read by konnectivity.Classify, the one place that knows their text; it also recognises them
// in kube-apiserver's port-forward errors, which quote the tunnel's.
func DialCause(ctx context.Context, err error) string {
	err = konnectivity.Classify(err)
	switch {
	case errors.Is(err, konnectivity.ErrNoAgent):
		return CauseNoAgent
	case errors.Is(err, konnectivity.ErrConnectionRefused):
		return CauseRefused
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, konnectivity.ErrDialTimeout), errors.Is(err, konnectivity.ErrIOTimeout):
		return CauseDialTimeout
	case errors.Is(err, ErrNotPod):
		return CauseNotPod
	}
	return ""
}
