package pki

import (
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/pki/address"
)

// Default locations and lifetimes.
const (
	DefaultDir          = "/etc/kubernetes"
	PKISubdir           = "pki"
	KubeconfigFile      = "konnectivity-server.conf"
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
)

// Common names of the certificates that other programs match by name.
const (
	// ServerUser is the user name (certificate CN) the Konnectivity server authenticates to kube-apiserver as.
	ServerUser = "system:konnectivity-server"
	// AgentUser is the common name of the agents' client certificate (--agent-auth mtls).
	AgentUser = "konnectivity-agent"
	// EgressClientUser is the common name of kube-apiserver's client certificate towards the server's TCP
	// frontend.
	EgressClientUser = "apiserver-egress-client"
)

// Names of the specs in the table; other packages use them to find files.
const (
	CA                       = "ca"
	FrontProxyCA             = "front-proxy-ca"
	FrontProxyClient         = "front-proxy-client"
	KonnectivityServerClient = "konnectivity-server-client"
	KonnectivityServer       = "konnectivity-server"
	KonnectivityAgentCA      = "konnectivity-agent-ca"
	KonnectivityAgent        = "konnectivity-agent"
	KonnectivityFrontend     = "konnectivity-frontend"
	APIServerEgressClient    = "apiserver-egress-client"
)

// Config is what the specs are computed from.
type Config struct {
	// Dir is the konnect directory; certificates live in Dir/pki, the kubeconfig in Dir.
	Dir string
	// ControlPlaneAddresses are IP addresses or DNS names under which agents and kube-apiserver reach the
	// Konnectivity server. They become SANs of its serving certificates.
	ControlPlaneAddresses []string
	// Hostname of this node, added to the agent-facing serving certificate when it is a valid DNS name.
	Hostname string
	// KeyAlgorithm for new keys. Existing keys keep their algorithm.
	KeyAlgorithm KeyAlgorithm
	// CAValidity and CertValidity are the lifetimes of new CA and leaf certificates.
	CAValidity   time.Duration
	CertValidity time.Duration
	// AgentMTLS enables the konnectivity-agent client certificate (agents authenticate with mTLS rather
	// than a service-account token).
	AgentMTLS bool
	// FrontendTLS enables konnectivity-frontend and apiserver-egress-client: kube-apiserver reaches the
	// Konnectivity server over TCP with mutual TLS (HTTPConnect over TCP).
	FrontendTLS bool
	// Force renews a leaf whose existing files fail a check instead of returning an error.
	Force bool
	// DryRun computes what would be done and writes nothing.
	DryRun bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Progress, when set, is called by Ensure with each result as soon as it is final, in the order Ensure
	// returns them, so that a caller can report as it goes: an RSA-4096 key takes about a second to make.
	Progress func(Result)
}

// PKIDir is where the certificates and keys live.
func (c *Config) PKIDir() string { return filepath.Join(c.Dir, PKISubdir) }

// KubeconfigPath is the Konnectivity server's kubeconfig.
func (c *Config) KubeconfigPath() string { return filepath.Join(c.Dir, KubeconfigFile) }

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// withDefaults fills zero values.
func (c Config) withDefaults() Config {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if c.KeyAlgorithm == "" {
		c.KeyAlgorithm = RSA2048
	} else if a, err := ParseKeyAlgorithm(string(c.KeyAlgorithm)); err == nil {
		// ParseKeyAlgorithm ignores case, so Validate accepts "RSA-2048"; key generation matches exactly.
		c.KeyAlgorithm = a
	}
	if c.CAValidity == 0 {
		c.CAValidity = DefaultCAValidity
	}
	if c.CertValidity == 0 {
		c.CertValidity = DefaultCertValidity
	}
	return c
}

// Validate checks the inputs; errors name the Config field's meaning, callers add the flag name.
func (c *Config) Validate() error {
	if _, err := ParseKeyAlgorithm(string(c.KeyAlgorithm)); c.KeyAlgorithm != "" && err != nil {
		return err
	}
	for _, a := range c.ControlPlaneAddresses {
		if err := address.Validate(a); err != nil {
			return err
		}
	}
	if c.CAValidity < 0 || c.CertValidity < 0 {
		return fmt.Errorf("validity must not be negative (CA %s, certificate %s)", c.CAValidity, c.CertValidity)
	}
	if c.CAValidity != 0 && c.CertValidity != 0 && c.CertValidity > c.CAValidity {
		return fmt.Errorf("certificate validity %s exceeds CA validity %s", c.CertValidity, c.CAValidity)
	}
	return nil
}

