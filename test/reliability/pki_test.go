//go:build integration

package reliability

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// issuers maps every certificate konnect init can write under DIR/pki to the CA that signs it ("" for a
// self-signed CA).
var issuers = map[string]string{
	"ca":                         "",
	"front-proxy-ca":             "",
	"front-proxy-client":         "front-proxy-ca",
	"konnectivity-server-client": "ca",
	"konnectivity-server":        "ca",
	"konnectivity-agent-ca":      "",
	"konnectivity-agent":         "konnectivity-agent-ca",
	"konnectivity-frontend":      "ca",
	"apiserver-egress-client":    "ca",
}

// tempFile matches the temporary files of an atomic write (".NAME.tmp-RANDOM"), which a kill can leave
// behind. Their names never end in .crt or .key, so nothing mistakes them for real files.
var tempFile = regexp.MustCompile(`^\.[^/]+\.tmp-[^/]*$`)

// pairState is what one cert/key pair looks like on disk.
type pairState int

const (
	pairAbsent   pairState = iota
	pairComplete           // both files, both parse, key matches, chain verifies
	pairKeyOnly            // key written, certificate not yet: what an interrupted creation leaves
)

// pkiState is the result of inspecting DIR/pki.
type pkiState struct {
	pairs    map[string]pairState
	temps    []string // leftover temporary files
	problems []string // torn, mismatched, unverifiable or unknown files
}

func parseCertFile(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, rest := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no CERTIFICATE PEM block", path)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%s: trailing data after the certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func parseKeyFile(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	if k, err := x509.ParsePKCS1PrivateKey(blk.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: unparsable key: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: key type %T cannot sign", path, k)
	}
	return s, nil
}

// inspectPKI checks every file in dir/pki: each pair complete and valid, key-only, or absent.
func inspectPKI(dir string) pkiState {
	pkiDir := filepath.Join(dir, "pki")
	st := pkiState{pairs: map[string]pairState{}}
	entries, err := os.ReadDir(pkiDir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			st.problems = append(st.problems, err.Error())
		}
		return st
	}
	for _, e := range entries {
		n := e.Name()
		if tempFile.MatchString(n) {
			st.temps = append(st.temps, n)
			if info, err := e.Info(); err == nil && strings.Contains(n, ".key.") && info.Mode().Perm() != 0o600 {
				st.problems = append(st.problems, fmt.Sprintf("temporary key file %s has mode %v, want 0600", n, info.Mode().Perm()))
			}
			continue
		}
		base := strings.TrimSuffix(strings.TrimSuffix(n, ".crt"), ".key")
		if _, ok := issuers[base]; !ok || base == n {
			st.problems = append(st.problems, "unexpected file pki/"+n)
		}
	}
	certs := map[string]*x509.Certificate{}
	names := make([]string, 0, len(issuers))
	for n := range issuers {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { // CAs first
		return issuers[names[i]] == "" && issuers[names[j]] != ""
	})
	for _, name := range names {
		certPath, keyPath := filepath.Join(pkiDir, name+".crt"), filepath.Join(pkiDir, name+".key")
		_, certErr := os.Stat(certPath)
		_, keyErr := os.Stat(keyPath)
		hasCert, hasKey := certErr == nil, keyErr == nil
		switch {
		case !hasCert && !hasKey:
			st.pairs[name] = pairAbsent
			continue
		case hasCert && !hasKey:
			st.problems = append(st.problems, fmt.Sprintf("%s.crt exists without its key: key lost", name))
			continue
		case !hasCert && hasKey:
			if _, err := parseKeyFile(keyPath); err != nil {
				st.problems = append(st.problems, "torn key: "+err.Error())
			}
			st.pairs[name] = pairKeyOnly
			continue
		}
		cert, err := parseCertFile(certPath)
		if err != nil {
			st.problems = append(st.problems, "torn certificate: "+err.Error())
			continue
		}
		if _, err := parseKeyFile(keyPath); err != nil {
			st.problems = append(st.problems, "torn key: "+err.Error())
			continue
		}
		if _, err := tls.LoadX509KeyPair(certPath, keyPath); err != nil {
			st.problems = append(st.problems, fmt.Sprintf("%s.key does not match %s.crt: %v", name, name, err))
			continue
		}
		if err := verifyChain(cert, issuers[name], certs); err != nil {
			st.problems = append(st.problems, fmt.Sprintf("%s.crt: %v", name, err))
			continue
		}
		certs[name] = cert
		st.pairs[name] = pairComplete
	}
	return st
}

func verifyChain(cert *x509.Certificate, issuer string, cas map[string]*x509.Certificate) error {
	roots := x509.NewCertPool()
	if issuer == "" {
		roots.AddCert(cert)
	} else {
		ca := cas[issuer]
		if ca == nil {
			return fmt.Errorf("issuer %s is not complete on disk", issuer)
		}
		roots.AddCert(ca)
	}
	_, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: time.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// checkServerConf loads DIR/konnectivity-server.conf (if present) and checks that its embedded client
// certificate and key match and are signed by the cluster CA.
func checkServerConf(dir string) error {
	path := filepath.Join(dir, "konnectivity-server.conf")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	ca, err := parseCertFile(filepath.Join(dir, "pki", "ca.crt"))
	if err != nil {
		return err
	}
	for name, ai := range cfg.AuthInfos {
		// X509KeyPair parses both halves and checks that the key matches the certificate.
		pair, err := tls.X509KeyPair(ai.ClientCertificateData, ai.ClientKeyData)
		if err != nil {
			return fmt.Errorf("%s: user %s: %w", path, name, err)
		}
		cert := pair.Leaf
		if err := verifyChain(cert, "ca", map[string]*x509.Certificate{"ca": ca}); err != nil {
			return fmt.Errorf("%s: user %s: %w", path, name, err)
		}
	}
	return nil
}
