package agent

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// fileStamp identifies one version of a file on disk. Kubernetes projected volumes and cert-manager swap
// files through symlinks, so the inode and the modification time change together with the content.
type fileStamp struct {
	modTime time.Time
	size    int64
	ino     uint64
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	s := fileStamp{modTime: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s, nil
}

// reloader holds the parsed content of one or more files and parses them again when any of them changes on
// disk. A change that does not parse keeps the last good value, so that a half-written file during a
// rotation does not take the agent down; the error is still reported.
type reloader[T any] struct {
	what  string // for messages: "CA bundle --ca-cert"
	paths []string
	parse func(data [][]byte) (T, error)

	mu     sync.Mutex
	stamps []fileStamp
	value  T
	loaded bool
}

func newReloader[T any](what string, parse func([][]byte) (T, error), paths ...string) *reloader[T] {
	return &reloader[T]{what: what, paths: paths, parse: parse}
}

// get returns the current value, reloading it first if a file changed.
func (r *reloader[T]) get() (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamps := make([]fileStamp, len(r.paths))
	changed := !r.loaded
	for i, p := range r.paths {
		s, err := stamp(p)
		if err != nil {
			if r.loaded {
				klog.ErrorS(err, "Cannot check file for changes; keeping the loaded version", "file", p, "what", r.what)
				return r.value, nil
			}
			return r.value, fmt.Errorf("%s: %w", r.what, err)
		}
		stamps[i] = s
		if r.loaded && s != r.stamps[i] {
			changed = true
		}
	}
	if !changed {
		return r.value, nil
	}
	data := make([][]byte, len(r.paths))
	for i, p := range r.paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return r.keep(fmt.Errorf("%s: %w", r.what, err))
		}
		data[i] = b
	}
	v, err := r.parse(data)
	if err != nil {
		return r.keep(fmt.Errorf("%s (%v): %w", r.what, r.paths, err))
	}
	if r.loaded {
		klog.InfoS("Reloaded from disk", "what", r.what, "files", r.paths)
	}
	r.value, r.stamps, r.loaded = v, stamps, true
	return v, nil
}

func (r *reloader[T]) keep(err error) (T, error) {
	if !r.loaded {
		return r.value, err
	}
	klog.ErrorS(err, "Changed file is not usable; keeping the loaded version", "what", r.what)
	return r.value, nil
}

func parseCABundle(data [][]byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[0]) {
		return nil, errors.New("no PEM certificate found")
	}
	return pool, nil
}

func parseKeyPair(data [][]byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(data[0], data[1])
	if err != nil {
		return nil, err
	}
	return &c, nil
}

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
	ca      *reloader[*x509.CertPool]   // nil: system roots
	keyPair *reloader[*tls.Certificate] // nil: no client certificate
	token   *reloader[string]           // nil: no token
	alpn    []string
}

func newCredentials(cfg *Config) *credentials {
	c := &credentials{alpn: cfg.ALPNProtos}
	if cfg.CAFile != "" {
		c.ca = newReloader("CA bundle (--ca-cert)", parseCABundle, cfg.CAFile)
	}
	if cfg.CertFile != "" {
		c.keyPair = newReloader("client certificate (--agent-cert/--agent-key)", parseKeyPair, cfg.CertFile, cfg.KeyFile)
	}
	if cfg.TokenFile != "" {
		c.token = newReloader("token (--service-account-token-path)", parseToken, cfg.TokenFile)
	}
	return c
}

// check loads every file once, so that New reports a missing or broken file instead of the first dial.
func (c *credentials) check() error {
	if c.ca != nil {
		if _, err := c.ca.get(); err != nil {
			return err
		}
	}
	if c.keyPair != nil {
		if _, err := c.keyPair.get(); err != nil {
			return err
		}
	}
	if c.token != nil {
		if _, err := c.token.get(); err != nil {
			return err
		}
	}
	return nil
}

// tlsConfig returns the TLS configuration for one connection to a server. It is built on each connect, so a
// rotated CA bundle applies to the next connection; the client certificate is looked up at each handshake.
func (c *credentials) tlsConfig(serverName string) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		NextProtos: append([]string(nil), c.alpn...),
	}
	if c.ca != nil {
		pool, err := c.ca.get()
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if c.keyPair != nil {
		if _, err := c.keyPair.get(); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.keyPair.get()
		}
	}
	return cfg, nil
}

// bearer returns the token to send, read again from disk if the kubelet rotated it.
func (c *credentials) bearer() (string, error) {
	if c.token == nil {
		return "", nil
	}
	return c.token.get()
}
