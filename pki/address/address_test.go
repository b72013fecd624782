package address

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
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
		err := Validate(tc.addr)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.addr, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error with %q", tc.addr, err, tc.want)
		}
	}
}

// TestCheckDialable: addresses a listener binds to or that reach many hosts are not where a client dials
// one control plane, in any spelling.
func TestCheckDialable(t *testing.T) {
	for _, a := range []string{"0.0.0.0", "::", "::ffff:0.0.0.0", "224.0.0.1", "239.255.255.250", "ff02::1", "ff05::2", "::ffff:224.0.0.1", "255.255.255.255", "::ffff:255.255.255.255"} {
		if err := CheckDialable(a); err == nil || !strings.Contains(err.Error(), a) {
			t.Errorf("%s: %v, want a refusal naming it", a, err)
		}
	}
	for _, a := range []string{"198.18.0.1", "127.0.0.1", "::1", "fd00::1", "10.255.255.255", "cp.example.com"} {
		if err := CheckDialable(a); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
}
