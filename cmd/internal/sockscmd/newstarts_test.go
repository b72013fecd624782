package sockscmd

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/konnect-dev/konnect/test/harness"
)

// TestNewStartsNoGoroutine: New binds every listener and prepares the SSH dialer, but starts nothing: Run
// does. A proxy that New made and Close released, without running, leaves no goroutine behind.
func TestNewStartsNoGoroutine(t *testing.T) {
	dir := t.TempDir()
	key := harness.SSHKeyFile(t, dir, "id_ed25519")
	o := NewOptions()
	o.DynamicForward = "127.0.0.1:0"
	o.HTTPListen = "127.0.0.1:0"
	o.HealthListen = "127.0.0.1:0"
	o.SSH.IdentityFiles = []string{key}
	o.SSH.KnownHostsFile = filepath.Join(dir, "known_hosts")
	o.SSH.ConfigFile = "none"
	o.SSH.Connections = 4
	o.Destination = "127.0.0.1" // never dialled: New does not connect
	cfg, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.SSH.AgentSocket = "none"

	harness.NewStartsNothing(t, func() (io.Closer, error) { return New(t.Context(), cfg) })
}
