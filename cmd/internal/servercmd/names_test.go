package servercmd

import (
	"errors"
	"fmt"
	"testing"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/uds"
)

// TestNames: every Config field the tunnel's errors name has a flag, and the error reads with it.
func TestNames(t *testing.T) {
	for _, tc := range []struct {
		err  *field.Error
		want string
	}{
		{field.Errorf("{Mode}: boom"), "--mode"},
		{field.Errorf("{AgentAddr}: boom"), "--agent-bind-address/--agent-port"},
		{field.Errorf("{ServerAddr}: boom"), "--server-bind-address/--server-port"},
		{field.Errorf("{UDSName}: boom"), "--uds-name"},
		{field.Errorf("{ClusterCert}: boom"), "--cluster-cert/--cluster-key/--cluster-ca-cert"},
		{field.Errorf("{ServerCert}: boom"), "--server-cert/--server-key/--server-ca-cert"},
		{field.Errorf("{ClusterAllowedNames}: boom"), "--cluster-allowed-names (with --cluster-ca-cert)"},
		{field.Errorf("{ServerAllowedNames}: boom"), "--server-allowed-names (with --server-ca-cert)"},
		{field.Errorf("{AgentAuth}: boom"), "--cluster-ca-cert or --agent-namespace/--agent-service-account/--authentication-audience (or --allow-unauthenticated-agents)"},
		{field.Errorf("{FlowWindow}: boom"), "--flow-control-window-bytes/--flow-control-max-window-bytes"},
		{field.Errorf("{TokenAuth.Client}: boom"), "--kubeconfig"},
	} {
		if got := flagError(tc.err).Error(); got != tc.want+": boom" {
			t.Errorf("%s: %q, want %q", tc.err.Fields(), got, tc.want+": boom")
		}
	}
	stale := field.Errorf("{UDSName}: %w", fmt.Errorf("/run/s.sock: %w", uds.ErrStale))
	err := flagError(stale)
	if want := "--uds-name: /run/s.sock: " + uds.ErrStale.Error() + "; remove it or pass --delete-existing-uds-file"; err.Error() != want {
		t.Errorf("stale socket: %q, want %q", err, want)
	}
	if !errors.Is(err, uds.ErrStale) {
		t.Errorf("stale socket: %v is not uds.ErrStale", err)
	}
}
