package initcmd

import (
	"strconv"
	"testing"

	"github.com/konnect-dev/konnect/cmd/internal/buildinfo"
	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/spf13/pflag"
)

// TestFlagDefaults pins every default, so that a change in behaviour is always deliberate.
func TestFlagDefaults(t *testing.T) {
	fs := pflag.NewFlagSet("init", pflag.ContinueOnError)
	o := NewOptions()
	o.Image = "IMAGE" // depends on the build
	o.AddFlags(fs)
	want := map[string]string{
		"dir":                       "/etc/kubernetes",
		"control-plane-address":     "[]",
		"key-algorithm":             "rsa-2048",
		"ca-validity-period":        "87600h0m0s",
		"cert-validity-period":      "8760h0m0s",
		"apiserver-url":             "",
		"mode":                      "grpc",
		"transport":                 "uds",
		"uds-name":                  "/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
		"allow-shared-uds-dir":      "false",
		"frontend-port":             "8090",
		"agent-auth":                "token",
		"server-leases":             "false",
		"image":                     "IMAGE",
		"api-audiences":             "[]",
		"enable-aggregator-routing": "false",
		"apiserver-manifest":        "",
		"kubeadm":                   "false",
		"kubeadm-kubeconfig":        "/etc/kubernetes/admin.conf",
		"force":                     "false",
		"dry-run":                   "false",
	}
	fs.VisitAll(func(f *pflag.Flag) {
		w, ok := want[f.Name]
		if !ok {
			t.Errorf("flag --%s has no pinned default", f.Name)
			return
		}
		if f.DefValue != w {
			t.Errorf("--%s default %q, want %q", f.Name, f.DefValue, w)
		}
		delete(want, f.Name)
	})
	for name := range want {
		t.Errorf("flag --%s is gone", name)
	}
}

// The default image is the one `make image` tags for this binary's version, never ":latest".
func TestDefaultImageFollowsVersion(t *testing.T) {
	old := buildinfo.Version
	t.Cleanup(func() { buildinfo.Version = old })
	for _, v := range []string{"v1.2.3", "850191f-dirty", "devel"} {
		buildinfo.Version = v
		want := "ghcr.io/konnect-dev/konnect:" + v
		if got := defaultImage(); got != want {
			t.Errorf("version %s: default image %q, want %q", v, got, want)
		}
		if got := NewOptions().Image; got != want {
			t.Errorf("version %s: NewOptions().Image %q, want %q", v, got, want)
		}
	}
}

func TestUDSDefaultFollowsDir(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "/etc/kubernetes/konnectivity-server/konnectivity-server.socket"},
		{[]string{"--dir", "/srv/k"}, "/srv/k/konnectivity-server/konnectivity-server.socket"},
		{[]string{"--dir", "/srv/k", "--uds-name", "/run/k.sock"}, "/run/k.sock"},
	} {
		fs := pflag.NewFlagSet("init", pflag.ContinueOnError)
		o := NewOptions()
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := o.Complete(fs); err != nil {
			t.Fatal(err)
		}
		if o.UDSName != tc.want {
			t.Errorf("%v: --uds-name %q, want %q", tc.args, o.UDSName, tc.want)
		}
	}
}

// TestSharedNamesAgree: the library packages may not import one another, so each spells the names the
// others rely on itself. This package wires them together and checks that they still agree: a drift
// would make kube-apiserver reject the agents' tokens, or RBAC grant the wrong user.
func TestSharedNamesAgree(t *testing.T) {
	client, ok := pki.Lookup(pki.Specs(), pki.KonnectivityServerClient)
	if !ok {
		t.Fatalf("no %s spec", pki.KonnectivityServerClient)
	}
	for _, c := range []struct{ what, got, want string }{
		{"token audience (egress, manifests)", kubeapiserver.KonnectivityAudience, manifests.Audience},
		{"server user (pki certificate CN, manifests RBAC)", client.CommonName, manifests.ServerUser},
		{"frontend port (egress, manifests)", strconv.Itoa(kubeapiserver.DefaultFrontendPort), strconv.Itoa(manifests.DefaultFrontendPort)},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q and %q differ", c.what, c.got, c.want)
		}
	}
}
