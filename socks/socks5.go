package socks

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// SOCKS5 constants from RFC 1928 and RFC 1929.
const (
	socksVersion   = 0x05
	userPassVer    = 0x01
	methodNoAuth   = 0x00
	methodUserPass = 0x02
	methodNone     = 0xff

	cmdConnect = 0x01

	atypIPv4   = 0x01
	atypDomain = 0x03
	atypIPv6   = 0x04
)

// Reply codes (RFC 1928 section 6).
const (
	ReplySucceeded            = 0x00
	ReplyGeneralFailure       = 0x01
	ReplyNotAllowed           = 0x02
	ReplyNetworkUnreachable   = 0x03
	ReplyHostUnreachable      = 0x04
	ReplyConnectionRefused    = 0x05
	ReplyTTLExpired           = 0x06
	ReplyCommandNotSupported  = 0x07
	ReplyAddrTypeNotSupported = 0x08
)

// requestError is a malformed or unsupported request. reply is the code to answer with; 0 means close the
// connection without a reply (the peer does not speak SOCKS5).
type requestError struct {
	reply byte
	msg   string
}

func (e *requestError) Error() string { return "socks5: " + e.msg }

// readGreeting reads the client's version identifier and method selection message.
func readGreeting(r io.Reader) (methods []byte, err error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	if hdr[0] != socksVersion {
		return nil, &requestError{msg: fmt.Sprintf("version %d in greeting, want 5", hdr[0])}
	}
	methods = make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return nil, err
	}
	return methods, nil
}

// readUserPass reads an RFC 1929 username/password request.
func readUserPass(r io.Reader) (user, pass string, err error) {
	var b [2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return "", "", err
	}
	if b[0] != userPassVer {
		return "", "", &requestError{msg: fmt.Sprintf("username/password version %d, want 1", b[0])}
	}
	u := make([]byte, b[1])
	if _, err := io.ReadFull(r, u); err != nil {
		return "", "", err
	}
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return "", "", err
	}
	p := make([]byte, b[0])
	if _, err := io.ReadFull(r, p); err != nil {
		return "", "", err
	}
	return string(u), string(p), nil
}

// readRequest reads a SOCKS5 request and returns the CONNECT destination as "host:port". A domain name is
// returned as given, for the dialer to resolve.
func readRequest(r io.Reader) (string, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", err
	}
	if hdr[0] != socksVersion {
		return "", &requestError{msg: fmt.Sprintf("version %d in request, want 5", hdr[0])}
	}
	if hdr[1] != cmdConnect {
		// BIND and UDP ASSOCIATE are not offered.
		return "", &requestError{reply: ReplyCommandNotSupported, msg: fmt.Sprintf("command %d not supported", hdr[1])}
	}
	var host string
	switch hdr[3] {
	case atypIPv4:
		var a [4]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return "", err
		}
		host = netip.AddrFrom4(a).String()
	case atypIPv6:
		var a [16]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return "", err
		}
		host = netip.AddrFrom16(a).String()
	case atypDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return "", err
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(r, name); err != nil {
			return "", err
		}
		if err := checkHostName(name); err != nil {
			return "", &requestError{reply: ReplyGeneralFailure, msg: err.Error()}
		}
		host = string(name)
	default:
		return "", &requestError{reply: ReplyAddrTypeNotSupported, msg: fmt.Sprintf("address type %d not supported", hdr[3])}
	}
	var p [2]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return "", err
	}
	port := binary.BigEndian.Uint16(p[:])
	if port == 0 {
		return "", &requestError{reply: ReplyGeneralFailure, msg: "destination port 0"}
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port))), nil
}

// checkHostName accepts the bytes a host name or address literal may contain, so that a name cannot smuggle
// separators or control characters into the dialer or the logs.
func checkHostName(name []byte) error {
	if len(name) == 0 {
		return errors.New("empty destination name")
	}
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_', c == ':', c == '%':
		default:
			return fmt.Errorf("invalid byte 0x%02x in destination name", c)
		}
	}
	return nil
}

// writeReply sends a reply; bound is the address reported as BND.ADDR/BND.PORT (nil: 0.0.0.0:0).
func writeReply(w io.Writer, code byte, bound net.Addr) error {
	b := []byte{socksVersion, code, 0}
	ap := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if ta, ok := bound.(*net.TCPAddr); ok && ta != nil {
		if a, ok := netip.AddrFromSlice(ta.IP); ok {
			ap = netip.AddrPortFrom(a.Unmap(), uint16(ta.Port))
		}
	}
	if ap.Addr().Is4() {
		b = append(b, atypIPv4)
	} else {
		b = append(b, atypIPv6)
	}
	b = append(b, ap.Addr().AsSlice()...)
	b = binary.BigEndian.AppendUint16(b, ap.Port())
	_, err := w.Write(b)
	return err
}

// refuseSOCKS tells a SOCKS5 client that the server cannot take it: it accepts the greeting and answers the
// request with a general failure, which clients report clearly, unlike a reset.
func refuseSOCKS(br *bufio.Reader, c net.Conn) {
	if _, err := readGreeting(br); err != nil {
		return
	}
	if _, err := c.Write([]byte{socksVersion, methodNoAuth}); err != nil {
		return
	}
	if _, err := readRequest(br); err != nil {
		var re *requestError
		if !errors.As(err, &re) {
			return
		}
	}
	writeReply(c, ReplyGeneralFailure, nil)
}

func (s *Server) serveSOCKS(ctx context.Context, cl *client) {
	c := cl.Conn
	c.SetWriteDeadline(time.Now().Add(s.handshakeTimeout()))
	methods, err := readGreeting(cl.br)
	if err != nil {
		s.logHandshake(cl, "socks5 greeting", err)
		return
	}
	want := byte(methodNoAuth)
	if s.Credentials != nil {
		want = methodUserPass
	}
	offered := false
	for _, m := range methods {
		if m == want {
			offered = true
		}
	}
	if !offered {
		c.Write([]byte{socksVersion, methodNone})
		s.Log.V(1).Info("SOCKS5 client offered no acceptable authentication method", "remote", c.RemoteAddr(), "required", want)
		return
	}
	if _, err := c.Write([]byte{socksVersion, want}); err != nil {
		return
	}
	if s.Credentials != nil {
		user, pass, err := readUserPass(cl.br)
		if err != nil {
			s.logHandshake(cl, "socks5 username/password", err)
			return
		}
		if !s.Credentials.match(user, pass) {
			c.Write([]byte{userPassVer, 0x01})
			s.Log.Info("SOCKS5 authentication failed", "remote", c.RemoteAddr())
			return
		}
		if _, err := c.Write([]byte{userPassVer, 0x00}); err != nil {
			return
		}
	}
	addr, err := readRequest(cl.br)
	if err != nil {
		var re *requestError
		if errors.As(err, &re) && re.reply != 0 {
			writeReply(c, re.reply, nil)
		}
		s.logHandshake(cl, "socks5 request", err)
		return
	}
	s.connect(ctx, cl, "SOCKS5", addr, func(out net.Conn, err error) error {
		if err != nil {
			code := replyCode(err)
			s.logDialFailure("socks5", c.RemoteAddr(), addr, fmt.Sprintf("reply %d", code), err)
			return writeReply(c, code, nil)
		}
		return writeReply(c, ReplySucceeded, out.LocalAddr())
	})
}

func (s *Server) logHandshake(cl *client, what string, err error) {
	if errors.Is(err, io.EOF) {
		return
	}
	s.Log.V(1).Info("Proxy handshake failed", "stage", what, "remote", cl.RemoteAddr(), "err", err)
}
