package tunnel

import (
	"crypto/tls"
	"fmt"
	"slices"

	"github.com/konnect-dev/konnect/pki/reload"
)

// serverTLS returns a TLS config that serves certFile/keyFile and, with caFile, requires a client certificate
// signed by it, whose common name is one of allowedNames when any are given. All three files are re-read
// when they change, so renewals need no restart and connections already open are not touched. certs gets
// the certificate and the CA bundle as they are in use.
func serverTLS(certFile, keyFile, caFile string, allowedNames []string, nextProtos []string, minVersion uint16, ciphers []uint16) (_ *tls.Config, certs tlsCerts, _ error) {
	pair, err := reload.KeyPair("certificate "+certFile, certFile, keyFile)
	if err != nil {
		return nil, certs, err
	}
	certs.cert = reload.PairCert(pair)
	if minVersion == 0 {
		minVersion = tls.VersionTLS12
	}
	base := &tls.Config{
		MinVersion:   minVersion,
		CipherSuites: ciphers,
		NextProtos:   nextProtos,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return pair.Get(), nil
		},
	}
	if caFile == "" {
		return base, certs, nil
	}
	cas, err := reload.CAPool("CA bundle "+caFile, caFile)
	if err != nil {
		return nil, certs, err
	}
	certs.ca = reload.BundleCert(cas)
	base.ClientAuth = tls.RequireAndVerifyClientCert
	base.ClientCAs = cas.Get().Pool
	if len(allowedNames) > 0 {
		// A CA such as kubeadm's also signs kubelets' and users' client certificates: the CA alone does not
		// make a peer an agent (or kube-apiserver).
		base.VerifyConnection = func(cs tls.ConnectionState) error {
			if cn := cs.PeerCertificates[0].Subject.CommonName; !slices.Contains(allowedNames, cn) {
				return fmt.Errorf("client certificate CN %q is not one of the allowed names %q", cn, allowedNames)
			}
			return nil
		}
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = cas.Get().Pool
		return c, nil
	}
	return base, certs, nil
}

// tlsCerts are the files of one serverTLS; ca is zero without a CA bundle.
type tlsCerts struct{ cert, ca reload.Cert }

// Certificates are the certificates the server loaded, by Config field ("ClusterCert", "ClusterCA",
// "ServerCert", "ServerCA"; only those in use), each as it is in use, for the daemon's metrics.
func (s *Server) Certificates() map[string]reload.Cert {
	m := map[string]reload.Cert{}
	for _, c := range []struct {
		certField, caField string
		certs              tlsCerts
	}{{"ClusterCert", "ClusterCA", s.agentCerts}, {"ServerCert", "ServerCA", s.frontendCerts}} {
		if c.certs.cert.InUse != nil {
			m[c.certField] = c.certs.cert
		}
		if c.certs.ca.InUse != nil {
			m[c.caField] = c.certs.ca
		}
	}
	return m
}
