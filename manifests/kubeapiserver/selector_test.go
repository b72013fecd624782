package kubeapiserver

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki/field"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/server/egressselector"
)

// load writes data to a file and reads it back with kube-apiserver's own loader and validation.
func load(t *testing.T, data []byte) (*apiserver.EgressSelectorConfiguration, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "egress-selector-configuration.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := egressselector.ReadEgressSelectorConfiguration(path)
	if err != nil {
		return nil, err
	}
	if errs := egressselector.ValidateEgressSelectorConfiguration(cfg); len(errs) > 0 {
		return cfg, errs.ToAggregate()
	}
	return cfg, nil
}

// tlsFiles creates the three files kube-apiserver's validation insists exist for mutual TLS.
func tlsFiles(t *testing.T) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	ca, cert, key = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "apiserver-egress-client.crt"), filepath.Join(dir, "apiserver-egress-client.key")
	for _, f := range []string{ca, cert, key} {
		if err := os.WriteFile(f, []byte("placeholder\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}

func TestSelectorVariantsLoadInKubeAPIServer(t *testing.T) {
	ca, cert, key := tlsFiles(t)
	tests := []struct {
		name     string
		cfg      SelectorConfig
		protocol apiserver.ProtocolType
		uds      string
		url      string
	}{
		{
			name:     "zero value is grpc over the default socket",
			cfg:      SelectorConfig{},
			protocol: apiserver.ProtocolGRPC,
			uds:      DefaultUDSName,
		},
		{
			name:     "grpc over uds",
			cfg:      SelectorConfig{Mode: ModeGRPC, Transport: TransportUDS, UDSName: "/run/konnect/konnectivity-server.socket"},
			protocol: apiserver.ProtocolGRPC,
			uds:      "/run/konnect/konnectivity-server.socket",
		},
		{
			name:     "http-connect over uds",
			cfg:      SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportUDS},
			protocol: apiserver.ProtocolHTTPConnect,
			uds:      DefaultUDSName,
		},
		{
			name: "http-connect over tcp with mutual TLS",
			cfg: SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:8090",
				CABundle: ca, ClientCert: cert, ClientKey: key, TLSServerName: "konnectivity-server"},
			protocol: apiserver.ProtocolHTTPConnect,
			url:      "https://127.0.0.1:8090",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, err := tc.cfg.Marshal()
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if !strings.HasPrefix(string(data), "apiVersion: apiserver.k8s.io/v1beta1\n") {
				t.Errorf("rendered file does not start with the v1beta1 apiVersion:\n%s", data)
			}
			cfg, err := load(t, data)
			if err != nil {
				t.Fatalf("kube-apiserver's loader refused the file: %v\n%s", err, data)
			}
			if len(cfg.EgressSelections) != 1 {
				t.Fatalf("got %d egress selections, want 1", len(cfg.EgressSelections))
			}
			sel := cfg.EgressSelections[0]
			if sel.Name != "cluster" {
				t.Errorf("selection name = %q, want cluster", sel.Name)
			}
			conn := sel.Connection
			if conn.ProxyProtocol != tc.protocol {
				t.Errorf("proxyProtocol = %q, want %q", conn.ProxyProtocol, tc.protocol)
			}
			if conn.Transport == nil {
				t.Fatal("transport is missing")
			}
			if tc.uds != "" {
				if conn.Transport.UDS == nil || conn.Transport.UDS.UDSName != tc.uds || conn.Transport.TCP != nil {
					t.Errorf("transport = %+v, want only uds %q", conn.Transport, tc.uds)
				}
			}
			if tc.url != "" {
				tcp := conn.Transport.TCP
				if tcp == nil || conn.Transport.UDS != nil {
					t.Fatalf("transport = %+v, want only tcp", conn.Transport)
				}
				if tcp.URL != tc.url {
					t.Errorf("url = %q, want %q", tcp.URL, tc.url)
				}
				tls := tcp.TLSConfig
				if tls == nil || tls.CABundle != ca || tls.ClientCert != cert || tls.ClientKey != key || tls.TLSServerName != "konnectivity-server" {
					t.Errorf("tlsConfig = %+v, want caBundle %s, clientCert %s, clientKey %s", tls, ca, cert, key)
				}
			}
		})
	}
}

// The loader's validation is what the test above leans on; make sure it is really checking, by feeding it
// a TCP configuration whose TLS files do not exist.
func TestKubeAPIServerValidationIsEffective(t *testing.T) {
	dir := t.TempDir()
	cfg := SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:8090",
		CABundle: filepath.Join(dir, "missing-ca.crt"), ClientCert: filepath.Join(dir, "missing.crt"), ClientKey: filepath.Join(dir, "missing.key")}
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := load(t, data); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("validation of missing TLS files: got %v, want a 'does not exist' error", err)
	}
}

