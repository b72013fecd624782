package initcmd

import (
	"slices"
	"testing"

	"github.com/konnect-dev/konnect/pki"
)

// TestRenewalSteps pins the "next:" steps of konnect certs renew, which come from the Feeds of each
// certificate's pki.Spec row: a reader that reads the file again gets none, and a step shared by several
// certificates has the same words for each, so that renew all prints it once.
func TestRenewalSteps(t *testing.T) {
	const (
		server = "restart the konnectivity-server static pod, or run konnect init again, whose new manifest kubelet restarts it for: its file mounts keep the certificates and kubeconfig it started with"
		bundle = "run konnect init again and re-apply DIR/konnectivity-agent: "
	)
	want := map[string][]string{
		pki.CA:                       {server, bundle + "its ConfigMap carries ca.crt to the agents"},
		pki.FrontProxyCA:             nil,
		pki.FrontProxyClient:         nil,
		pki.KonnectivityServerClient: {server},
		pki.KonnectivityServer:       {server},
		pki.KonnectivityAgentCA:      {server},
		pki.KonnectivityAgent:        {bundle + "its Secret carries the agents' certificate"},
		pki.KonnectivityFrontend:     {server},
		pki.APIServerEgressClient:    {"restart kube-apiserver: it loads its egress client certificate only when it starts"},
		"tls":                        nil, // an extension server's, in a directory of konnect certs apiservice
	}
	for name, w := range want {
		if got := renewalSteps(name); !slices.Equal(got, w) {
			t.Errorf("%s: steps %q, want %q", name, got, w)
		}
	}
	// A row added later gets one step for each reader that does not read the file again.
	for _, s := range pki.Specs() {
		n := 0
		for _, f := range s.Feeds {
			if f.Restart != "" {
				n++
			}
		}
		if got := renewalSteps(s.Name); len(got) != n {
			t.Errorf("%s: steps %q for feeds %+v", s.Name, got, s.Feeds)
		}
	}
}
