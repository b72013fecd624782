package kubeapiserver

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/uds"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/apiserver/v1beta1"
	"sigs.k8s.io/yaml"
)

// Mode is the protocol kube-apiserver speaks to the Konnectivity server (the --mode flag of konnect init
// and of the server; initcmd makes it a flag value).
type Mode string

// Modes, spelled as the upstream proxy-server's --mode flag spells them.
const (
	ModeGRPC        Mode = "grpc"
	ModeHTTPConnect Mode = "http-connect"
)

// String returns the flag spelling of m.
func (m Mode) String() string { return string(m) }

// ParseMode parses "grpc" or "http-connect".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeGRPC, ModeHTTPConnect:
		return m, nil
	}
	return "", field.Errorf("{Mode} %q: must be %q or %q", s, ModeGRPC, ModeHTTPConnect)
}

// protocol maps m to the proxyProtocol value of the EgressSelectorConfiguration.
func (m Mode) protocol() v1beta1.ProtocolType {
	if m == ModeHTTPConnect {
		return v1beta1.ProtocolHTTPConnect
	}
	return v1beta1.ProtocolGRPC
}

// Transport is how kube-apiserver reaches the Konnectivity server (the --transport flag of konnect init,
// which makes it a flag value).
type Transport string

// Transports.
const (
	TransportUDS Transport = "uds"
	TransportTCP Transport = "tcp"
)

// String returns the flag spelling of t.
func (t Transport) String() string { return string(t) }

// ParseTransport parses "uds" or "tcp".
func ParseTransport(s string) (Transport, error) {
	switch t := Transport(s); t {
	case TransportUDS, TransportTCP:
		return t, nil
	}
	return "", field.Errorf("{Transport} %q: must be %q or %q", s, TransportUDS, TransportTCP)
}

const (
	// SelectionName is the egress selection that carries kube-apiserver's traffic to the cluster: the
	// aggregator, webhooks, and the kubelet (logs, exec, port-forward) all dial through it.
	SelectionName = "cluster"

	// DefaultUDSName is where kube-apiserver finds the Konnectivity server's unix socket; it is the path
	// the Kubernetes documentation uses.
	DefaultUDSName = "/etc/kubernetes/konnectivity-server/konnectivity-server.socket"

	// DefaultFrontendPort is the TCP port of the Konnectivity server's kube-apiserver-facing frontend with
	// --transport tcp; it is upstream proxy-server's --server-port default.
	DefaultFrontendPort = konnectivity.FrontendPort
)

// SelectorConfig says how kube-apiserver reaches the Konnectivity server. The zero Mode and Transport mean
// grpc over uds.
type SelectorConfig struct {
	Mode      Mode
	Transport Transport

	// UDSName is the absolute path of the Konnectivity server's unix socket (--transport uds). Empty means
	// DefaultUDSName.
	UDSName string

	// URL is the Konnectivity server's frontend, https://HOST:PORT (--transport tcp).
	URL string
	// CABundle, ClientCert and ClientKey are files kube-apiserver reads for mutual TLS with the frontend
	// (--transport tcp): the CA that signed the frontend's serving cert, and kube-apiserver's client
	// certificate and key.
	CABundle   string
	ClientCert string
	ClientKey  string
	// TLSServerName, if set, is the name checked in the frontend's certificate instead of URL's host.
	TLSServerName string
}

// withDefaults fills the zero values that have defaults.
func (c SelectorConfig) withDefaults() SelectorConfig {
	if c.Mode == "" {
		c.Mode = ModeGRPC
	}
	if c.Transport == "" {
		c.Transport = TransportUDS
	}
	if c.Transport == TransportUDS && c.UDSName == "" {
		c.UDSName = DefaultUDSName
	}
	return c
}

