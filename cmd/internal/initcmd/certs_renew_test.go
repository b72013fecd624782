package initcmd

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki"
)

// TestRenewalSteps pins the "next:" steps of konnect certs renew, which come from the Feeds of each
// certificate's pki.Spec row: a reader that reads the file again gets none, and a step shared by several
// certificates has the same words for each, so that renew all prints it once. A reader that uses a
// certificate only in some set-ups (the cluster CA as kube-apiserver's egress caBundle, with --transport
// tcp) gets its step only where that set-up's certificate is present.
func TestRenewalSteps(t *testing.T) {
	uds := func(string) bool { return false }
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
		if got := renewalSteps(name, uds); !slices.Equal(got, w) {
			t.Errorf("%s: steps %q, want %q", name, got, w)
		}
	}
	tcp := func(name string) bool { return name == pki.APIServerEgressClient }
	caTCP := append(slices.Clone(want[pki.CA]), "restart kube-apiserver: it loads its egress caBundle only when it starts, and that copy expires with the old CA")
	if got := renewalSteps(pki.CA, tcp); !slices.Equal(got, caTCP) {
		t.Errorf("%s with --transport tcp: steps %q, want %q", pki.CA, got, caTCP)
	}
	// A row added later gets one step for each reader that does not read the file again.
	all := func(string) bool { return true }
	for _, s := range pki.Specs() {
		n := 0
		for _, f := range s.Feeds {
			if f.Restart != "" {
				n++
			}
		}
		if got := renewalSteps(s.Name, all); len(got) != n {
			t.Errorf("%s: steps %q for feeds %+v", s.Name, got, s.Feeds)
		}
	}
}

// A lifetime of less than minValidity makes certificates that the next run finds expired (1ns gave
// notAfter = now): init and certs renew refuse it, naming the flag, and write nothing.
func TestValidityMinimum(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{initArgs(dir, "--cert-validity-period", "1ns"), "--cert-validity-period 1ns: must be at least 1h0m0s"},
		{initArgs(dir, "--cert-validity-period", "59m"), "--cert-validity-period 59m0s: must be at least 1h0m0s"},
		{initArgs(dir, "--ca-validity-period", "10m", "--cert-validity-period", "1m"), "--ca-validity-period 10m0s: must be at least 1h0m0s"},
		{[]string{"init", "phase", "certs", "--dir", dir, "--control-plane-address", "198.18.0.1", "--cert-validity-period", "1s"}, "--cert-validity-period 1s: must be at least"},
		{[]string{"certs", "renew", "all", "--dir", dir, "--cert-validity-period", "1ns"}, "--cert-validity-period 1ns: must be at least"},
		{[]string{"certs", "renew", "all", "--dir", dir, "--ca-validity-period", "1ns"}, "--ca-validity-period 1ns: must be at least"},
	} {
		out, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("konnect %s: %v, want %q\n%s", strings.Join(tc.args, " "), err, tc.want, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("refused runs wrote into %s: %v", dir, entries)
	}
	// An hour is enough.
	mustRun(t, initArgs(dir, "--ca-validity-period", "1h", "--cert-validity-period", "1h")...)
}
