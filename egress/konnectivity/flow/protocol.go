package flow

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// The per-connection flow-control extension of the Konnectivity agent protocol; docs/flow-control.md is its
// specification. An agent offers it in the metadata of its Connect stream, and a server that takes it up
// answers in its response headers. Only then does either side send GrantType packets, so a peer that does
// not know the extension (upstream's proxy-server or proxy-agent) never sees one.
const (
	// Header is the metadata key of the offer and of the answer, for example "v1;window=65536;max=4194304":
	// the version, the window the sender of the header grants every new connection in the direction towards
	// itself, and the largest window it will ever grant one.
	Header = "konnect-flow-control"
	// Version is the only version there is.
	Version = "v1"
	// None is what metrics and logs call a stream without the extension, next to Version for one with it.
	None = "none"
	// GrantType is the packet type of a grant: a Packet with this Type and a Data payload whose ConnectID is
	// 0 and whose Data holds pairs of unsigned varints, (connection ID, bytes), each giving that many more
	// bytes of credit for that connection.
	GrantType client.PacketType = 100
)

// Offer is one side's window settings, as sent in Header.
type Offer struct {
	Window int // every new connection's window, in bytes
	Max    int // the largest window of any connection
}

func (o Offer) String() string {
	return fmt.Sprintf("%s;window=%d;max=%d", Version, o.Window, o.Max)
}

// Validate checks an offer against the protocol's bounds.
func (o Offer) Validate() error {
	if o.Window < MinWindow || o.Window > MaxWindow {
		return fmt.Errorf("window %d is outside %d to %d bytes", o.Window, MinWindow, MaxWindow)
	}
	if o.Max < o.Window || o.Max > MaxWindow {
		return fmt.Errorf("largest window %d is outside %d (the window) to %d bytes", o.Max, o.Window, MaxWindow)
	}
	return nil
}

// ParseOffer reads a peer's offers: the values of Header, one version's offer each, in the peer's order of
// preference. It takes the first of a version it knows (there is only v1) and skips the others, so that a
// later peer that offers a newer version first still gets v1 here. No offer of a version it knows is not an
// error: the peer does not speak one, and ok is false. A v1 offer that is malformed or out of bounds is an
// error.
func ParseOffer(values []string) (o Offer, ok bool, err error) {
	for _, v := range offers(values) {
		if version(v) == Version {
			return parseV1(v)
		}
	}
	return Offer{}, false, nil
}

// ParseAnswer reads a server's answer to an agent's offer of Version alone. No answer is not an error: the
// server did not take flow control up (upstream's), and ok is false. An answer is one value, of a version
// the agent offered: anything else is an error, since the two sides would then disagree on whether grants
// flow, and the server could wait for credit the agent never sends.
func ParseAnswer(values []string) (o Offer, ok bool, err error) {
	vs := offers(values)
	switch {
	case len(vs) == 0:
		return Offer{}, false, nil
	case len(vs) > 1:
		return Offer{}, false, fmt.Errorf("%s answer %q: more than one value; an answer names the one version chosen", Header, vs)
	case version(vs[0]) != Version:
		return Offer{}, false, fmt.Errorf("%s answer %q: version %q was not offered (offered %s)", Header, vs[0], version(vs[0]), Version)
	}
	return parseV1(vs[0])
}

// offers splits the values of Header into single offers. gRPC lets a proxy join the values of a key with
// commas, which is why no offer contains one.
func offers(values []string) []string {
	var out []string
	for _, v := range values {
		for _, o := range strings.Split(v, ",") {
			if o = strings.TrimSpace(o); o != "" {
				out = append(out, o)
			}
		}
	}
	return out
}

// version is the version an offer is of: its first field.
func version(offer string) string {
	v, _, _ := strings.Cut(offer, ";")
	return v
}

// parseV1 reads one v1 offer. Fields it does not know are skipped whatever their value, or with none: they
// are for later extensions of v1, and refusing them would cut this version off from every peer that uses
// one.
func parseV1(offer string) (o Offer, ok bool, err error) {
	fields := strings.Split(offer, ";")
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		var dst *int
		switch k {
		case "window":
			dst = &o.Window
		case "max":
			dst = &o.Max
		default:
			continue
		}
		n, perr := strconv.Atoi(v)
		if perr != nil {
			return Offer{}, false, fmt.Errorf("%s %q: %s is not a number", Header, offer, k)
		}
		*dst = n
	}
	if err := o.Validate(); err != nil {
		return Offer{}, false, fmt.Errorf("%s %q: %w", Header, offer, err)
	}
	return o, true, nil
}

// ErrBadGrant: a GrantType packet that does not decode.
var ErrBadGrant = errors.New("flow control: malformed grant packet")

// EncodeGrants makes one GrantType packet of the grants, in connection order.
func EncodeGrants(grants map[int64]int64) *client.Packet {
	ids := make([]int64, 0, len(grants))
	for id := range grants {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b := make([]byte, 0, len(ids)*8)
	for _, id := range ids {
		b = protowire.AppendVarint(b, uint64(id))
		b = protowire.AppendVarint(b, uint64(grants[id]))
	}
	return &client.Packet{Type: GrantType, Payload: &client.Packet_Data{Data: &client.Data{Data: b}}}
}

// DecodeGrants calls fn with each (connection, bytes) pair of a GrantType packet, and stops at the first
// error fn returns.
func DecodeGrants(pkt *client.Packet, fn func(id, n int64) error) error {
	d := pkt.GetData()
	if d == nil || d.ConnectID != 0 {
		return ErrBadGrant
	}
	b := d.Data
	for len(b) > 0 {
		id, k := protowire.ConsumeVarint(b)
		if k < 0 {
			return ErrBadGrant
		}
		b = b[k:]
		n, k := protowire.ConsumeVarint(b)
		if k < 0 || n > MaxWindow || id > 1<<63-1 {
			return ErrBadGrant
		}
		b = b[k:]
		if err := fn(int64(id), int64(n)); err != nil {
			return err
		}
	}
	return nil
}

// Grants gathers the grants of every connection on one stream and sends them as few packets as the stream
// takes: while one is being sent, the next ones pile up, and go out together. It needs no goroutine while
// nothing is owed, which matters on a server that holds thousands of idle agents.
type Grants struct {
	send func(*client.Packet) error

	mu      sync.Mutex
	pending map[int64]int64
	running bool
	stopped bool
}

// NewGrants returns a batcher that sends with send, which must be safe to call alongside the stream's other
// senders.
func NewGrants(send func(*client.Packet) error) *Grants {
	return &Grants{send: send, pending: map[int64]int64{}}
}

// Add owes connection id n more bytes of credit.
func (g *Grants) Add(id int64, n int) {
	if n <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	g.pending[id] += int64(n)
	if !g.running {
		g.running = true
		go g.flush()
	}
}

// Forget drops what is owed to a connection that is gone.
func (g *Grants) Forget(id int64) {
	g.mu.Lock()
	delete(g.pending, id)
	g.mu.Unlock()
}

// Stop drops everything owed, and every later Add: the stream has ended.
func (g *Grants) Stop() {
	g.mu.Lock()
	g.stopped = true
	clear(g.pending)
	g.mu.Unlock()
}

func (g *Grants) flush() {
	for {
		g.mu.Lock()
		if len(g.pending) == 0 || g.stopped {
			g.running = false
			g.mu.Unlock()
			return
		}
		pkt := EncodeGrants(g.pending)
		clear(g.pending)
		g.mu.Unlock()
		if err := g.send(pkt); err != nil {
			g.Stop()
		}
	}
}