// Spec describes one certificate and its key.
type Spec struct {
	// Name identifies the spec in phases, `certs renew` and reports.
	Name string
	// BaseName is the file name without extension: BaseName.crt, BaseName.key.
	BaseName string
	// Description is one line of help text.
	Description string
	// CA names the issuing spec; empty for a self-signed CA.
	CA string
	// FormerCA names the spec that issued this certificate in earlier releases. A certificate it signed is
	// re-signed by CA, keeping its key, without --force.
	FormerCA     string
	IsCA         bool
	CommonName   string
	Organization []string
	// Usages are the extended key usages of a leaf.
	Usages []x509.ExtKeyUsage
	// Enabled reports whether the inputs call for this certificate; nil means always.
	Enabled func(*Config) bool
	// AltNames computes the SANs from the inputs; nil means none.
	AltNames func(*Config) AltNames
	// Feeds are the programs that read the certificate once konnect init has written it, in the order their
	// steps are printed after a renewal; none for a certificate a person uses.
	Feeds []Feed
}

// A Reader uses a certificate's files once konnect init has written them.
type Reader int

const (
	KubeAPIServer Reader = iota + 1 // through its flags or its EgressSelectorConfiguration
	ServerPod                       // the Konnectivity server's static pod, which mounts each file (and its kubeconfig)
	AgentBundle                     // the agents' bundle, which carries it to the agents (kubectl apply -k)
)

// Feed is one reader of a certificate. Restart says why a renewed certificate reaches that reader only after
// a restart or a re-apply; empty when the reader reads the file again when it changes. With, when set, names
// the certificate whose presence in DIR/pki shows the set-up in which the reader uses this one.
type Feed struct {
	Reader  Reader
	Restart string
	With    string
}

// ServerMounts is why the Konnectivity server's pod needs a restart after a renewal.
const ServerMounts = "its file mounts keep the certificates and kubeconfig it started with"

// AltNames are subject alternative names.
type AltNames struct {
	DNSNames []string
	IPs      []net.IP
}

// CertFile and KeyFile are the spec's paths under dir.
func (s *Spec) CertFile(dir string) string { return filepath.Join(dir, s.BaseName+".crt") }
func (s *Spec) KeyFile(dir string) string  { return filepath.Join(dir, s.BaseName+".key") }

// IsEnabled reports whether cfg calls for this certificate.
func (s *Spec) IsEnabled(cfg *Config) bool { return s.Enabled == nil || s.Enabled(cfg) }

func (s *Spec) altNames(cfg *Config) AltNames {
	if s.AltNames == nil {
		return AltNames{}
	}
	return s.AltNames(cfg)
}

