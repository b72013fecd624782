package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	servermetrics "sigs.k8s.io/apiserver-network-proxy/pkg/server/metrics"
)

// The HTTP CONNECT frontend. Each CONNECT request is one tunnel, and it runs through the same path as a gRPC
// tunnel: upstream's Proxy handler, behind the same interceptors (the frontend's queue, pending dials, flow
// control), over a connectStream that speaks CONNECT on the hijacked connection instead of gRPC. Upstream's
// own CONNECT handler writes and reads the connection on the agent stream's goroutine and its own, out of
// reach of those interceptors.

// connectReadSize is the most read from a CONNECT client at once, as upstream's handler reads.
const connectReadSize = 32 << 10

// proxyInfo describes upstream's Proxy method to the interceptors.
var proxyInfo = &grpc.StreamServerInfo{FullMethod: "/ProxyService/Proxy", IsClientStream: true, IsServerStream: true}

// serveConnect is the http-connect frontend's handler.
func (s *Server) serveConnect(w http.ResponseWriter, r *http.Request) {
	servermetrics.Metrics.HTTPConnectionInc()
	defer servermetrics.Metrics.HTTPConnectionDec()
	if r.Method != http.MethodConnect {
		http.Error(w, "this proxy only supports CONNECT passthrough", http.StatusMethodNotAllowed)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "hijacking not supported", http.StatusInternalServerError)
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	cs := newConnectStream(conn, rw.Reader, r)
	s.trackConn(cs, true)
	defer s.trackConn(cs, false)
	defer cs.close()
	_ = s.frontendInterceptor(nil, cs, proxyInfo, func(srv any, ss grpc.ServerStream) error {
		return s.dials.interceptor(srv, ss, proxyInfo, func(_ any, ss grpc.ServerStream) error {
			return s.ps.Proxy(&grpc.GenericServerStream[client.Packet, client.Packet]{ServerStream: ss})
		})
	})
}

// connectStream is one CONNECT tunnel as a gRPC ProxyService stream: RecvMsg yields the dial, then what the
// client writes; SendMsg answers the CONNECT and writes what the agent sends. One goroutine calls RecvMsg,
// and one other (the frontend queue's writer) SendMsg.
type connectStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	conn   net.Conn
	r      *bufio.Reader // the hijacked connection, with whatever the server already buffered of it
	host   string
	random int64

	// RecvMsg's own.
	buf       []byte // read buffer, allocated on the first read
	dialSent  bool
	closeSent bool
	readErr   error

	answered chan struct{} // the dial was answered, or the tunnel closed
	once     sync.Once
	mu       sync.Mutex
	connID   int64 // set with a successful answer
	closed   bool
}

func newConnectStream(conn net.Conn, r *bufio.Reader, req *http.Request) *connectStream {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("user-agent", req.UserAgent()))
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: conn.RemoteAddr(), AuthInfo: tunnelInfo{AuthInfo: connectAuth{}, conn: conn}})
	ctx, cancel := context.WithCancel(ctx)
	return &connectStream{ctx: ctx, cancel: cancel, conn: conn, r: r, host: req.Host, random: rand.Int64(),
		answered: make(chan struct{})}
}

// connectAuth is the AuthInfo of a CONNECT tunnel: TLS is the HTTP server's business.
type connectAuth struct{}

func (connectAuth) AuthType() string { return "http-connect" }

var _ credentials.AuthInfo = connectAuth{}

func (c *connectStream) Context() context.Context     { return c.ctx }
func (c *connectStream) SetHeader(metadata.MD) error  { return nil }
func (c *connectStream) SendHeader(metadata.MD) error { return nil }
func (c *connectStream) SetTrailer(metadata.MD)       {}

// RecvMsg yields the DIAL_REQ first, then, once the dial succeeded, DATA as the client writes, and CLOSE_REQ
// when the client is done.
func (c *connectStream) RecvMsg(m any) error {
	pkt := m.(*client.Packet)
	proto.Reset(pkt)
	if !c.dialSent {
		c.dialSent = true
		pkt.Type = client.PacketType_DIAL_REQ
		pkt.Payload = &client.Packet_DialRequest{DialRequest: &client.DialRequest{Protocol: "tcp", Address: c.host, Random: c.random}}
		return nil
	}
	select {
	case <-c.answered:
	case <-c.ctx.Done():
		return io.EOF
	}
	id := c.connection()
	if id == 0 || c.closeSent {
		return io.EOF
	}
	if c.readErr == nil {
		if c.buf == nil {
			c.buf = make([]byte, connectReadSize)
		}
		n, err := c.r.Read(c.buf)
		c.readErr = err
		if n > 0 {
			// Copied out of the read buffer, which the next read reuses: upstream hands the packet to another
			// goroutine before it is sent, and the agent stream's codec sends the payload without a copy.
			pkt.Type = client.PacketType_DATA
			pkt.Payload = &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: bytes.Clone(c.buf[:n])}}
			return nil
		}
	}
	c.closeSent = true
	pkt.Type = client.PacketType_CLOSE_REQ
	pkt.Payload = &client.Packet_CloseRequest{CloseRequest: &client.CloseRequest{ConnectID: id}}
	return nil
}

// SendMsg answers the CONNECT when the dial is answered, writes DATA to the client, and closes the tunnel when
// the connection ends.
func (c *connectStream) SendMsg(m any) error {
	pkt := m.(*client.Packet)
	switch pkt.Type {
	case client.PacketType_DIAL_RSP:
		rsp := pkt.GetDialResponse()
		if rsp.GetError() != "" {
			_, _ = io.WriteString(c.conn, connectRefusal(rsp.GetError()))
			c.close()
			return nil
		}
		c.mu.Lock()
		c.connID = rsp.GetConnectID()
		c.mu.Unlock()
		c.once.Do(func() { close(c.answered) })
		_, err := io.WriteString(c.conn, "HTTP/1.1 200 Connection Established\r\n\r\n")
		return err
	case client.PacketType_DATA:
		_, err := c.conn.Write(pkt.GetData().GetData())
		return err
	case client.PacketType_CLOSE_RSP, client.PacketType_DIAL_CLS:
		c.close()
		return nil
	}
	return fmt.Errorf("konnect server: unexpected %s for an HTTP CONNECT tunnel", pkt.Type)
}

func (c *connectStream) connection() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connID
}

// close ends the tunnel: the client's connection closes, and a RecvMsg waiting for the dial returns.
func (c *connectStream) close() {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	if already {
		return
	}
	c.once.Do(func() { close(c.answered) })
	c.cancel()
	_ = c.conn.Close()
}

// connectRefusal is the HTTP answer to a CONNECT whose dial failed, with the statuses of upstream's handler:
// 500 when no agent serves the destination, 504 for a timeout, 503 when the server holds too many dials
// already, and 502 for any other failure.
func connectRefusal(reason string) string {
	code, body := http.StatusBadGateway, reason
	err := konnectivity.Classify(errors.New(reason))
	low := strings.ToLower(reason)
	switch {
	case errors.Is(err, konnectivity.ErrNoAgent):
		code, body = http.StatusInternalServerError, "currently no tunnels available: "+reason
	case errors.Is(err, konnectivity.ErrTooManyDials), strings.Contains(low, "too many open files"):
		code = http.StatusServiceUnavailable
	case strings.Contains(low, "timeout"), strings.Contains(low, "timed out"), strings.Contains(low, "deadline exceeded"):
		code = http.StatusGatewayTimeout
	}
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n%s\r\n",
		code, http.StatusText(code), body)
}
