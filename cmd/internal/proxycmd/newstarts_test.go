package proxycmd

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/konnect-dev/konnect/test/harness"
	"github.com/spf13/pflag"
)

// TestNewStartsNoGoroutine: New loads the kubeconfig's credentials, binds the listeners and, with --via,
// prepares the SSH dialer, but starts nothing: Run does. A proxy that New made and Close released, without
// running, leaves no goroutine behind. Each kind of credential is tried, client-go's oidc plugin included.
func TestNewStartsNoGoroutine(t *testing.T) {
	b := newBackend(t)
	dir := t.TempDir()
	key := harness.SSHKeyFile(t, dir, "id_ed25519")
	via := []string{"--via", "127.0.0.1", "-i", key, "--known-hosts", filepath.Join(dir, "known_hosts"), "-F", "none"}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"client certificate", []string{"--context", "cert", "--port", "0"}},
		{"token", []string{"--context", "token", "--port", "0"}},
		{"oidc", []string{"--context", "oidc", "--port", "0"}},
		{"via SSH with health endpoints", append([]string{"--context", "cert", "--port", "0", "--health-listen", "127.0.0.1:0"}, via...)},
		{"unix socket", []string{"--context", "token", "--unix-socket", filepath.Join(dir, "proxy.sock")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("SSH_AUTH_SOCK", "")
			o := NewOptions()
			fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(append([]string{"--kubeconfig", b.kubeconfig(t, "cert")}, c.args...)); err != nil {
				t.Fatal(err)
			}
			cfg, err := o.Config()
			if err != nil {
				t.Fatal(err)
			}
			harness.NewStartsNothing(t, func() (io.Closer, error) { return New(t.Context(), cfg) })
		})
	}
}
