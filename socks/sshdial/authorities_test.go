package sshdial

import (
	"testing"

	"golang.org/x/crypto/ssh/knownhosts"
)

func TestMatchHost(t *testing.T) {
	for _, c := range []struct {
		host     string
		patterns []string
		want     bool
	}{
		{"bastion.example.com", []string{"*.example.com"}, true},
		{"bastion.example.com", []string{"*.EXAMPLE.com"}, true},
		{"example.com", []string{"*.example.com"}, false},
		{"[10.0.0.1]:2222", []string{"[10.0.0.1]:*"}, true},
		{"[10.0.0.1]:2222", []string{"10.0.0.?"}, false},
		{"10.0.0.1", []string{"10.0.0.?"}, true},
		{"10.0.0.12", []string{"10.0.0.?"}, false},
		{"db.example.com", []string{"*.example.com", "!db.example.com"}, false},
		{"db.example.com", []string{"!db.example.com"}, false},
		{"web.example.com", []string{"*.example.com", "!db.example.com"}, true},
		{"web.example.com", []string{knownhosts.HashHostname("web.example.com")}, true},
		{"db.example.com", []string{knownhosts.HashHostname("web.example.com")}, false},
		{"a", []string{"**a*"}, true},
		{"", []string{"*"}, true},
	} {
		if got := matchHost(c.host, c.patterns); got != c.want {
			t.Errorf("matchHost(%q, %q) = %v, want %v", c.host, c.patterns, got, c.want)
		}
	}
}

func TestMatchNames(t *testing.T) {
	for addr, want := range map[string][]string{
		"Bastion.Example.com:22": {"bastion.example.com"},
		"10.0.0.1:2222":          {"[10.0.0.1]:2222", "10.0.0.1"},
		"[fd00::1]:2222":         {"[fd00::1]:2222", "fd00::1"},
	} {
		got := matchNames(addr)
		if len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("matchNames(%q) = %q, want %q", addr, got, want)
		}
	}
}

// The copy of a known_hosts file that knownhosts reads has its host names in lower case, as OpenSSH matches
// them, and nothing else changed: not a hashed name's base64, a marker, a key or a comment.
func TestLowerHostPatterns(t *testing.T) {
	for _, c := range []struct {
		line, want string
		upper      bool
	}{
		{"MyHost,[Web.Example]:2222 ssh-ed25519 AAAAC3Nz KeyComment", "myhost,[web.example]:2222 ssh-ed25519 AAAAC3Nz KeyComment", true},
		{"  @cert-authority *.Corp.Example ssh-ed25519 AAAAC3Nz", "  @cert-authority *.corp.example ssh-ed25519 AAAAC3Nz", true},
		{"@revoked !Bad,* ssh-ed25519 AAAAC3Nz", "@revoked !bad,* ssh-ed25519 AAAAC3Nz", true},
		{"|1|AbC=|DeF= ssh-ed25519 AAAAC3Nz", "|1|AbC=|DeF= ssh-ed25519 AAAAC3Nz", false},
		{"host ssh-ed25519 AAAAC3Nz Comment", "host ssh-ed25519 AAAAC3Nz Comment", false},
		{"# A Comment", "# A Comment", false},
	} {
		if got := hasUpperHostPattern([]byte(c.line)); got != c.upper {
			t.Errorf("hasUpperHostPattern(%q) = %v", c.line, got)
		}
		b := []byte(c.line)
		lowerHostPatterns(b)
		if string(b) != c.want {
			t.Errorf("lowerHostPatterns(%q) = %q, want %q", c.line, b, c.want)
		}
	}
}
