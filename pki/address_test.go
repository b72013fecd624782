package pki

import (
	"strings"
	"testing"
)

func TestValidateAddress(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want string // "" accepts; otherwise a substring of the error
	}{
		{"10.0.0.1", ""},
		{"fd00::1", ""},
		{"cp.example.com", ""},
		{"node-1", ""},
		{"1.example.com", ""},
		{"999.1.1.1", "looks like an IP address"},
		{"10.0.0", "looks like an IP address"},
		{"1.2.3.4.5", "looks like an IP address"},
		{"256.0.0.1", "looks like an IP address"},
		{"fd00::1::2", "looks like an IP address"},
		{"example.com:6443", "looks like an IP address"},
		{"bad address", "neither an IP address nor a DNS name"},
	} {
		err := ValidateAddress(tc.addr)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.addr, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error with %q", tc.addr, err, tc.want)
		}
	}
	// Nor does such a value reach a certificate's SANs by another path.
	an := buildAltNames([]string{"999.1.1.1", "10.0.0.1", "cp.example.com"})
	if len(an.DNSNames) != 1 || an.DNSNames[0] != "cp.example.com" || len(an.IPs) != 1 {
		t.Errorf("buildAltNames: %+v", an)
	}
}
