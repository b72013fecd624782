package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"sync"
	"testing"
)

// TestMain makes key generation hand out keys from testdata (pre-generated with openssl genrsa), each
// one once, so that the tests do not spend their time generating RSA keys. ECDSA keys, and RSA keys once
// the fixtures run out, are generated for real.
func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	pool := &keyPool{keys: map[KeyAlgorithm][]crypto.Signer{}}
	for _, alg := range []KeyAlgorithm{RSA2048, RSA3072, RSA4096} {
		if err := pool.load(alg, "testdata/"+string(alg)+".pem"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	real := generateKey
	generateKey = func(alg KeyAlgorithm) (crypto.Signer, error) {
		if k := pool.take(alg); k != nil {
			return k, nil
		}
		return real(alg)
	}
	os.Exit(m.Run())
}

type keyPool struct {
	mu   sync.Mutex
	keys map[KeyAlgorithm][]crypto.Signer
}

func (p *keyPool) load(alg KeyAlgorithm, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil
		}
		k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		p.keys[alg] = append(p.keys[alg], k.(crypto.Signer))
	}
}

func (p *keyPool) take(alg KeyAlgorithm) crypto.Signer {
	p.mu.Lock()
	defer p.mu.Unlock()
	ks := p.keys[alg]
	if len(ks) == 0 {
		return nil
	}
	p.keys[alg] = ks[1:]
	return ks[0]
}
