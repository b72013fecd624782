//go:build !linux

package agent

import "net"

// ackedBytes cannot tell elsewhere: a write that completes is then the only sign of progress.
func ackedBytes(net.Conn) (uint64, bool) { return 0, false }
