package sshdial

import (
	"net"
	"syscall"
)

// quickAckConn asks Linux to acknowledge received segments at once (TCP_QUICKACK) before reads that follow
// a small read, i.e. while the connection carries requests and replies rather than a bulk stream.
//
// sshd does not set TCP_NODELAY on sessions without a terminal. When it confirms a channel and the
// destination speaks first (a banner, a server greeting), that first data packet waits under Nagle until the
// confirmation is acknowledged, and Linux's delayed ACK adds up to 40 ms to every such connection (ssh -D
// has the same delay). The kernel drops the flag by itself, so it is re-armed per read; during bulk
// transfers the reads are large and it is left alone.
type quickAckConn struct {
	*net.TCPConn
	rc   syscall.RawConn
	bulk bool // the previous read was large
}

const quickAckBulkRead = 64 << 10

func quickAck(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &quickAckConn{TCPConn: tc, rc: rc}
}

func (q *quickAckConn) Read(p []byte) (int, error) {
	if !q.bulk {
		q.rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
		})
	}
	n, err := q.TCPConn.Read(p)
	q.bulk = n >= quickAckBulkRead
	return n, err
}
