package agent

import (
	"bytes"
	"crypto/tls"
	"errors"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/reload"
)

func parseToken(data [][]byte) (string, error) {
	// The kubelet writes the token without a newline, but hand-made files often end with one, and a newline
	// is not allowed in a gRPC metadata value.
	t := string(bytes.TrimSpace(data[0]))
	if t == "" {
		return "", errors.New("token file is empty")
	}
	return t, nil
}

// credentials are the agent's reloadable TLS and token material.
type credentials struct {
	ca      *reload.Files[*reload.CABundle] // nil: system roots
	keyPair *reload.Files[*tls.Certificate] // nil: no client certificate
	token   *reload.Files[string]           // nil: no token
	alpn    []string
}

// newCredentials loads every file once, so that New reports a missing or broken file instead of the first
// dial. The files are labelled by path for the reloads' log lines; a start-up error names the Config field.
func newCredentials(cfg *Config) (*credentials, error) {
	c := &credentials{alpn: cfg.ALPNProtos}
	var err error
	if cfg.CAFile != "" {
		if c.ca, err = reload.CAPool("CA bundle "+cfg.CAFile, cfg.CAFile); err != nil {
			return nil, startupError("CA bundle ({CAFile})", err)
		}
	}
	if cfg.CertFile != "" {
		if c.keyPair, err = reload.KeyPair("client certificate "+cfg.CertFile, cfg.CertFile, cfg.KeyFile); err != nil {
			return nil, startupError("client certificate ({CertFile}/{KeyFile})", err)
		}
	}
	if cfg.TokenFile != "" {
		if c.token, err = reload.New("token "+cfg.TokenFile, parseToken, cfg.TokenFile); err != nil {
			return nil, startupError("token ({TokenFile})", err)
		}
	}
	return c, nil
}

// startupError tells a reload.LoadError with label, which names the Config fields of the files, in the place
// of the path the reloads log.
func startupError(label string, err error) error {
	var le *reload.LoadError
	if !errors.As(err, &le) {
		return err
	}
	if le.Paths != nil {
		return field.Errorf(label+" (%v): %w", le.Paths, le.Err)
	}
	return field.Errorf(label+": %w", le.Err)
}

// tlsConfig returns the TLS configuration for one connection to a server. It is built on each connect, so a
// rotated CA bundle applies to the next connection; the client certificate is looked up at each handshake.
func (c *credentials) tlsConfig(serverName string) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		NextProtos: append([]string(nil), c.alpn...),
	}
	if c.ca != nil {
		cfg.RootCAs = c.ca.Get().Pool
	}
	if c.keyPair != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.keyPair.Get(), nil
		}
	}
	return cfg
}

// Certificates are the client certificate and the CA bundle the agent loaded, by Config field ("CertFile",
// "CAFile"; only those configured), each as it is in use, for the daemon's metrics.
func (a *Agent) Certificates() map[string]reload.Cert {
	c := a.creds
	m := map[string]reload.Cert{}
	if c.keyPair != nil {
		m["CertFile"] = reload.PairCert(c.keyPair)
	}
	if c.ca != nil {
		m["CAFile"] = reload.BundleCert(c.ca)
	}
	return m
}

// bearer returns the token to send, read again from disk if the kubelet rotated it.
func (c *credentials) bearer() string {
	if c.token == nil {
		return ""
	}
	return c.token.Get()
}
