package reload

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
)

// KeyPair keeps a certificate and its key, for GetCertificate or GetClientCertificate. Leaf is always set.
func KeyPair(what, certFile, keyFile string) (*Files[*tls.Certificate], error) {
	return New(what, func(data [][]byte) (*tls.Certificate, error) {
		c, err := tls.X509KeyPair(data[0], data[1])
		if err != nil {
			return nil, err
		}
		if c.Leaf == nil { // GODEBUG x509keypairleaf=0
			if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
				return nil, err
			}
		}
		return &c, nil
	}, certFile, keyFile)
}

// CABundle is a CA bundle as a pool, with its certificates in file order beside it, since a pool cannot
// list them.
type CABundle struct {
	Pool  *x509.CertPool
	Certs []*x509.Certificate
}

// CAPool keeps a PEM CA bundle. Like x509.CertPool.AppendCertsFromPEM it skips blocks that are not
// certificates, and it fails when none is left.
func CAPool(what, file string) (*Files[*CABundle], error) {
	return New(what, func(data [][]byte) (*CABundle, error) {
		b := &CABundle{Pool: x509.NewCertPool()}
		for rest := data[0]; len(rest) > 0; {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				break
			}
			if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
				continue
			}
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				continue
			}
			b.Pool.AddCert(c)
			b.Certs = append(b.Certs, c)
		}
		if len(b.Certs) == 0 {
			return nil, errors.New("no PEM certificate found")
		}
		return b, nil
	}, file)
}

// Cert is a certificate file as a daemon uses it, for its metrics: the certificate in use can differ from
// the file when a renewal did not load.
type Cert struct {
	File string // the certificate file (of a pair) or the CA bundle
	// InUse returns the certificate in use (a pair's, or a bundle's first) and Files.State's error: why the
	// files on disk are not that version, nil when they are.
	InUse func() (*x509.Certificate, error)
}

// PairCert reports the certificate of a KeyPair.
func PairCert(f *Files[*tls.Certificate]) Cert {
	return Cert{File: f.paths[0], InUse: func() (*x509.Certificate, error) {
		c, err := f.State()
		return c.Leaf, err
	}}
}

// BundleCert reports the first certificate of a CAPool.
func BundleCert(f *Files[*CABundle]) Cert {
	return Cert{File: f.paths[0], InUse: func() (*x509.Certificate, error) {
		b, err := f.State()
		return b.Certs[0], err
	}}
}
