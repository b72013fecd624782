package proxycmd

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/konnect-dev/konnect/socks/apiproxy"
)

// TestNames: apiproxy's errors read with kubectl proxy's flags, as `konnect proxy` prints them.
func TestNames(t *testing.T) {
	for _, c := range []struct {
		cfg  apiproxy.HandlerConfig
		want string
	}{
		{apiproxy.HandlerConfig{APIPrefix: "api/"}, "--api-prefix: "},
		{apiproxy.HandlerConfig{APIPrefix: "/", StaticDir: ".", StaticPrefix: "/a b/"}, "--www-prefix: "},
		{apiproxy.HandlerConfig{APIPrefix: "/x/", StaticDir: ".", StaticPrefix: "/x/"}, `--www-prefix: "/x/" is also the API prefix (--api-prefix)`},
		{apiproxy.HandlerConfig{APIPrefix: "/", REST: &rest.Config{Host: "https://dev:s3cret-pw@127.0.0.1:abc"}},
			"the API server's URL (the kubeconfig's server, or --server) "},
		{apiproxy.HandlerConfig{APIPrefix: "/", REST: &rest.Config{Host: "dev:s3cret-pw@127.0.0.1:6443/some/path"}},
			"the API server's URL (the kubeconfig's server, or --server) "},
	} {
		if c.cfg.REST == nil {
			c.cfg.REST = &rest.Config{Host: "https://127.0.0.1:1"}
		}
		_, err := apiproxy.NewHandler(c.cfg)
		if err == nil {
			t.Fatalf("NewHandler(prefix %q, server %q) succeeded", c.cfg.APIPrefix, c.cfg.REST.Host)
		}
		if got := names.Error(err).Error(); !strings.HasPrefix(got, c.want) || strings.Contains(got, "s3cret-pw") {
			t.Errorf("NewHandler(prefix %q, server %q): %q, want it to start %q", c.cfg.APIPrefix, c.cfg.REST.Host, got, c.want)
		}
	}
}
