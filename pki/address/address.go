// Package address checks the host names and IP addresses users give konnect: the one rule for an address (an
// IP address or a DNS name), addresses a client cannot dial, mistyped IP addresses, and loopback hosts. It
// imports nothing of Kubernetes, so that the SSH dialer can use it.
package address

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
)

// Validate is konnect's one check of an address flag: it accepts an IP address or a DNS name (RFC 1123
// subdomain). A value that looks like an IP address but is not one is refused, although it would pass as a
// DNS name and so land in a certificate's SANs, where it never matches: every dot-separated label is a
// number (999.1.1.1, 10.0.0) or it holds a colon (a mistyped IPv6 address).
func Validate(a string) error {
	if net.ParseIP(a) != nil {
		return nil
	}
	if err := MistypedIP(a); err != nil {
		return fmt.Errorf("address %w", err)
	}
	if errs := isDNS1123Subdomain(a); len(errs) > 0 {
		return fmt.Errorf("address %q is neither an IP address nor a DNS name: %s", a, strings.Join(errs, "; "))
	}
	return nil
}

// CheckDialable refuses an IP address that a client cannot dial to reach one host: the unspecified address
// (0.0.0.0, ::), which only a listener may use, a multicast address, and the IPv4 broadcast address, also
// spelt as IPv4-mapped IPv6. Anything else, DNS names included, passes; Validate checks the spelling.
func CheckDialable(a string) error {
	ip, err := netip.ParseAddr(a)
	if err != nil {
		return nil
	}
	ip = ip.Unmap()
	switch {
	case ip.IsUnspecified():
		return fmt.Errorf("%s is the unspecified address, which a listener binds to but nobody can dial", a)
	case ip.IsMulticast():
		return fmt.Errorf("%s is a multicast address, not one host's", a)
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("%s is the broadcast address, not one host's", a)
	}
	return nil
}

// MistypedIP refuses what looks like an IP address (dotted numbers, or a colon) but is not one, such as
// 999.1.1.1: taken for a host name, it would go to DNS. An address, also an IPv6 one with a zone, and anything
// else pass.
func MistypedIP(a string) error {
	if _, err := netip.ParseAddr(a); err == nil {
		return nil
	}
	if strings.Contains(a, ":") || allNumeric(strings.Split(a, ".")) {
		return fmt.Errorf("%q looks like an IP address but is not a valid one", a)
	}
	return nil
}

func allNumeric(labels []string) bool {
	for _, l := range labels {
		if l == "" || strings.Trim(l, "0123456789") != "" {
			return false
		}
	}
	return true
}

// IsLoopbackHost reports whether host is "localhost" or a loopback IP literal.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
}

// Kubernetes' rule for a DNS subdomain (RFC 1123), with its messages, as k8s.io/apimachinery's
// validation.IsDNS1123Subdomain has them; TestDNSRuleIsKubernetes holds the copy to the original.
const (
	dnsLabel           = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
	dnsSubdomain       = dnsLabel + "(\\." + dnsLabel + ")*"
	dnsSubdomainMaxLen = 253
	dnsSubdomainMsg    = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
)

var dnsSubdomainRegexp = regexp.MustCompile("^" + dnsSubdomain + "$")

func isDNS1123Subdomain(value string) []string {
	var errs []string
	if len(value) > dnsSubdomainMaxLen {
		errs = append(errs, fmt.Sprintf("must be no more than %d characters", dnsSubdomainMaxLen))
	}
	if !dnsSubdomainRegexp.MatchString(value) {
		errs = append(errs, dnsSubdomainMsg+" (e.g. 'example.com', regex used for validation is '"+dnsSubdomain+"')")
	}
	return errs
}
