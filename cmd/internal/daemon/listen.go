package daemon

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/konnect-dev/konnect/pki/address"
)

// Listen binds addr before the daemon starts, so that "address in use" is an error returned at start-up and
// not a log line later. A TCP address that is not loopback is refused unless allowRemote is set; flagName is
// the flag the address came from, and allowFlag (default --allow-remote) the flag that permits a remote
// address, so the error tells the user what to change. "localhost" is bound on 127.0.0.1 and ::1 both
// (listenLocalhost).
func Listen(network, addr string, allowRemote bool, flagName string, allowFlag ...string) (net.Listener, error) {
	if strings.HasPrefix(network, "tcp") {
		if err := CheckLoopback(addr, allowRemote, flagName, allowFlag...); err != nil {
			return nil, err
		}
		if host, port, err := net.SplitHostPort(addr); err == nil && host == "localhost" && network == "tcp" {
			n, err := strconv.Atoi(port)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: the port is not a number", flagName, addr)
			}
			ln, err := listenLocalhost(n)
			if err != nil {
				return nil, fmt.Errorf("%s: listen on %s: %w", flagName, addr, err)
			}
			return ln, nil
		}
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", flagName, addr, err)
	}
	return ln, nil
}

// CheckLoopback returns an error unless addr (host:port) is a loopback address, "localhost", or allowRemote is
// set. An empty host means every interface, which is remote. allowFlag names the flag that permits it
// (default --allow-remote).
func CheckLoopback(addr string, allowRemote bool, flagName string, allowFlag ...string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s: %q is not host:port: %w", flagName, addr, err)
	}
	// A mistyped IP address would be looked up in DNS when the listener binds.
	if err := address.MistypedIP(host); err != nil {
		return fmt.Errorf("%s: %w", flagName, err)
	}
	if allowRemote || address.IsLoopbackHost(host) {
		return nil
	}
	shown := host
	if shown == "" {
		shown = "all interfaces"
	}
	allow := "--allow-remote"
	if len(allowFlag) > 0 && allowFlag[0] != "" {
		allow = allowFlag[0]
	}
	return fmt.Errorf("%s: refusing to listen on %s (%s is not loopback); pass %s if you really mean it", flagName, addr, shown, allow)
}
