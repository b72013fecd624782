package main

import (
	"path/filepath"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// startAPIServer runs etcd and kube-apiserver 1.36 in cp, trusting the cluster CA that konnect init made, and
// writes an admin kubeconfig for `konnect proxy` and `kubectl proxy`. The harness adds only what konnect does
// not own: the serving certificate, the service-account keys and the admin client certificate.
func (b *bench) startAPIServer() (kubeconfig string, err error) {
	pki := b.path("k", "pki")
	ca, err := pkitest.Load(filepath.Join(pki, "ca.crt"), filepath.Join(pki, "ca.key"))
	if err != nil {
		return "", err
	}
	serving, err := pkitest.Issue(ca, pkitest.Spec{CN: "kube-apiserver", Hosts: []string{cpAddr}, Server: true})
	if err != nil {
		return "", err
	}
	servingCrt, servingKey, err := serving.WriteFiles(b.path(), "apiserver")
	if err != nil {
		return "", err
	}
	admin, err := pkitest.Issue(ca, pkitest.Spec{CN: "bench-admin", Orgs: []string{"system:masters"}, Client: true})
	if err != nil {
		return "", err
	}
	kubeconfig = b.path("apiserver.kubeconfig")
	if err := pkitest.WriteKubeconfig(kubeconfig, clientcmdapi.Cluster{Server: "https://" + cpAddr + ":6443", CertificateAuthorityData: ca.CertPEM}, admin.User()); err != nil {
		return "", err
	}
	saPub, saKey, err := pkitest.WriteServiceAccountKeys(b.path())
	if err != nil {
		return "", err
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
		"--tls-cert-file="+servingCrt, "--tls-private-key-file="+servingKey,
		"--client-ca-file="+filepath.Join(pki, "ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--profiling=false")
	if err != nil {
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
