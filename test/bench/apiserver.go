package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// startAPIServer runs etcd and kube-apiserver 1.36 in cp, trusting the cluster CA that konnect init made, and
// writes an admin kubeconfig for `konnect proxy` and `kubectl proxy`. The harness adds only what konnect does
// not own: the serving certificate, the service-account keys and the admin client certificate.
func (b *bench) startAPIServer() (kubeconfig string, err error) {
	pki := b.path("k", "pki")
	caCert, caKey, err := loadCA(filepath.Join(pki, "ca.crt"), filepath.Join(pki, "ca.key"))
	if err != nil {
		return "", err
	}
	serving, err := issue(caCert, caKey, "kube-apiserver", nil, []net.IP{net.ParseIP(cpAddr)}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return "", err
	}
	admin, err := issue(caCert, caKey, "bench-admin", []string{"system:masters"}, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return "", err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	saKeyDER, _ := x509.MarshalECPrivateKey(saKey)
	saPubDER, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	files := map[string][]byte{
		"apiserver.crt": serving.cert, "apiserver.key": serving.key,
		"sa.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saKeyDER}),
		"sa.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	}
	for name, data := range files {
		if err := os.WriteFile(b.path(name), data, 0o600); err != nil {
			return "", err
		}
	}
	etcd, err := b.t.start("etcd", "cp", "etcd", "--name=bench", "--data-dir="+b.path("etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=bench=http://127.0.0.1:2380", "--unsafe-no-fsync")
	if err != nil {
		return "", err
	}
	if err := b.t.waitHTTP("cp", "http://127.0.0.1:2379/health", time.Minute, etcd); err != nil {
		return "", err
	}
	apiserver, err := b.t.start("kube-apiserver", "cp", b.o.kubeAPIServer,
		"--etcd-servers=http://127.0.0.1:2379", "--bind-address="+cpAddr, "--advertise-address="+cpAddr,
		"--secure-port=6443", "--authorization-mode=RBAC", "--service-cluster-ip-range=198.18.128.0/24",
		"--tls-cert-file="+b.path("apiserver.crt"), "--tls-private-key-file="+b.path("apiserver.key"),
		"--client-ca-file="+filepath.Join(pki, "ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+b.path("sa.pub"), "--service-account-signing-key-file="+b.path("sa.key"),
		"--profiling=false")
	if err != nil {
		return "", err
	}
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return "", err
	}
	kubeconfig = b.path("apiserver.kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster:
    server: https://%s:6443
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: bench
  context: {cluster: bench, user: admin}
current-context: bench
`, cpAddr, b64(caPEM), b64(admin.cert), b64(admin.key))
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		return "", err
	}
	// /readyz needs credentials; kubectl with the admin kubeconfig is the simplest probe from inside cp.
	if err := poll("kube-apiserver /readyz", 3*time.Minute, 500*time.Millisecond, apiserver, func() error {
		_, err := b.execFor(10*time.Second, "cp", "kubectl", "--kubeconfig", kubeconfig, "get", "--raw", "/readyz")
		return err
	}); err != nil {
		return "", err
	}
	return kubeconfig, nil
}

func b64(data []byte) string { return base64.StdEncoding.EncodeToString(data) }

type pair struct{ cert, key []byte }

func loadCA(certFile, keyFile string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("%s or %s: no PEM block", certFile, keyFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	var key any
	switch kb.Type {
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not a signing key", keyFile)
	}
	return cert, signer, nil
}

func issue(ca *x509.Certificate, caKey crypto.Signer, cn string, orgs []string, ips []net.IP, usage x509.ExtKeyUsage) (pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return pair{}, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  ips,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return pair{}, err
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return pair{
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}