// Validate reports the first reason kube-apiserver would refuse c, or nil.
func (c SelectorConfig) Validate() error {
	c = c.withDefaults()
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if _, err := ParseTransport(string(c.Transport)); err != nil {
		return err
	}
	switch c.Transport {
	case TransportUDS:
		if err := uds.CheckPath(c.UDSName); err != nil {
			return fmt.Errorf("egress selector: %w", err)
		}
		if c.URL != "" || c.CABundle != "" || c.ClientCert != "" || c.ClientKey != "" || c.TLSServerName != "" {
			return field.Errorf("egress selector: a URL and TLS files apply only to {Transport} %s", TransportTCP)
		}
	case TransportTCP:
		if c.Mode == ModeGRPC {
			return field.Errorf("egress selector: {Mode} %s with {Transport} %s is not supported by kube-apiserver "+
				"(GRPC works only over a unix socket); use {Transport} %s, or {Mode} %s for TCP",
				ModeGRPC, TransportTCP, TransportUDS, ModeHTTPConnect)
		}
		if err := validateFrontendURL(c.URL); err != nil {
			return err
		}
		for _, f := range []struct{ name, path string }{
			{"caBundle", c.CABundle}, {"clientCert", c.ClientCert}, {"clientKey", c.ClientKey},
		} {
			if f.path == "" {
				return field.Errorf("egress selector: %s file is required for mutual TLS over {Transport} %s", f.name, TransportTCP)
			}
			if !filepath.IsAbs(f.path) {
				return fmt.Errorf("egress selector: %s file %q must be an absolute path (kube-apiserver resolves it from its own working directory)", f.name, f.path)
			}
		}
	}
	return nil
}

// validateFrontendURL accepts https://HOST:PORT with nothing else: the Konnectivity frontend is reached with
// mutual TLS, and kube-apiserver ignores a path.
func validateFrontendURL(raw string) error {
	if raw == "" {
		return field.Errorf("egress selector: the Konnectivity server URL (https://HOST:PORT) is required with {Transport} %s", TransportTCP)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("egress selector: Konnectivity server URL %q: %w", raw, err)
	}
	if u.Scheme != "https" {
		return fmt.Errorf("egress selector: Konnectivity server URL %q: scheme must be https (mutual TLS)", raw)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("egress selector: Konnectivity server URL %q: only https://HOST:PORT is allowed", raw)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return fmt.Errorf("egress selector: Konnectivity server URL %q: want https://HOST:PORT", raw)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("egress selector: Konnectivity server URL %q: bad port %q", raw, port)
	}
	return nil
}

// Configuration builds the typed EgressSelectorConfiguration for c: one selection, "cluster".
func (c SelectorConfig) Configuration() (*v1beta1.EgressSelectorConfiguration, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	transport := &v1beta1.Transport{}
	switch c.Transport {
	case TransportUDS:
		transport.UDS = &v1beta1.UDSTransport{UDSName: c.UDSName}
	case TransportTCP:
		transport.TCP = &v1beta1.TCPTransport{
			URL: c.URL,
			TLSConfig: &v1beta1.TLSConfig{
				CABundle:      c.CABundle,
				ClientCert:    c.ClientCert,
				ClientKey:     c.ClientKey,
				TLSServerName: c.TLSServerName,
			},
		}
	}
	return &v1beta1.EgressSelectorConfiguration{
		TypeMeta: metav1.TypeMeta{
			APIVersion: v1beta1.SchemeGroupVersion.String(),
			Kind:       "EgressSelectorConfiguration",
		},
		EgressSelections: []v1beta1.EgressSelection{{
			Name: SelectionName,
			Connection: v1beta1.Connection{
				ProxyProtocol: c.Mode.protocol(),
				Transport:     transport,
			},
		}},
	}, nil
}

// Marshal renders c as the YAML file kube-apiserver reads with --egress-selector-config-file.
func (c SelectorConfig) Marshal() ([]byte, error) {
	cfg, err := c.Configuration()
	if err != nil {
		return nil, err
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("egress selector: marshal: %w", err)
	}
	return out, nil
}
