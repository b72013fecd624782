package kubeapiserver

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/konnect-dev/konnect/egress/konnectivity"
)

// KonnectivityAudience is the service-account token audience that Konnectivity agents present and the
// server checks (--authentication-audience). The server names it in each TokenReview, and kube-apiserver
// checks a review against the audiences it names, so kube-apiserver's --api-audiences must not list it:
// there it would make every agent's token a credential for kube-apiserver's own API.
const KonnectivityAudience = konnectivity.Audience

// Flag is one kube-apiserver command-line flag. Name has no leading dashes.
type Flag struct {
	Name  string
	Value string
}

// String renders f as kube-apiserver reads it: --name=value.
func (f Flag) String() string { return "--" + f.Name + "=" + f.Value }

// APIServerFlags are the inputs of the kube-apiserver flags that the aggregation layer (Kubernetes
// documentation, "Configure the Aggregation Layer") and the Konnectivity tunnel need. File paths are as
// kube-apiserver sees them.
type APIServerFlags struct {
	// RequestHeaderClientCAFile is the front-proxy CA certificate: extension API servers trust requests
	// signed by it (--requestheader-client-ca-file).
	RequestHeaderClientCAFile string
	// ProxyClientCertFile and ProxyClientKeyFile are kube-apiserver's front-proxy client certificate and key
	// (CN front-proxy-client), used when it proxies to extension API servers.
	ProxyClientCertFile string
	ProxyClientKeyFile  string
	// EgressSelectorConfigFile is the file SelectorConfig.Marshal rendered.
	EgressSelectorConfigFile string
	// EnableAggregatorRouting makes the aggregator dial endpoint IPs instead of the service's cluster IP;
	// needed when no kube-proxy runs on the control-plane node.
	EnableAggregatorRouting bool
}

const aggregatorRoutingFlag = "enable-aggregator-routing"

// egressSelectorFlag names the egress selector configuration, which kube-apiserver reads only at start-up.
const egressSelectorFlag = "egress-selector-config-file"

// OptionalFlags are the flags that Flags returns only on request: a patch that no longer asks for one takes
// it out again where konnect added it (ManifestPatch.Optional).
var OptionalFlags = []string{aggregatorRoutingFlag}

// Flags returns the flags in a fixed order. Every file path must be absolute: kube-apiserver resolves
// relative paths from its own working directory, which is not the caller's.
func (c APIServerFlags) Flags() ([]Flag, error) {
	flags := []Flag{
		{"requestheader-client-ca-file", c.RequestHeaderClientCAFile},
		// The CN of the front-proxy client certificate; extension API servers refuse any other.
		{"requestheader-allowed-names", "front-proxy-client"},
		{"requestheader-extra-headers-prefix", "X-Remote-Extra-"},
		{"requestheader-group-headers", "X-Remote-Group"},
		{"requestheader-username-headers", "X-Remote-User"},
		{"requestheader-uid-headers", "X-Remote-Uid"},
		{"proxy-client-cert-file", c.ProxyClientCertFile},
		{"proxy-client-key-file", c.ProxyClientKeyFile},
		{egressSelectorFlag, c.EgressSelectorConfigFile},
	}
	if c.EnableAggregatorRouting {
		flags = append(flags, Flag{aggregatorRoutingFlag, "true"})
	}
	// The *-file flags are also what PatchPod mounts into the kube-apiserver pod.
	for _, f := range flags {
		if !strings.HasSuffix(f.Name, "-file") {
			continue
		}
		if f.Value == "" {
			return nil, fmt.Errorf("kube-apiserver flags: --%s needs a file path", f.Name)
		}
		if !filepath.IsAbs(f.Value) {
			return nil, fmt.Errorf("kube-apiserver flags: --%s=%s: path must be absolute", f.Name, f.Value)
		}
		if strings.ContainsAny(f.Value, "\n\r") {
			return nil, fmt.Errorf("kube-apiserver flags: --%s: path contains a line break", f.Name)
		}
	}
	return flags, nil
}

// mergeList returns base followed by the members of extra that base lacks, refusing values that cannot sit
// in the comma-separated flag --name.
func mergeList(name string, base, extra []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, a := range append(append([]string(nil), base...), extra...) {
		a = strings.TrimSpace(a)
		if a == "" || seen[a] {
			continue
		}
		if strings.ContainsAny(a, ", \t\n\r") {
			return nil, fmt.Errorf("kube-apiserver flags: --%s: %q must not contain a comma or white space", name, a)
		}
		seen[a] = true
		out = append(out, a)
	}
	return out, nil
}

// MarshalFlags renders flags one per line, as --name=value, for the kube-apiserver.flags file.
func MarshalFlags(flags []Flag) []byte {
	var b bytes.Buffer
	for _, f := range flags {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	return b.Bytes()
}
