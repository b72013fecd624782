package pki

import "testing"

// TestBuildAltNamesDropsMistypedIPs: a value that looks like an IP address but is not one reaches no
// certificate's SANs, by any path.
func TestBuildAltNamesDropsMistypedIPs(t *testing.T) {
	an := buildAltNames([]string{"999.1.1.1", "10.0.0.1", "cp.example.com"})
	if len(an.DNSNames) != 1 || an.DNSNames[0] != "cp.example.com" || len(an.IPs) != 1 {
		t.Errorf("buildAltNames: %+v", an)
	}
}
