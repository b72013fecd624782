// Package pkitest issues throwaway certificate authorities and leaf certificates for tests: ECDSA P-256
// keys, valid from an hour ago for a day unless the test asks otherwise. It is for tests only; konnect's own
// certificates come from package pki.
package pkitest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Spec describes one certificate.
type Spec struct {
	CN    string
	Orgs  []string
	Hosts []string // subject alternative names: IP addresses or DNS names

	CA     bool // may sign certificates
	Server bool // extended key usage serverAuth
	Client bool // extended key usage clientAuth

	NotBefore, NotAfter time.Time // zero: an hour ago, a day from now
}

// Cert is a certificate with its key, parsed and in PEM.
type Cert struct {
	Cert    *x509.Certificate
	Key     crypto.Signer // ECDSA P-256 for certificates issued here
	CertPEM []byte
	KeyPEM  []byte // SEC 1 ("EC PRIVATE KEY") for keys made here
}

// Issue signs a certificate for s with issuer, or self-signs it when issuer is nil. It returns errors rather
// than failing a test so that harnesses can build certificates outside one.
func Issue(issuer *Cert, s Spec) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	// Random serials: certificates reissued into the same file must differ, and tests compare them.
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: s.CN, Organization: s.Orgs},
		NotBefore:    s.NotBefore,
		NotAfter:     s.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = now.Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = now.Add(24 * time.Hour)
	}
	for _, h := range s.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if s.CA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	if s.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if s.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	parent, signer := tmpl, crypto.Signer(key)
	if issuer != nil {
		parent, signer = issuer.Cert, issuer.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", s.CN, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Cert{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

// NewCA returns a self-signed CA named cn.
func NewCA(t testing.TB, cn string) *Cert {
	t.Helper()
	return must(t)(Issue(nil, Spec{CN: cn, CA: true}))
}

// Issue signs a certificate for s with ca.
func (ca *Cert) Issue(t testing.TB, s Spec) *Cert {
	t.Helper()
	return must(t)(Issue(ca, s))
}

// Server issues a serving certificate for hosts.
func (ca *Cert) Server(t testing.TB, cn string, hosts ...string) *Cert {
	t.Helper()
	return ca.Issue(t, Spec{CN: cn, Hosts: hosts, Server: true})
}

// Client issues a client certificate.
func (ca *Cert) Client(t testing.TB, cn string, orgs ...string) *Cert {
	t.Helper()
	return ca.Issue(t, Spec{CN: cn, Orgs: orgs, Client: true})
}

// TLS returns the pair for a tls.Config.
func (c *Cert) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.Cert.Raw}, PrivateKey: c.Key, Leaf: c.Cert}
}

// Pool returns a pool that trusts c.
func (c *Cert) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Cert)
	return p
}

// Load reads a certificate and its key written by someone else (konnect init's CA, to sign more with).
func Load(certFile, keyFile string) (*Cert, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: key type %T cannot sign", keyFile, pair.PrivateKey)
	}
	c := &Cert{Cert: pair.Leaf, Key: signer}
	if c.CertPEM, err = os.ReadFile(certFile); err != nil {
		return nil, err
	}
	if c.KeyPEM, err = os.ReadFile(keyFile); err != nil {
		return nil, err
	}
	return c, nil
}

// KubeconfigName names the cluster, user and context of a kubeconfig from WriteKubeconfig.
const KubeconfigName = "test"

// WriteKubeconfig writes a kubeconfig with one context, for cluster and user, to path with mode 0600.
func WriteKubeconfig(path string, cluster clientcmdapi.Cluster, user clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[KubeconfigName] = &cluster
	cfg.AuthInfos[KubeconfigName] = &user
	cfg.Contexts[KubeconfigName] = &clientcmdapi.Context{Cluster: KubeconfigName, AuthInfo: KubeconfigName}
	cfg.CurrentContext = KubeconfigName
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	return writeFile(path, b)
}

// User is c as a kubeconfig user, certificate and key embedded.
func (c *Cert) User() clientcmdapi.AuthInfo {
	return clientcmdapi.AuthInfo{ClientCertificateData: c.CertPEM, ClientKeyData: c.KeyPEM}
}

// WriteServiceAccountKeys writes a token signing key pair for kube-apiserver (RSA, which every version
// accepts) as dir/sa.pub and dir/sa.key, and returns both paths.
func WriteServiceAccountKeys(dir string) (pub, priv string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	pub, priv = filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	if err := writeFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})); err != nil {
		return "", "", err
	}
	return pub, priv, writeFile(priv, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
}

// Write stores c as dir/base.crt and dir/base.key and returns both paths.
func (c *Cert) Write(t testing.TB, dir, base string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := c.WriteFiles(dir, base)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// WriteFiles is Write for harnesses outside a test. It writes the key first and renames each file into
// place, as a renewal tool would, so a reader never pairs a new certificate with the old key's half-file.
func (c *Cert) WriteFiles(dir, base string) (certFile, keyFile string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	if err := writeFile(keyFile, c.KeyPEM); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writeFile(certFile, c.CertPEM)
}

// WriteCert stores only the certificate, as a CA bundle, at path.
func (c *Cert) WriteCert(t testing.TB, path string) string {
	t.Helper()
	WriteFile(t, path, c.CertPEM)
	return path
}

// WriteFile replaces path atomically, as the kubelet and cert-manager do, so that a reader never sees half
// a file.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := writeFile(path, data); err != nil {
		t.Fatal(err)
	}
}

func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func must(t testing.TB) func(*Cert, error) *Cert {
	return func(c *Cert, err error) *Cert {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}
