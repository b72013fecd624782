package reload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// KeyPair keeps a certificate and its key, for GetCertificate or GetClientCertificate.
func KeyPair(what, certFile, keyFile string) (*Files[*tls.Certificate], error) {
	return New(what, func(data [][]byte) (*tls.Certificate, error) {
		c, err := tls.X509KeyPair(data[0], data[1])
		if err != nil {
			return nil, err
		}
		return &c, nil
	}, certFile, keyFile)
}

// CAPool keeps a PEM CA bundle as a certificate pool.
func CAPool(what, file string) (*Files[*x509.CertPool], error) {
	return New(what, func(data [][]byte) (*x509.CertPool, error) {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data[0]) {
			return nil, errors.New("no PEM certificate found")
		}
		return pool, nil
	}, file)
}
