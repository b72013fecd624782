// Package localproxy is what konnect's two local proxies (the SOCKS server and apiproxy) share: the cap on
// client connections, the answer to a dial that failed (which hop, which status), and the rate-limited log of
// those failures.
package localproxy

// ConnLimit caps how many client connections are served at once. It is the one cap of konnect's local
// proxies: socks.Server takes a slot per connection it serves, and apiproxy (konnect proxy) does the same in
// its listener; each answers a connection over the cap in its own protocol. The zero value is not usable; call
// NewConnLimit.
type ConnLimit struct {
	slots chan struct{}
}

// NewConnLimit returns a cap of n connections (at least 1).
func NewConnLimit(n int) *ConnLimit {
	return &ConnLimit{slots: make(chan struct{}, max(n, 1))}
}

// TryAcquire takes a slot if one is free, without waiting. Every true result needs one Release.
func (l *ConnLimit) TryAcquire() bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// Release frees a slot taken by TryAcquire.
func (l *ConnLimit) Release() { <-l.slots }

// Active is the number of slots taken.
func (l *ConnLimit) Active() int { return len(l.slots) }

// Max is the cap.
func (l *ConnLimit) Max() int { return cap(l.slots) }