// Specs returns the certificate table, CAs before the leaves they sign. Each call builds fresh values, so
// callers may modify what they get.
func Specs() []*Spec {
	return []*Spec{
		{
			Name: CA, BaseName: "ca", IsCA: true, CommonName: "kubernetes-ca",
			Description: "cluster CA: signs the Konnectivity certificates (kept if present; external if only ca.crt exists)",
			Feeds: []Feed{{Reader: ServerPod, Restart: ServerMounts},
				{Reader: AgentBundle, Restart: "its ConfigMap carries ca.crt to the agents"},
				// With --transport tcp, kube-apiserver checks the server's frontend certificate against it.
				{Reader: KubeAPIServer, Restart: "it loads its egress caBundle only when it starts, and that copy expires with the old CA", With: APIServerEgressClient}},
		},
		{
			Name: FrontProxyCA, BaseName: "front-proxy-ca", IsCA: true, CommonName: "front-proxy-ca",
			Description: "aggregation-layer client CA (--requestheader-client-ca-file); must differ from the cluster CA",
			Feeds:       []Feed{{Reader: KubeAPIServer, Restart: ""}}, // it reloads --requestheader-client-ca-file
		},
		{
			Name: FrontProxyClient, BaseName: "front-proxy-client", CA: FrontProxyCA, CommonName: "front-proxy-client",
			Usages:      []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			Description: "client certificate kube-apiserver presents to extension API servers (--proxy-client-cert-file)",
			Feeds:       []Feed{{Reader: KubeAPIServer, Restart: ""}}, // it reloads --proxy-client-cert-file
		},
		{
			// No O=system:masters: the Konnectivity server only needs to review agent tokens, which RBAC grants.
			Name: KonnectivityServerClient, BaseName: "konnectivity-server-client", CA: CA, CommonName: ServerUser,
			Usages:      []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			Description: "client certificate the Konnectivity server uses towards kube-apiserver (embedded in " + KubeconfigFile + ")",
			Feeds:       []Feed{{Reader: ServerPod, Restart: ServerMounts}}, // in its kubeconfig
		},
		{
			Name: KonnectivityServer, BaseName: "konnectivity-server", CA: CA, CommonName: "konnectivity-server",
			Usages:      []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			Description: "serving certificate of the Konnectivity server's agent port (SANs: control-plane addresses, hostname, localhost, 127.0.0.1)",
			AltNames: func(c *Config) AltNames {
				return buildAltNames(append(slices.Clone(c.ControlPlaneAddresses), c.Hostname, "localhost", "127.0.0.1"))
			},
			Feeds: []Feed{{Reader: ServerPod, Restart: ServerMounts}},
		},
		{
			// Not the cluster CA: kube-apiserver trusts that one (--client-ca-file), and the agents' certificate,
			// with its key in a Secret on every node, would be a credential for kube-apiserver's API.
			Name: KonnectivityAgentCA, BaseName: "konnectivity-agent-ca", IsCA: true, CommonName: "konnectivity-agent-ca",
			Enabled:     func(c *Config) bool { return c.AgentMTLS },
			Description: "CA of the agents' client certificate, which only the Konnectivity server trusts (--cluster-ca-cert; only with mTLS agent authentication)",
			Feeds:       []Feed{{Reader: ServerPod, Restart: ServerMounts}},
		},
		{
			Name: KonnectivityAgent, BaseName: "konnectivity-agent", CA: KonnectivityAgentCA, FormerCA: CA, CommonName: AgentUser,
			Usages:      []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			Enabled:     func(c *Config) bool { return c.AgentMTLS },
			Description: "client certificate of the Konnectivity agents (only with mTLS agent authentication)",
			Feeds:       []Feed{{Reader: AgentBundle, Restart: "its Secret carries the agents' certificate"}},
		},
		{
			Name: KonnectivityFrontend, BaseName: "konnectivity-frontend", CA: CA, CommonName: "konnectivity-frontend",
			Usages:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			Enabled: func(c *Config) bool { return c.FrontendTLS },
			// Loopback too: kube-apiserver usually reaches a co-located Konnectivity server over 127.0.0.1.
			AltNames: func(c *Config) AltNames {
				return buildAltNames(append(slices.Clone(c.ControlPlaneAddresses), "localhost", "127.0.0.1"))
			},
			Description: "serving certificate of the Konnectivity server's kube-apiserver port (only HTTPConnect over TCP)",
			Feeds:       []Feed{{Reader: ServerPod, Restart: ServerMounts}},
		},
		{
			Name: APIServerEgressClient, BaseName: "apiserver-egress-client", CA: CA, CommonName: EgressClientUser,
			Usages:      []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			Enabled:     func(c *Config) bool { return c.FrontendTLS },
			Description: "client certificate kube-apiserver presents to the Konnectivity server (only HTTPConnect over TCP)",
			Feeds:       []Feed{{Reader: KubeAPIServer, Restart: "it loads its egress client certificate only when it starts"}},
		},
	}
}

// Lookup finds a spec by name.
func Lookup(specs []*Spec, name string) (*Spec, bool) {
	for _, s := range specs {
		if s.Name == name {
			return s, true
		}
	}
	return nil, false
}

// Names lists the names of specs.
func Names(specs []*Spec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Name
	}
	return out
}

// checkTable rejects a table in which a leaf names an unknown CA or comes before it.
func checkTable(specs []*Spec) error {
	seen := map[string]*Spec{}
	for _, s := range specs {
		if _, dup := seen[s.Name]; dup {
			return fmt.Errorf("certificate spec %q appears twice", s.Name)
		}
		if s.IsCA != (s.CA == "") {
			return fmt.Errorf("certificate spec %q: a CA is self-signed and a leaf names its CA", s.Name)
		}
		if s.CA != "" {
			ca, ok := seen[s.CA]
			if !ok || !ca.IsCA {
				return fmt.Errorf("certificate spec %q names CA %q, which is not a CA listed before it", s.Name, s.CA)
			}
		}
		seen[s.Name] = s
	}
	return nil
}

// buildAltNames sorts addresses into IPs and DNS names, dropping empty, invalid and duplicate entries.
func buildAltNames(addrs []string) AltNames {
	var an AltNames
	seen := map[string]bool{}
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		if ip := net.ParseIP(a); ip != nil {
			if !seen[ip.String()] {
				seen[ip.String()] = true
				an.IPs = append(an.IPs, ip)
			}
			continue
		}
		a = strings.ToLower(a)
		if a == "" || seen[a] || address.Validate(a) != nil {
			continue
		}
		seen[a] = true
		an.DNSNames = append(an.DNSNames, a)
	}
	return an
}
