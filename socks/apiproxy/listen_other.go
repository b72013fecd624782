//go:build !unix

package apiproxy

import "net"

func listenUnixPrivate(path string) (net.Listener, error) {
	return net.Listen("unix", path)
}
