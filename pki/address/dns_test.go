package address

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// TestDNSRuleIsKubernetes: the package's copy of the RFC 1123 subdomain rule accepts and refuses what
// Kubernetes' does, with the same messages, so that leaving out apimachinery changed no answer.
func TestDNSRuleIsKubernetes(t *testing.T) {
	for _, v := range []string{
		"", "a", "example.com", "cp-1.example.com", "1.example.com", "Example.com", "-a.com", "a-.com", "a..b",
		"a_b", ".a", "a.", "a b", "ü.example", strings.Repeat("a", 63) + "." + strings.Repeat("b", 189),
		strings.Repeat("a.", 126) + "bc", strings.Repeat("a", 254), strings.Repeat("A", 254),
	} {
		if got, want := isDNS1123Subdomain(v), validation.IsDNS1123Subdomain(v); !slices.Equal(got, want) {
			t.Errorf("%q: %q, want %q", v, got, want)
		}
	}
}
