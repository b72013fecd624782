package harness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIServerOptions configures NewAPIServer.
type APIServerOptions struct {
	Bin  string // kube-apiserver (E2ETool finds the one test/e2e/tools builds)
	Etcd string // etcd; default "etcd" from PATH
	Dir  string // data, certificates, kubeconfigs and logs

	Host      string // the address kube-apiserver binds and its serving certificate names
	Port      int    // its secure port
	EtcdPorts [2]int // etcd's client and peer ports on 127.0.0.1; default 2379, 2380
	Netns     string // run both in this network namespace ("" for the host's)

	// CA signs kube-apiserver's serving certificate and the client certificates it trusts; nil makes one.
	CA   *pkitest.Cert
	Args []string // more kube-apiserver flags
	Keep bool     // leave the processes running (debugging)
}

// APIServer is etcd and a real kube-apiserver, for the tests and benchmarks that need kube-apiserver's own
// answers (TokenReviews under load, the API proxy) rather than a stand-in. Nothing else of a control plane
// runs: no controller-manager, so ServiceAccounts and RBAC are created through the API (AgentAuth).
type APIServer struct {
	Etcd, Proc *Proc
	URL        string        // https://Host:Port
	CA         *pkitest.Cert // see APIServerOptions.CA
	Kubeconfig string        // an admin's (O=system:masters), Dir/admin.kubeconfig
	admin      *pkitest.Cert
	o          APIServerOptions
}

// StartAPIServer is NewAPIServer for a test: it fails the test on error, waits until kube-apiserver is
// ready, and stops both when the test ends, showing their logs if it failed.
func StartAPIServer(t testing.TB, o APIServerOptions) *APIServer {
	t.Helper()
	a, err := NewAPIServer(o)
	if a != nil {
		t.Cleanup(func() {
			if t.Failed() {
				for _, p := range []*Proc{a.Proc, a.Etcd} {
					if p != nil {
						t.Logf("log of %s:\n%s", p.Name, Tail(p.Log(), 3000))
					}
				}
			}
			a.Stop()
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(3 * time.Minute); err != nil {
		t.Fatal(err)
	}
	return a
}

// NewAPIServer starts etcd and kube-apiserver; the caller waits with WaitReady and stops them with Stop
// (also after an error, when it returns an APIServer).
func NewAPIServer(o APIServerOptions) (_ *APIServer, err error) {
	if o.Etcd == "" {
		o.Etcd = "etcd"
	}
	if o.EtcdPorts == [2]int{} {
		o.EtcdPorts = [2]int{2379, 2380}
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	a := &APIServer{CA: o.CA, o: o, URL: "https://" + net.JoinHostPort(o.Host, strconv.Itoa(o.Port))}
	if a.CA == nil {
		if a.CA, err = pkitest.Issue(nil, pkitest.Spec{CN: "kube-apiserver-ca", CA: true}); err != nil {
			return nil, err
		}
	}
	caFile := filepath.Join(o.Dir, "apiserver-ca.crt")
	if err := os.WriteFile(caFile, a.CA.CertPEM, 0o600); err != nil {
		return nil, err
	}
	serving, err := pkitest.Issue(a.CA, pkitest.Spec{CN: "kube-apiserver", Hosts: []string{o.Host}, Server: true})
	if err != nil {
		return nil, err
	}
	servingCrt, servingKey, err := serving.WriteFiles(o.Dir, "apiserver")
	if err != nil {
		return nil, err
	}
	if a.admin, err = pkitest.Issue(a.CA, pkitest.Spec{CN: "harness-admin", Orgs: []string{"system:masters"}, Client: true}); err != nil {
		return nil, err
	}
	a.Kubeconfig = filepath.Join(o.Dir, "admin.kubeconfig")
	if err := pkitest.WriteKubeconfig(a.Kubeconfig, clientcmdapi.Cluster{Server: a.URL, CertificateAuthorityData: a.CA.CertPEM}, a.admin.User()); err != nil {
		return nil, err
	}
	saPub, saKey, err := pkitest.WriteServiceAccountKeys(o.Dir)
	if err != nil {
		return nil, err
	}
	var via []string
	if o.Netns != "" {
		via = NetnsExec(o.Netns)
	}
	etcdURL := func(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }
	a.Etcd = &Proc{Name: "etcd", LogPath: filepath.Join(o.Dir, "etcd.log"), Via: via, Keep: o.Keep, Argv: []string{o.Etcd,
		"--name=harness", "--data-dir=" + filepath.Join(o.Dir, "etcd"),
		"--listen-client-urls=" + etcdURL(o.EtcdPorts[0]), "--advertise-client-urls=" + etcdURL(o.EtcdPorts[0]),
		"--listen-peer-urls=" + etcdURL(o.EtcdPorts[1]), "--initial-advertise-peer-urls=" + etcdURL(o.EtcdPorts[1]),
		"--initial-cluster=harness=" + etcdURL(o.EtcdPorts[1]), "--unsafe-no-fsync"}}
	if err := a.Etcd.Launch(); err != nil {
		return nil, err
	}
	if err := Poll("etcd", time.Minute, 200*time.Millisecond, func() error {
		if err := a.Etcd.Exited(); err != nil {
			return err
		}
		return a.getOK(etcdURL(o.EtcdPorts[0]) + "/health")
	}); err != nil {
		return a, fmt.Errorf("%w\n%s", err, Tail(a.Etcd.Log(), 2000))
	}
	a.Proc = &Proc{Name: "kube-apiserver", LogPath: filepath.Join(o.Dir, "kube-apiserver.log"), Via: via, Keep: o.Keep, Argv: append([]string{o.Bin,
		"--etcd-servers=" + etcdURL(o.EtcdPorts[0]), "--bind-address=" + o.Host, "--advertise-address=" + o.Host,
		"--secure-port=" + strconv.Itoa(o.Port), "--authorization-mode=RBAC", "--service-cluster-ip-range=198.18.128.0/24",
		"--tls-cert-file=" + servingCrt, "--tls-private-key-file=" + servingKey, "--client-ca-file=" + caFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--profiling=false"}, o.Args...)}
	if err := a.Proc.Launch(); err != nil {
		return a, err
	}
	return a, nil
}

// Stop stops kube-apiserver, then etcd.
func (a *APIServer) Stop() {
	for _, p := range []*Proc{a.Proc, a.Etcd} {
		if p != nil && p.cmd != nil {
			_ = p.Stop(syscall.SIGTERM, 10*time.Second)
		}
	}
}

// WaitReady waits until kube-apiserver answers /readyz and takes a write into kube-system, failing early
// if it exits. /readyz does not cover the second: kube-apiserver creates its system namespaces after its
// post-start hooks report done, and a create in the first seconds after /readyz has been seen to hang
// for the whole of a test's deadline. A dry-run create goes through admission and validation, as the
// tests' own writes do, without leaving an object behind; each attempt has its own short deadline.
func (a *APIServer) WaitReady(within time.Duration) error {
	cs, err := a.Client()
	if err != nil {
		return err
	}
	probe := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "harness-write-probe"}}
	err = Poll("kube-apiserver /readyz and a write into kube-system", within, 500*time.Millisecond, func() error {
		if err := a.Proc.Exited(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
			return err
		}
		_, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceSystem).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, Tail(a.Proc.Log(), 3000))
	}
	return nil
}

// RESTConfig is an admin's client configuration; its connections are made inside the namespace when there
// is one.
func (a *APIServer) RESTConfig() *rest.Config {
	rc := &rest.Config{Host: a.URL, TLSClientConfig: rest.TLSClientConfig{CAData: a.CA.CertPEM, CertData: a.admin.CertPEM, KeyData: a.admin.KeyPEM},
		QPS: -1, Timeout: 30 * time.Second}
	if a.o.Netns != "" {
		ns := a.o.Netns
		rc.Dial = func(ctx context.Context, _, addr string) (net.Conn, error) { return DialIn(ctx, ns, addr) }
	}
	return rc
}

// Client is an admin's clientset (see RESTConfig).
func (a *APIServer) Client() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(a.RESTConfig())
}

// getOK GETs a plain HTTP url from inside the namespace and wants 200.
func (a *APIServer) getOK(url string) error {
	ns := a.o.Netns
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return DialIn(ctx, ns, addr) }}}
	res, err := c.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, res.Status)
	}
	return nil
}

