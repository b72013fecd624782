package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/konnect-dev/konnect/pki/smallfile"
)

// KeyAlgorithm names the type and size of a private key, as given to --key-algorithm.
type KeyAlgorithm string

// The supported key algorithms. RSA2048 is the default, as in kubeadm.
const (
	RSA2048   KeyAlgorithm = "rsa-2048"
	RSA3072   KeyAlgorithm = "rsa-3072"
	RSA4096   KeyAlgorithm = "rsa-4096"
	ECDSAP256 KeyAlgorithm = "ecdsa-p256"
	ECDSAP384 KeyAlgorithm = "ecdsa-p384"
)

// KeyAlgorithms lists the supported key algorithms, default first.
func KeyAlgorithms() []KeyAlgorithm {
	return []KeyAlgorithm{RSA2048, RSA3072, RSA4096, ECDSAP256, ECDSAP384}
}

// ParseKeyAlgorithm checks that s names a supported key algorithm.
func ParseKeyAlgorithm(s string) (KeyAlgorithm, error) {
	algs := KeyAlgorithms()
	names := make([]string, len(algs))
	for i, a := range algs {
		if string(a) == strings.ToLower(s) {
			return a, nil
		}
		names[i] = string(a)
	}
	return "", fmt.Errorf("unknown key algorithm %q (want one of %s)", s, strings.Join(names, ", "))
}

// keyAlgorithmOf tells which algorithm produced pub.
func keyAlgorithmOf(pub crypto.PublicKey) (KeyAlgorithm, error) {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		switch k.N.BitLen() {
		case 2048:
			return RSA2048, nil
		case 3072:
			return RSA3072, nil
		case 4096:
			return RSA4096, nil
		}
		return "", fmt.Errorf("unsupported RSA key size %d", k.N.BitLen())
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return ECDSAP256, nil
		case elliptic.P384():
			return ECDSAP384, nil
		}
		return "", fmt.Errorf("unsupported ECDSA curve %s", k.Curve.Params().Name)
	}
	return "", fmt.Errorf("unsupported public key type %T", pub)
}

// generateKey is a variable so that tests can hand out pre-generated keys: RSA generation dominates
// their run time otherwise.
var generateKey = func(alg KeyAlgorithm) (crypto.Signer, error) {
	switch alg {
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case RSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	case ECDSAP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ECDSAP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	}
	return nil, fmt.Errorf("unknown key algorithm %q", alg)
}

// encodeKey writes RSA keys as PKCS#1 and ECDSA keys as SEC 1, the encodings kubeadm uses, so that tools
// which only expect those keep working.
func encodeKey(key crypto.Signer) ([]byte, error) {
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), nil
	case *ecdsa.PrivateKey:
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
	}
	return nil, fmt.Errorf("unsupported private key type %T", key)
}

func encodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// firstBlock returns the first PEM block in data whose type match accepts, skipping the others (such as the
// "EC PARAMETERS" that openssl ecparam writes before a key), or nil.
func firstBlock(data []byte, match func(typ string) bool) *pem.Block {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil || match(block.Type) {
			return block
		}
	}
}

// HasPEMBlock reports whether data holds a PEM block whose type ends in typeSuffix ("PRIVATE KEY" matches
// RSA, EC and PKCS #8 keys).
func HasPEMBlock(data []byte, typeSuffix string) bool {
	return firstBlock(data, func(typ string) bool { return strings.HasSuffix(typ, typeSuffix) }) != nil
}

// parseKey accepts PKCS#1, SEC 1 and PKCS#8 PEM.
func parseKey(data []byte) (crypto.Signer, error) {
	block := firstBlock(data, func(typ string) bool {
		return typ == "RSA PRIVATE KEY" || typ == "EC PRIVATE KEY" || typ == "PRIVATE KEY"
	})
	if block == nil {
		return nil, errors.New("no PEM private key found")
	}
	var k any
	var err error
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", block.Type, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported private key type %T", k)
	}
	if _, err := keyAlgorithmOf(s.Public()); err != nil {
		return nil, err
	}
	return s, nil
}

// ErrNoCertificate is the error of a PEM file that holds no CERTIFICATE block.
var ErrNoCertificate = errors.New("no PEM certificate found")

// ParseCertificatePEM returns the first certificate of PEM data, skipping blocks of other types.
func ParseCertificatePEM(data []byte) (*x509.Certificate, error) {
	block := firstBlock(data, func(typ string) bool { return typ == "CERTIFICATE" })
	if block == nil {
		return nil, ErrNoCertificate
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return c, nil
}

// ReadCertificate returns the first certificate of a PEM file; its errors name the file.
func ReadCertificate(path string) (*x509.Certificate, error) {
	c, _, err := readCert(path)
	return c, err
}

func readCert(path string) (*x509.Certificate, []byte, error) {
	data, err := smallfile.Read(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read certificate %s: %w", path, err)
	}
	c, err := ParseCertificatePEM(data)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate %s: %w", path, err)
	}
	return c, data, nil
}

func readKey(path string) (crypto.Signer, []byte, error) {
	data, err := smallfile.Read(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read key %s: %w", path, err)
	}
	k, err := parseKey(data)
	if err != nil {
		return nil, nil, fmt.Errorf("key %s: %w", path, err)
	}
	return k, data, nil
}

// samePublicKey compares two public keys.
func samePublicKey(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}
