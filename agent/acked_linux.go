package agent

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// ackedBytes is how much of c's output its peer has acknowledged (TCP_INFO's bytes_acked), and whether c
// could say: false for a connection that is not a TCP socket.
func ackedBytes(c net.Conn) (uint64, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var gerr error
	if err := rc.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
		return 0, false
	}
	return info.Bytes_acked, true
}