// AgentAuth prepares kube-apiserver for Konnectivity agents that authenticate by token, as konnect init's
// manifests do: the ServiceAccount namespace/name, and a user (a client certificate with common name
// serverUser, written into a kubeconfig at kubeconfig) that may create TokenReviews and get Nodes (to check
// agents' identifiers against their node's addresses) and nothing else.
func (a *APIServer) AgentAuth(ctx context.Context, namespace, name, serverUser, kubeconfig string) error {
	cs, err := a.Client()
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ServiceAccount %s/%s: %w", namespace, name, err)
	}
	role := "harness:token-reviewer"
	_, err = cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		}},
		metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ClusterRole: %w", err)
	}
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role + ":" + serverUser},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: serverUser}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ClusterRoleBinding: %w", err)
	}
	user, err := pkitest.Issue(a.CA, pkitest.Spec{CN: serverUser, Client: true})
	if err != nil {
		return err
	}
	return pkitest.WriteKubeconfig(kubeconfig, clientcmdapi.Cluster{Server: a.URL, CertificateAuthorityData: a.CA.CertPEM}, user.User())
}

// Tokens asks for n ServiceAccount tokens of namespace/name for audience, valid for validFor (at least 10
// minutes), as kubelet asks for projected tokens: each one distinct, as every agent pod's is. parallel
// requests are in flight at once.
func (a *APIServer) Tokens(ctx context.Context, namespace, name, audience string, validFor time.Duration, n, parallel int) ([]string, error) {
	cs, err := a.Client()
	if err != nil {
		return nil, err
	}
	secs := int64(validFor.Seconds())
	tokens := make([]string, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authnv1.TokenRequest{
				Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &secs}}, metav1.CreateOptions{})
			if err != nil {
				errs <- fmt.Errorf("TokenRequest %s/%s: %w", namespace, name, err)
				return
			}
			tokens[i] = tr.Status.Token
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return tokens, nil
}

// E2ETool returns the path of a program that test/e2e/tools/build.sh builds (kube-apiserver, upstream
// proxy-server, ...), running the script once per test binary; a cache hit takes a moment, a first build
// many minutes. $KONNECT_E2E_TOOLS may name a directory that has them.
func E2ETool(t testing.TB, name string) string {
	t.Helper()
	e2eToolsOnce.Do(func() {
		if d := os.Getenv("KONNECT_E2E_TOOLS"); d != "" {
			e2eToolsDir = d
			return
		}
		root, err := RepoRoot()
		if err != nil {
			e2eToolsErr = err
			return
		}
		out, err := exec.Command("bash", filepath.Join(root, "test", "e2e", "tools", "build.sh")).Output()
		if err != nil {
			e2eToolsErr = fmt.Errorf("test/e2e/tools/build.sh: %w", err)
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		e2eToolsDir = lines[len(lines)-1]
	})
	if e2eToolsErr != nil {
		t.Fatal(e2eToolsErr)
	}
	p := filepath.Join(e2eToolsDir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return p
}

var (
	e2eToolsOnce sync.Once
	e2eToolsDir  string
	e2eToolsErr  error
)
