package flow

import (
	"net"

	"golang.org/x/sys/unix"
)

// tcpAcked reads TCP_INFO's bytes_acked.
func tcpAcked(c *net.TCPConn) (uint64, bool) {
	rc, err := c.SyscallConn()
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
