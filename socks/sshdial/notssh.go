package sshdial

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
)

// versionWatchBytes is how much of what a server sends first is kept to tell whether it speaks SSH: RFC 4253
// allows lines before the version line, but the version line itself is at most 255 bytes.
const versionWatchBytes = 512

// versionWatch is a net.Conn that keeps the first bytes the server sends, so that a failed handshake can say
// whether the peer is an SSH server at all.
type versionWatch struct {
	net.Conn
	mu   sync.Mutex
	seen []byte
	full bool
}

func (v *versionWatch) Read(p []byte) (int, error) {
	n, err := v.Conn.Read(p)
	if n > 0 {
		v.mu.Lock()
		if !v.full {
			v.seen = append(v.seen, p[:min(n, versionWatchBytes-len(v.seen))]...)
			v.full = len(v.seen) >= versionWatchBytes
		}
		v.mu.Unlock()
	}
	return n, err
}

// notSSH returns a *NotSSHError when the server sent no SSH-2.0 (or SSH-1.99) version line before the
// handshake failed, and nil when it did.
func (v *versionWatch) notSSH(endpoint string, err error) error {
	v.mu.Lock()
	seen := append([]byte(nil), v.seen...)
	v.mu.Unlock()
	var first string
	for i, line := range bytes.Split(seen, []byte("\n")) {
		l := strings.TrimRight(string(line), "\r")
		if strings.HasPrefix(l, "SSH-2.0-") || strings.HasPrefix(l, "SSH-1.99-") {
			return nil
		}
		if i == 0 {
			first = l
		}
		if strings.HasPrefix(l, "SSH-") {
			first = l
			break
		}
	}
	return &NotSSHError{Endpoint: endpoint, Sent: first, Err: err}
}

// NotSSHError is a handshake that failed before the server sent an SSH version line: the peer closed the
// connection without a word (not an SSH server, or one that turns connections away) or answered in another
// protocol. Before any connection was up it is taken for a wrong host or port.
type NotSSHError struct {
	Endpoint string // user@host:port
	Sent     string // the first line the peer sent ("" when nothing), or its SSH line of another version
	Err      error
}

func (e *NotSSHError) Error() string {
	switch {
	case e.Sent == "":
		return fmt.Sprintf("%s closed the connection before sending an SSH version line (%v): not an SSH server, or one that turns connections away",
			e.Endpoint, e.Err)
	case strings.HasPrefix(e.Sent, "SSH-"):
		return fmt.Sprintf("%s speaks an SSH protocol version other than 2.0: it sent %q", e.Endpoint, clip(e.Sent))
	default:
		return fmt.Sprintf("%s is not an SSH server: it answered %q where an SSH version line was expected", e.Endpoint, clip(e.Sent))
	}
}

func (e *NotSSHError) Unwrap() error { return e.Err }

// clip shortens what a peer sent for an error message.
func clip(s string) string {
	const n = 60
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
