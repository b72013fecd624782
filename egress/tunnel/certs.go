package tunnel

import (
	"crypto/tls"
	"fmt"
	"slices"

	"github.com/konnect-dev/konnect/pki/reload"
)

// serverTLS returns a TLS config that serves certFile/keyFile and, with caFile, requires a client certificate
// signed by it, whose common name is one of allowedNames when any are given. All three files are re-read
// when they change, so renewals need no restart and connections already open are not touched.
func serverTLS(certFile, keyFile, caFile string, allowedNames []string, nextProtos []string, minVersion uint16, ciphers []uint16) (*tls.Config, error) {
	pair, err := reload.KeyPair("certificate "+certFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
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
		return base, nil
	}
	cas, err := reload.CAPool("CA bundle "+caFile, caFile)
	if err != nil {
		return nil, err
	}
	base.ClientAuth = tls.RequireAndVerifyClientCert
	base.ClientCAs = cas.Get()
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
		c.ClientCAs = cas.Get()
		return c, nil
	}
	return base, nil
}
