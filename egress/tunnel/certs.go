package tunnel

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// reloadCheckInterval bounds how often the files behind a listener's certificate are stat'ed. A handshake
// storm costs at most one stat per file per interval; a renewed certificate is served within it.
const reloadCheckInterval = time.Second

// fileStamp identifies one version of a file on disk. A renewal tool that rewrites in place or renames a new
// file over the old one changes at least one of these.
type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size(), ino: inode(fi)}, nil
}

// reloader keeps a parsed value of some files and re-reads them when they change. A change that does not
// parse (for example a certificate written before its key) keeps the last good value and is retried.
type reloader[T any] struct {
	what  string
	files []string
	parse func() (T, error)

	mu        sync.Mutex
	value     T
	stamps    []fileStamp
	lastCheck time.Time
}

func newReloader[T any](what string, parse func() (T, error), files ...string) (*reloader[T], error) {
	r := &reloader[T]{what: what, files: files, parse: parse}
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	v, err := parse()
	if err != nil {
		return nil, err
	}
	r.value, r.stamps, r.lastCheck = v, stamps, time.Now()
	return r, nil
}

func (r *reloader[T]) stat() ([]fileStamp, error) {
	out := make([]fileStamp, len(r.files))
	for i, f := range r.files {
		s, err := stampOf(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.what, err)
		}
		out[i] = s
	}
	return out, nil
}

func (r *reloader[T]) get() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if now.Sub(r.lastCheck) < reloadCheckInterval {
		return r.value
	}
	r.lastCheck = now
	stamps, err := r.stat()
	if err != nil {
		klog.ErrorS(err, "Cannot check for a renewed file; keeping the loaded one", "what", r.what)
		return r.value
	}
	if equalStamps(stamps, r.stamps) {
		return r.value
	}
	v, err := r.parse()
	if err != nil {
		klog.ErrorS(err, "Changed file does not load yet; keeping the loaded one", "what", r.what)
		return r.value
	}
	r.value, r.stamps = v, stamps
	klog.InfoS("Reloaded from disk", "what", r.what, "files", r.files)
	return r.value
}

func equalStamps(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].mod.Equal(b[i].mod) || a[i].size != b[i].size || a[i].ino != b[i].ino {
			return false
		}
	}
	return true
}

func loadKeyPair(certFile, keyFile string) func() (*tls.Certificate, error) {
	return func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load key pair %s, %s: %w", certFile, keyFile, err)
		}
		return &c, nil
	}
}

func loadCAPool(caFile string) func() (*x509.CertPool, error) {
	return func() (*x509.CertPool, error) {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", caFile)
		}
		return pool, nil
	}
}

// serverTLS returns a TLS config that serves certFile/keyFile and, with caFile, requires a client certificate
// signed by it. All three files are re-read when they change, so renewals need no restart and connections
// already open are not touched.
func serverTLS(certFile, keyFile, caFile string, nextProtos []string, minVersion uint16, ciphers []uint16) (*tls.Config, error) {
	pair, err := newReloader("certificate "+certFile, loadKeyPair(certFile, keyFile), certFile, keyFile)
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
			return pair.get(), nil
		},
	}
	if caFile == "" {
		return base, nil
	}
	cas, err := newReloader("CA bundle "+caFile, loadCAPool(caFile), caFile)
	if err != nil {
		return nil, err
	}
	base.ClientAuth = tls.RequireAndVerifyClientCert
	base.ClientCAs = cas.get()
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = cas.get()
		return c, nil
	}
	return base, nil
}
