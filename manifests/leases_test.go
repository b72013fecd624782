package manifests

import (
	"slices"
	"strings"
	"testing"
)

// TestNoLeaseFlagsNoLeaseRBAC: konnect init's manifests turn neither upstream lease flag on (the server's
// --enable-lease-controller, the agents' --count-server-leases), so least privilege means they grant nothing
// on coordination.k8s.io Leases either. Whoever turns the flags on adds the Roles that README.md lists (the
// e2e test TestServerLeases runs with exactly those against a real kube-apiserver).
func TestNoLeaseFlagsNoLeaseRBAC(t *testing.T) {
	cert, key := testPEM(t, "agent")
	for _, s := range []Server{grpcServer(), tcpServer()} {
		args := s.Args()
		for _, flag := range []string{"--enable-lease-controller", "--lease-namespace", "--lease-label"} {
			if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, flag) }) {
				t.Errorf("server (%s) runs with %s: %q", s.Mode, flag, args)
			}
		}
		f, err := s.Render()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(f.Data), "lease") {
			t.Errorf("server pod mentions leases:\n%s", f.Data)
		}
	}
	for _, a := range []Agent{
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1"},
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", ClientCert: cert, ClientKey: key},
	} {
		args := a.Args()
		for _, flag := range []string{"--count-server-leases", "--lease-namespace", "--lease-label", "--kubeconfig"} {
			if slices.ContainsFunc(args, func(s string) bool { return strings.HasPrefix(s, flag) }) {
				t.Errorf("agent runs with %s: %q", flag, args)
			}
		}
		files, err := a.Render()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.Contains(string(f.Data), "coordination.k8s.io") || strings.Contains(string(f.Data), "leases") {
				t.Errorf("%s grants or names leases:\n%s", f.Name, f.Data)
			}
		}
	}
}
