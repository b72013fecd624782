//go:build !linux

package sshdial

import "net"

func quickAck(c net.Conn) net.Conn { return c }
