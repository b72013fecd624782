package socks

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// relayBufSize is large enough that a bulk transfer costs few reads and writes (an SSH channel delivers up
// to 32 KiB per packet, often several at once), and small enough that many idle connections stay cheap.
// Measured on loopback, this plain copy was as fast as splice(2) between two TCP connections, so there is
// one path for every kind of upstream.
const relayBufSize = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

type closeWriter interface{ CloseWrite() error }

// connect ends a handshake that named addr, in any protocol: the handshake's read limits go, addr is
// dialled, answer replies to the client (out is nil when the dial failed, with err), and the two are relayed
// until both are done. kind names the protocol in the log.
func (s *Server) connect(ctx context.Context, cl *client, kind, addr string, answer func(out net.Conn, err error) error) {
	c := cl.Conn
	// The connection may idle as long as the peers like from here on.
	cl.lr.n = -1
	c.SetReadDeadline(time.Time{})
	out, err := s.dial(ctx, "tcp", addr)
	// The dial may outlast the handshake's write deadline (an SSH reconnect waits up to its connect
	// timeout): the answer gets a deadline of its own.
	c.SetWriteDeadline(time.Now().Add(s.handshakeTimeout()))
	if err != nil {
		answer(nil, err)
		return
	}
	if err := answer(out, nil); err != nil {
		out.Close()
		return
	}
	c.SetWriteDeadline(time.Time{})
	s.Log.V(2).Info(kind+" connect", "remote", c.RemoteAddr(), "dest", addr)
	relay(c, cl.br, out)
}

// relay copies data both ways between the client and the upstream connection until both directions are
// done, then closes both. Bytes the client sent after its request, already buffered in br, go first. When
// one side finishes sending (EOF), the other side's write half is closed, so request/response protocols that
// half-close keep working; an error in either direction tears both down.
func relay(client net.Conn, br *bufio.Reader, upstream net.Conn) {
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		if _, err := upstream.Write(b); err != nil {
			client.Close()
			upstream.Close()
			return
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pipe(upstream, client)
	}()
	pipe(client, upstream)
	wg.Wait()
	client.Close()
	upstream.Close()
}

// pipe copies src to dst. On EOF it half-closes dst; on an error it closes both so the other direction ends.
func pipe(dst, src net.Conn) {
	_, err := copyConn(dst, src)
	if err == nil {
		if cw, ok := dst.(closeWriter); ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
	}
	dst.Close()
	src.Close()
}

// copyConn copies until EOF (reported as nil) or an error.
func copyConn(dst, src net.Conn) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var written int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			written += int64(w)
			if werr != nil {
				return written, werr
			}
			if w != n {
				return written, io.ErrShortWrite
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return written, nil
			}
			return written, rerr
		}
	}
}