func TestSelectorRefusesWhatKubeAPIServerRefuses(t *testing.T) {
	ca, cert, key := tlsFiles(t)
	long := "/" + strings.Repeat("d", 120) + "/s.socket"
	tests := []struct {
		name  string
		cfg   SelectorConfig
		want  string
		field string // the Config field a *field.Error names, if any
	}{
		{"grpc over tcp", SelectorConfig{Mode: ModeGRPC, Transport: TransportTCP, URL: "https://127.0.0.1:8090", CABundle: ca, ClientCert: cert, ClientKey: key}, "not supported by kube-apiserver", ""},
		{"zero mode over tcp is grpc", SelectorConfig{Transport: TransportTCP, URL: "https://127.0.0.1:8090", CABundle: ca, ClientCert: cert, ClientKey: key}, "not supported by kube-apiserver", ""},
		{"unknown mode", SelectorConfig{Mode: "socks5"}, `"socks5": must be`, "Mode"},
		{"unknown transport", SelectorConfig{Transport: "quic"}, `"quic": must be`, "Transport"},
		{"relative socket", SelectorConfig{UDSName: "konnectivity-server.socket"}, "absolute", ""},
		{"socket path too long", SelectorConfig{UDSName: long}, "unix socket allows", ""},
		{"tls files with uds", SelectorConfig{CABundle: ca}, "only to Transport tcp", "Transport"},
		{"tcp without url", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, CABundle: ca, ClientCert: cert, ClientKey: key}, "URL", ""},
		{"tcp over plain http", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "http://127.0.0.1:8090", CABundle: ca, ClientCert: cert, ClientKey: key}, "https", ""},
		{"tcp url without port", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1", CABundle: ca, ClientCert: cert, ClientKey: key}, "HOST:PORT", ""},
		{"tcp url with path", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:8090/proxy", CABundle: ca, ClientCert: cert, ClientKey: key}, "only https://HOST:PORT", ""},
		{"tcp url port out of range", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:70000", CABundle: ca, ClientCert: cert, ClientKey: key}, "bad port", ""},
		{"tcp without client key", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:8090", CABundle: ca, ClientCert: cert}, "clientKey", ""},
		{"tcp without ca bundle", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:8090", ClientCert: cert, ClientKey: key}, "caBundle", ""},
		{"tcp with relative cert", SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, URL: "https://127.0.0.1:8090", CABundle: ca, ClientCert: "pki/x.crt", ClientKey: key}, "absolute", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.Marshal()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Marshal() error = %v, want one containing %q", err, tc.want)
			}
			var fe *field.Error
			if tc.field != "" && (!errors.As(err, &fe) || !slices.Contains(fe.Fields(), tc.field)) {
				t.Fatalf("Marshal() error = %v, want a field error naming %s", err, tc.field)
			}
		})
	}
}

func TestParseModeAndTransport(t *testing.T) {
	if m, err := ParseMode("http-connect"); err != nil || m != ModeHTTPConnect {
		t.Fatalf("ParseMode(http-connect) = %q, %v", m, err)
	}
	if _, err := ParseMode("HTTPConnect"); err == nil {
		t.Fatal("ParseMode(HTTPConnect) accepted the egress-selector spelling; the flag takes the proxy-server spelling")
	}
	if tr, err := ParseTransport("tcp"); err != nil || tr != TransportTCP {
		t.Fatalf("ParseTransport(tcp) = %q, %v", tr, err)
	}
	var fe *field.Error
	if _, err := ParseTransport("udp"); !errors.As(err, &fe) || !slices.Equal(fe.Fields(), []string{"Transport"}) {
		t.Fatalf("ParseTransport(udp) = %v, want an error naming Transport", err)
	}
}

func TestSelectorMountsAndFiles(t *testing.T) {
	if got := (SelectorConfig{}).UDSDir(); got != "/etc/kubernetes/konnectivity-server" {
		t.Errorf("UDSDir() = %q", got)
	}
	tcp := SelectorConfig{Mode: ModeHTTPConnect, Transport: TransportTCP, CABundle: "/a", ClientCert: "/b", ClientKey: "/c"}
	if got := tcp.UDSDir(); got != "" {
		t.Errorf("tcp UDSDir() = %q, want empty", got)
	}
	if got := strings.Join(tcp.Files(), " "); got != "/a /b /c" {
		t.Errorf("tcp Files() = %q", got)
	}
	if got := (SelectorConfig{}).Files(); got != nil {
		t.Errorf("uds Files() = %q, want none", got)
	}
}
