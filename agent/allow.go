package agent

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"

	"github.com/konnect-dev/konnect/egress/konnectivity"
)

// Destination is one --allow-destination entry: an address prefix and the ports allowed in it.
type Destination struct {
	Prefix netip.Prefix
	Ports  []PortRange
}

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ First, Last uint16 }

// AllowList restricts the backends the agent dials. The zero value (no entries) allows everything, as
// upstream's agent does.
type AllowList []Destination

// ParseDestination parses "CIDR:PORTS", where PORTS is a comma-separated list of ports and ranges, for
// example "10.0.0.0/8:443,8443", "198.19.0.0/16:1-65535" or "fd00::/8:6443". A bare address is taken as a
// single-host prefix.
func ParseDestination(s string) (Destination, error) {
	i := strings.LastIndex(s, ":")
	if i <= 0 || i == len(s)-1 {
		return Destination{}, fmt.Errorf("%q is not CIDR:PORTS (for example 10.0.0.0/8:443,8443)", s)
	}
	cidr, ports := s[:i], s[i+1:]
	var d Destination
	var err error
	if strings.Contains(cidr, "/") {
		d.Prefix, err = netip.ParsePrefix(strings.Trim(cidr, "[]"))
	} else {
		var a netip.Addr
		a, err = netip.ParseAddr(strings.Trim(cidr, "[]"))
		if err == nil {
			d.Prefix = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return Destination{}, fmt.Errorf("%q: bad address prefix: %w", s, err)
	}
	d.Prefix = d.Prefix.Masked()
	for _, p := range strings.Split(ports, ",") {
		first, last, isRange := strings.Cut(strings.TrimSpace(p), "-")
		lo, err := parsePort(first)
		if err != nil {
			return Destination{}, fmt.Errorf("%q: %w", s, err)
		}
		hi := lo
		if isRange {
			if hi, err = parsePort(last); err != nil {
				return Destination{}, fmt.Errorf("%q: %w", s, err)
			}
			if hi < lo {
				return Destination{}, fmt.Errorf("%q: port range %d-%d is reversed", s, lo, hi)
			}
		}
		d.Ports = append(d.Ports, PortRange{lo, hi})
	}
	return d, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("bad port %q (want 1-65535)", s)
	}
	return uint16(n), nil
}

func (d Destination) String() string {
	var b strings.Builder
	b.WriteString(d.Prefix.String())
	for i, r := range d.Ports {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(r.First)))
		if r.Last != r.First {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(int(r.Last)))
		}
	}
	return b.String()
}

// Allows reports whether ip:port may be dialled.
func (l AllowList) Allows(ip netip.Addr, port uint16) bool {
	if len(l) == 0 {
		return true
	}
	ip = ip.Unmap()
	for _, d := range l {
		if !d.Prefix.Contains(ip) {
			continue
		}
		for _, r := range d.Ports {
			if port >= r.First && port <= r.Last {
				return true
			}
		}
	}
	return false
}

// check refuses a literal address outside the list before anything is dialled. Host names pass here and
// are checked, address by address, by control when the socket is about to connect.
func (l AllowList) check(address string) error {
	if len(l) == 0 {
		return nil
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("konnect agent: bad dial address %q: %w", address, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return nil
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || !l.Allows(ip, uint16(p)) {
		return konnectivity.NotAllowed(address)
	}
	return nil
}

// control is a net.Dialer Control hook: it runs before connect(2) for every address a name resolved to, so a
// name cannot be used to reach a destination outside the list.
func (l AllowList) control(_, address string, _ syscall.RawConn) error {
	if len(l) == 0 {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !l.Allows(ap.Addr(), ap.Port()) {
		return konnectivity.NotAllowed(address)
	}
	return nil
}
