package agent

import (
	"net/netip"
	"strings"
	"testing"
)

func TestAllowList(t *testing.T) {
	var l AllowList
	for _, s := range []string{"10.0.0.0/8:443,8443", "198.19.0.10:1-65535", "fd00::/8:6443"} {
		d, err := ParseDestination(s)
		if err != nil {
			t.Fatal(err)
		}
		l = append(l, d)
	}
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"10.1.2.3:443", true},
		{"10.1.2.3:8443", true},
		{"10.1.2.3:22", false},
		{"11.0.0.1:443", false},
		{"198.19.0.10:1", true},
		{"198.19.0.11:1", false},
		{"[fd00::5]:6443", true},
		{"[fd00::5]:443", false},
		{"[::ffff:10.0.0.1]:443", true}, // v4-mapped is the v4 address
	} {
		ap := netip.MustParseAddrPort(tc.addr)
		if got := l.Allows(ap.Addr(), ap.Port()); got != tc.want {
			t.Errorf("Allows(%s) = %v", tc.addr, got)
		}
		if got := l.check(tc.addr) == nil; got != tc.want {
			t.Errorf("check(%s) allowed = %v", tc.addr, got)
		}
	}
	if AllowList(nil).check("1.2.3.4:5") != nil {
		t.Error("an empty list must allow everything")
	}
	if err := l.check("example.com:22"); err != nil {
		t.Errorf("names are checked at connect time, not before: %v", err)
	}
}

func TestSplitServers(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  bool
	}{
		{"127.0.0.1", "127.0.0.1:8091", false},
		{"a.example,b.example:9", "a.example:8091 b.example:9", false},
		{"::1", "[::1]:8091", false},
		{"[::1]:9", "[::1]:9", false},
		{"a:0", "", true},
		{" , ", "", true},
		{"999.1.1.1", "", true},
		{"a.example.", "a.example.:8091", false},
		{"a.example,999.1.1.1:9", "", true},
		// Addresses nobody can dial to reach a server.
		{"0.0.0.0", "", true},
		{"::", "", true},
		{"[::]:9", "", true},
		{"0.0.0.0:8132", "", true},
		{"a.example,224.0.0.1", "", true},
		{"ff02::1", "", true},
		{"255.255.255.255", "", true},
		{"::ffff:0.0.0.0", "", true},
		{"10.255.255.255", "10.255.255.255:8091", false},
	} {
		got, err := SplitServers(tc.in, 8091)
		if (err != nil) != tc.err || strings.Join(got, " ") != tc.want {
			t.Errorf("SplitServers(%q) = %q, %v", tc.in, got, err)
		}
	}
}

// New refuses a server address that no dial reaches a server at, as --proxy-server-host does.
func TestNewRefusesUndialableServers(t *testing.T) {
	for _, s := range []string{"0.0.0.0:8132", "[::]:8132", "224.0.0.1:8132", "255.255.255.255:8132", "[::ffff:0.0.0.0]:8132"} {
		_, err := New(Config{Servers: []string{"127.0.0.1:8132", s}, AgentID: "a"})
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("server %s: %v, want an error naming it", s, err)
		}
	}
}
