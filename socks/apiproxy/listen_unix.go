//go:build unix

package apiproxy

import (
	"net"
	"syscall"
)

// listenUnixPrivate creates the socket with mode 0600 from the start: the umask is narrowed around the bind
// instead of chmod afterwards, which would leave a window. This runs once, at start-up.
func listenUnixPrivate(path string) (net.Listener, error) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	return net.Listen("unix", path)
}
