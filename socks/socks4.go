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

// SOCKS4 and its 4a extension (names resolved by the proxy), which ssh -D serves beside SOCKS5 and clients
// such as curl --socks4a still use. CONNECT only. SOCKS4 carries a user ID but no password, so a server that
// requires credentials refuses it.
const (
	socks4Version  = 0x04
	socks4Granted  = 90
	socks4Rejected = 91
)

// readRequest4 reads a SOCKS4 or SOCKS4a request, whose version byte is already known to be 4, and returns
// the CONNECT destination as "host:port". A requestError's reply is socks4Rejected, or 0 to close without
// one.
func readRequest4(r *bufio.Reader) (string, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", err
	}
	if hdr[1] != cmdConnect {
		return "", &requestError{reply: socks4Rejected, msg: fmt.Sprintf("socks4 command %d not supported", hdr[1])}
	}
	// The user ID, up to a NUL; the reader's header limit bounds it.
	if _, err := r.ReadSlice(0); err != nil {
		return "", fmt.Errorf("socks4 user id: %w", err)
	}
	port := binary.BigEndian.Uint16(hdr[2:4])
	ip := netip.AddrFrom4([4]byte(hdr[4:8]))
	host := ip.String()
	if a := ip.As4(); a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] != 0 {
		// SOCKS4a: 0.0.0.x says a host name follows the user ID.
		name, err := r.ReadSlice(0)
		if err != nil {
			return "", fmt.Errorf("socks4a host name: %w", err)
		}
		name = name[:len(name)-1]
		if err := checkHostName(name); err != nil {
			return "", &requestError{reply: socks4Rejected, msg: err.Error()}
		}
		host = string(name)
	}
	if port == 0 {
		return "", &requestError{reply: socks4Rejected, msg: "destination port 0"}
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port))), nil
}

// writeReply4 sends a SOCKS4 reply. Clients ignore its address, which is left zero.
func writeReply4(w io.Writer, code byte) error {
	_, err := w.Write([]byte{0, code, 0, 0, 0, 0, 0, 0})
	return err
}

func (s *Server) serveSOCKS4(ctx context.Context, cl *client) {
	c := cl.Conn
	c.SetWriteDeadline(time.Now().Add(s.handshakeTimeout()))
	if s.Credentials != nil {
		writeReply4(c, socks4Rejected)
		s.Log.Info("SOCKS4 client refused: this proxy requires a password, which SOCKS4 cannot carry; use SOCKS5", "remote", c.RemoteAddr())
		return
	}
	addr, err := readRequest4(cl.br)
	if err != nil {
		var re *requestError
		if errors.As(err, &re) && re.reply != 0 {
			writeReply4(c, re.reply)
		}
		s.logHandshake(cl, "socks4 request", err)
		return
	}
	s.connect(ctx, cl, "SOCKS4", addr, func(_ net.Conn, err error) error {
		if err != nil {
			s.logDialFailure("socks4", c.RemoteAddr(), addr, "rejected", err)
			return writeReply4(c, socks4Rejected)
		}
		return writeReply4(c, socks4Granted)
	})
}
