package kubeapiserver

import (
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func testFlags() APIServerFlags {
	return APIServerFlags{
		RequestHeaderClientCAFile: "/etc/kubernetes/pki/front-proxy-ca.crt",
		ProxyClientCertFile:       "/etc/kubernetes/pki/front-proxy-client.crt",
		ProxyClientKeyFile:        "/etc/kubernetes/pki/front-proxy-client.key",
		EgressSelectorConfigFile:  "/etc/kubernetes/egress-selector-configuration.yaml",
	}
}

func TestFlags(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(*APIServerFlags)
		routed bool
	}{
		{name: "defaults", edit: func(*APIServerFlags) {}},
		{name: "aggregator routing", edit: func(f *APIServerFlags) { f.EnableAggregatorRouting = true }, routed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := testFlags()
			tc.edit(&in)
			flags, err := in.Flags()
			if err != nil {
				t.Fatal(err)
			}
			want := []Flag{
				{"requestheader-client-ca-file", "/etc/kubernetes/pki/front-proxy-ca.crt"},
				{"requestheader-allowed-names", "front-proxy-client"},
				{"requestheader-extra-headers-prefix", "X-Remote-Extra-"},
				{"requestheader-group-headers", "X-Remote-Group"},
				{"requestheader-username-headers", "X-Remote-User"},
				{"requestheader-uid-headers", "X-Remote-Uid"},
				{"proxy-client-cert-file", "/etc/kubernetes/pki/front-proxy-client.crt"},
				{"proxy-client-key-file", "/etc/kubernetes/pki/front-proxy-client.key"},
				{"egress-selector-config-file", "/etc/kubernetes/egress-selector-configuration.yaml"},
			}
			if tc.routed {
				want = append(want, Flag{"enable-aggregator-routing", "true"})
			}
			if !reflect.DeepEqual(flags, want) {
				t.Errorf("Flags() =\n%v\nwant\n%v", flags, want)
			}
		})
	}
}

func TestFlagsRefuseBadInput(t *testing.T) {
	tests := []struct {
		name string
		edit func(*APIServerFlags)
		want string
	}{
		{"missing front-proxy CA", func(f *APIServerFlags) { f.RequestHeaderClientCAFile = "" }, "--requestheader-client-ca-file"},
		{"relative proxy client key", func(f *APIServerFlags) { f.ProxyClientKeyFile = "pki/front-proxy-client.key" }, "--proxy-client-key-file"},
		{"missing egress config", func(f *APIServerFlags) { f.EgressSelectorConfigFile = "" }, "--egress-selector-config-file"},
		{"newline in path", func(f *APIServerFlags) { f.ProxyClientCertFile = "/a\n--anonymous-auth=true" }, "line break"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := testFlags()
			tc.edit(&in)
			if _, err := in.Flags(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Flags() error = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// The written file parses with the flag types kube-apiserver declares for these flags (string slices for
// the request-header lists, a bool for aggregator routing), one flag per line.
func TestMarshalFlagsParsesAsKubeAPIServerFlags(t *testing.T) {
	in := testFlags()
	in.EnableAggregatorRouting = true
	flags, err := in.Flags()
	if err != nil {
		t.Fatal(err)
	}
	data := MarshalFlags(flags)
	if !strings.HasSuffix(string(data), "\n") || strings.Count(string(data), "\n") != len(flags) {
		t.Fatalf("want one flag per line:\n%s", data)
	}

	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	var (
		caFile, certFile, keyFile, egressFile          string
		allowedNames, extraPrefix, groups, users, uids []string
		routing                                        bool
	)
	fs.StringVar(&caFile, "requestheader-client-ca-file", "", "")
	fs.StringSliceVar(&allowedNames, "requestheader-allowed-names", nil, "")
	fs.StringSliceVar(&extraPrefix, "requestheader-extra-headers-prefix", nil, "")
	fs.StringSliceVar(&groups, "requestheader-group-headers", nil, "")
	fs.StringSliceVar(&users, "requestheader-username-headers", nil, "")
	fs.StringSliceVar(&uids, "requestheader-uid-headers", nil, "")
	fs.StringVar(&certFile, "proxy-client-cert-file", "", "")
	fs.StringVar(&keyFile, "proxy-client-key-file", "", "")
	fs.StringVar(&egressFile, "egress-selector-config-file", "", "")
	fs.BoolVar(&routing, "enable-aggregator-routing", false, "")
	if err := fs.Parse(strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")); err != nil {
		t.Fatalf("parse %q: %v", data, err)
	}
	if len(fs.Args()) != 0 {
		t.Errorf("stray arguments: %q", fs.Args())
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"requestheader-client-ca-file", caFile, in.RequestHeaderClientCAFile},
		{"requestheader-allowed-names", allowedNames, []string{"front-proxy-client"}},
		{"requestheader-extra-headers-prefix", extraPrefix, []string{"X-Remote-Extra-"}},
		{"requestheader-group-headers", groups, []string{"X-Remote-Group"}},
		{"requestheader-username-headers", users, []string{"X-Remote-User"}},
		{"requestheader-uid-headers", uids, []string{"X-Remote-Uid"}},
		{"proxy-client-cert-file", certFile, in.ProxyClientCertFile},
		{"proxy-client-key-file", keyFile, in.ProxyClientKeyFile},
		{"egress-selector-config-file", egressFile, in.EgressSelectorConfigFile},
		{"enable-aggregator-routing", routing, true},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("--%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}
