package socks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzReadRequest checks the SOCKS5 request parser: it never panics, never reads past the request, and what
// it accepts is a CONNECT to a valid host:port that encodes back to the bytes it consumed.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte{5, 1, 0, 1, 127, 0, 0, 1, 0, 80})
	f.Add([]byte{5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 187})
	f.Add(append([]byte{5, 1, 0, 3, 9}, "localhost\x1f\x90"...))
	f.Add([]byte{5, 2, 0, 1, 127, 0, 0, 1, 0, 80})
	f.Add([]byte{5, 1, 0, 3, 0, 0, 80})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		addr, err := readRequest(r)
		consumed := in[:len(in)-r.Len()]
		if err != nil {
			var re *requestError
			if !errors.As(err, &re) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("accepted %q, which is not host:port: %v", addr, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			t.Fatalf("accepted port %q", port)
		}
		enc := []byte{5, 1, consumed[2]}
		if ip, err := netip.ParseAddr(host); err == nil && consumed[3] != atypDomain {
			if ip.Is4() {
				enc = append(enc, atypIPv4)
			} else {
				enc = append(enc, atypIPv6)
			}
			enc = append(enc, ip.AsSlice()...)
		} else {
			if checkHostName([]byte(host)) != nil {
				t.Fatalf("accepted invalid name %q", host)
			}
			enc = append(enc, atypDomain, byte(len(host)))
			enc = append(enc, host...)
		}
		enc = binary.BigEndian.AppendUint16(enc, uint16(p))
		if !bytes.Equal(enc, consumed) {
			t.Fatalf("consumed %v, re-encoded %v", consumed, enc)
		}
	})
}

// FuzzConnectRequest checks the HTTP request head parser and the CONNECT target check: no panic, the head
// limit holds, and an accepted target is host:port with a valid port and a clean host.
func FuzzConnectRequest(f *testing.F) {
	f.Add([]byte("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"))
	f.Add([]byte("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n"))
	f.Add([]byte("CONNECT 10.0.0.1:0 HTTP/1.1\r\n\r\n"))
	f.Add([]byte("CONNECT example.com HTTP/1.0\r\n\r\n"))
	f.Add([]byte("GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		lr := &limitedReader{r: &fakeConn{r: bytes.NewReader(in)}, n: MaxHeaderBytes}
		req, err := readRequestHead(bufio.NewReaderSize(lr, 4096))
		if err != nil {
			return
		}
		if consumed := MaxHeaderBytes - lr.n; consumed > MaxHeaderBytes {
			t.Fatalf("head consumed %d bytes, limit %d", consumed, MaxHeaderBytes)
		}
		if req.Method != "CONNECT" {
			if tgt, err := forwardTarget(req); err == nil {
				if _, _, err := net.SplitHostPort(tgt); err != nil {
					t.Fatalf("forward target %q: %v", tgt, err)
				}
			}
			return
		}
		tgt, err := connectTarget(req)
		if err != nil {
			return
		}
		host, port, err := net.SplitHostPort(tgt)
		if err != nil {
			t.Fatalf("accepted %q: %v", tgt, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			t.Fatalf("accepted port %q", port)
		}
		if host == "" || strings.ContainsAny(host, " \r\n\t/@") {
			t.Fatalf("accepted host %q", host)
		}
	})
}

// FuzzMux feeds arbitrary bytes to a whole connection on the shared port: whatever the first byte says, the
// server must not panic, must finish, and may only dial a valid host:port.
func FuzzMux(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 80, 'h', 'i'})
	f.Add([]byte{5, 1, 2, 1, 1, 'u', 1, 'p', 5, 1, 0, 3, 1, 'x', 0, 80})
	f.Add([]byte("CONNECT a:1 HTTP/1.1\r\n\r\nhello"))
	f.Add([]byte("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte{4, 1, 0, 80, 127, 0, 0, 1, 0})
	f.Add([]byte{4, 1, 0, 80, 0, 0, 0, 1, 'u', 0, 'h', 'o', 's', 't', 0, 'h', 'i'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, creds := range []*Credentials{nil, {User: "u", Password: "p"}} {
			s := &Server{
				Credentials:      creds,
				HandshakeTimeout: time.Second,
				Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					if _, _, err := net.SplitHostPort(addr); err != nil {
						t.Errorf("dial of invalid address %q", addr)
					}
					// An upstream that swallows what it gets briefly, then hangs up.
					a, b := net.Pipe()
					go func() {
						b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
						io.Copy(io.Discard, b)
						b.Close()
					}()
					return a, nil
				},
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.ServeConn(context.Background(), &fakeConn{r: bytes.NewReader(in)}, Auto)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("connection with input %q did not finish", in)
			}
			s.transport.CloseIdleConnections()
		}
	})
}

// fakeConn reads from r and discards writes; it is for feeding fuzz input to the server.
type fakeConn struct {
	r io.Reader
}

func (c *fakeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *fakeConn) Close() error                { return nil }
func (c *fakeConn) LocalAddr() net.Addr         { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1080} }
func (c *fakeConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (c *fakeConn) SetDeadline(t time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(t time.Time) error { return nil }
