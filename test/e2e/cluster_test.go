//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// egressMode is one way kube-apiserver reaches the tunnel; it is fixed when
// kube-apiserver starts (--egress-selector-config-file), so each mode gets
// its own cluster.
type egressMode struct {
	tag       string // short, used in namespace names
	mode      string // konnect init --mode: grpc | http-connect
	transport string // konnect init --transport: uds | tcp
}

var (
	modeGRPCUDS        = egressMode{"grpc", "grpc", "uds"}
	modeHTTPConnectUDS = egressMode{"hcuds", "http-connect", "uds"}
	modeHTTPConnectTCP = egressMode{"hctcp", "http-connect", "tcp"}
)

// cluster is etcd + kube-apiserver in cp and sample-apiserver on the pod
// address in w1, set up with konnect init and konnect certs apiservice. The
// tunnel is not part of it: each scenario starts its own servers and agents.
type cluster struct {
	mode egressMode
	tp   *topology

	dir        string // everything of this cluster
	logDir     string
	konnectDir string // konnect init --dir
	pki        string // konnectDir/pki
	kubeconfig string // admin (O=system:masters), server https://198.18.0.1:6443

	// From the egress selector configuration konnect init wrote.
	udsName     string // UDS modes
	frontendURL string // TCP mode: https://HOST:PORT kube-apiserver dials

	etcd, apiserver, sample *proc

	// tunnelStarted is set once any scenario started a tunnel server; until
	// then the APIService cannot have been Available.
	tunnelStarted bool
}

const (
	apiServiceName = "v1alpha1.wardle.example.com"
	flundersPath   = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders"
)

// The machine is small, so one cluster runs at a time, of either kind: running, whose kind is an egress
// mode's tag or "nodes". Both guarded by clusterMu.
var (
	clusterMu   sync.Mutex
	running     sharedEnv
	runningKind string
	clusterSeq  int // makes each cluster's names and files unique, also after a restart
)

type sharedEnv interface {
	healthy() error
	close()
	where() string
}

// shared returns the running cluster if it is of kind and healthy. Otherwise it stops the running one and
// starts a new one with start. Tests of the same kind share one cluster.
func shared[T any, C interface {
	*T
	sharedEnv
}](t *testing.T, kind, what string, start func(name string) (C, error)) C {
	t.Helper()
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if running != nil && runningKind == kind {
		err := running.healthy()
		if err == nil {
			return running.(C)
		}
		t.Logf("%s (%s) is broken, starting a new one: %v", what, running.where(), err)
	}
	if running != nil && !keepEnv {
		running.close()
	}
	running = nil
	began := time.Now()
	clusterSeq++
	c, err := start(fmt.Sprintf("%s%d", kind, clusterSeq))
	if err != nil {
		if c != nil && !keepEnv {
			c.close()
		}
		t.Fatalf("start %s: %v", what, err)
	}
	t.Logf("%s up in %v (%s)", what, time.Since(began).Round(time.Second), c.where())
	running, runningKind = c, kind
	return c
}

// sharedCluster returns the running cluster for mode, starting it if needed.
func sharedCluster(t *testing.T, mode egressMode) *cluster {
	t.Helper()
	return shared(t, mode.tag, mode.tag+" cluster", func(name string) (*cluster, error) { return newCluster(mode, name) })
}

func (c *cluster) where() string { return fmt.Sprintf("namespaces %s-*, files %s", c.tp.prefix, c.dir) }

func (c *cluster) healthy() error {
	for _, p := range []*proc{c.etcd, c.apiserver, c.sample} {
		if p == nil {
			return fmt.Errorf("not started")
		}
		if err := p.Exited(); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) close() {
	for _, p := range []*proc{c.sample, c.apiserver, c.etcd} {
		if p != nil {
			p.res.release()
		}
	}
	if c.tp != nil {
		c.tp.destroy()
	}
}

// makeDirs sets the cluster's directories under workRoot/name (logs, konnect's dir and its pki) and creates
// them.
func (c *cluster) makeDirs(name string) error {
	c.dir = filepath.Join(workRoot, name)
	c.logDir = filepath.Join(c.dir, "logs")
	c.konnectDir = filepath.Join(c.dir, "k")
	c.pki = filepath.Join(c.konnectDir, "pki")
	for _, d := range []string{c.logDir, c.konnectDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func newCluster(mode egressMode, name string) (*cluster, error) {
	c := &cluster{mode: mode}
	if err := c.makeDirs(name); err != nil {
		return nil, err
	}
	tp, err := newTopology(name)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	c.tp = tp

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	flags, err := c.konnectInit(ctx)
	if err != nil {
		return c, err
	}
	apiFlags, err := c.harnessPKI()
	if err != nil {
		return c, fmt.Errorf("harness PKI: %w", err)
	}
	if err := c.startEtcd(ctx); err != nil {
		return c, err
	}
	if err := c.startAPIServer(ctx, append(apiFlags, flags...)); err != nil {
		return c, err
	}
	if err := c.bootstrapObjects(ctx); err != nil {
		return c, err
	}
	if err := c.startSampleAPIServer(ctx); err != nil {
		return c, err
	}
	return c, nil
}

// konnectInit runs `konnect init` for this cluster and returns the
// kube-apiserver flags it wrote.
func (c *cluster) konnectInit(ctx context.Context, extra ...string) ([]string, error) {
	args := []string{bins.konnect, "init",
		"--dir", c.konnectDir,
		"--control-plane-address", cpAddr,
		"--apiserver-url", fmt.Sprintf("https://%s:%d", cpAddr, apiPort),
		"--mode", c.mode.mode,
		"--transport", c.mode.transport,
		"--enable-aggregator-routing",
	}
	if out, err := harness.Run(ctx, "", append(args, extra...)...); err != nil {
		return nil, fmt.Errorf("konnect init: %w\n%s", err, out)
	}
	flags, err := readFlagsFile(filepath.Join(c.konnectDir, "kube-apiserver.flags"))
	if err != nil {
		return nil, fmt.Errorf("after konnect init: %w", err)
	}
	egressFile := ""
	for _, f := range flags {
		if v, ok := strings.CutPrefix(f, "--egress-selector-config-file="); ok {
			egressFile = v
		}
	}
	if egressFile == "" {
		return nil, fmt.Errorf("kube-apiserver.flags from konnect init has no --egress-selector-config-file")
	}
	if err := c.readEgressConfig(egressFile); err != nil {
		return nil, err
	}
	return flags, nil
}

// readFlagsFile reads one --flag=value per line; blank lines and # comments
// are ignored.
func readFlagsFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	defer f.Close()
	var flags []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "--") || !strings.Contains(line, "=") {
			return nil, fmt.Errorf("%s:%d: want --flag=value, got %q", path, n, line)
		}
		flags = append(flags, line)
	}
	return flags, sc.Err()
}

// readEgressConfig reads where kube-apiserver will dial the tunnel, so that
// the scenarios start the server exactly there.
func (c *cluster) readEgressConfig(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("egress selector configuration: %w", err)
	}
	var cfg struct {
		Kind             string `json:"kind"`
		EgressSelections []struct {
			Name       string `json:"name"`
			Connection struct {
				ProxyProtocol string `json:"proxyProtocol"`
				Transport     struct {
					UDS *struct {
						UDSName string `json:"udsName"`
					} `json:"uds"`
					TCP *struct {
						URL string `json:"url"`
					} `json:"tcp"`
				} `json:"transport"`
			} `json:"connection"`
		} `json:"egressSelections"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, s := range cfg.EgressSelections {
		if s.Name != "cluster" {
			continue
		}
		want := map[string]string{"grpc": "GRPC", "http-connect": "HTTPConnect"}[c.mode.mode]
		if s.Connection.ProxyProtocol != want {
			return fmt.Errorf("%s: cluster proxyProtocol %q, want %q", path, s.Connection.ProxyProtocol, want)
		}
		switch {
		case c.mode.transport == "uds" && s.Connection.Transport.UDS != nil:
			c.udsName = s.Connection.Transport.UDS.UDSName
		case c.mode.transport == "tcp" && s.Connection.Transport.TCP != nil:
			c.frontendURL = s.Connection.Transport.TCP.URL
		default:
			return fmt.Errorf("%s: cluster transport is not %s", path, c.mode.transport)
		}
		return nil
	}
	return fmt.Errorf("%s: no egress selection named cluster", path)
}

// harnessPKI makes what konnect does not own: the API server's serving
// cert (signed by the cluster CA konnect init made), the admin kubeconfig and
// the service-account keys. It returns the matching kube-apiserver flags.
func (c *cluster) harnessPKI() ([]string, error) {
	dir := filepath.Join(c.dir, "harness")
	ca, err := pkitest.Load(filepath.Join(c.pki, "ca.crt"), filepath.Join(c.pki, "ca.key"))
	if err != nil {
		return nil, fmt.Errorf("cluster CA from konnect init: %w", err)
	}
	serving, err := pkitest.Issue(ca, pkitest.Spec{
		CN: "kube-apiserver",
		Hosts: []string{cpAddr, "127.0.0.1", "198.18.128.1",
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		Server: true,
	})
	if err != nil {
		return nil, err
	}
	servingCrt, servingKey, err := serving.WriteFiles(dir, "apiserver")
	if err != nil {
		return nil, err
	}
	admin, err := pkitest.Issue(ca, pkitest.Spec{CN: "e2e-admin", Orgs: []string{"system:masters"}, Client: true})
	if err != nil {
		return nil, err
	}
	if _, _, err := admin.WriteFiles(dir, "admin"); err != nil {
		return nil, err
	}
	c.kubeconfig = filepath.Join(dir, "admin.conf")
	if err := pkitest.WriteKubeconfig(c.kubeconfig, clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:%d", cpAddr, apiPort), CertificateAuthorityData: ca.CertPEM}, admin.User()); err != nil {
		return nil, err
	}
	saPub, saKey, err := pkitest.WriteServiceAccountKeys(dir)
	if err != nil {
		return nil, err
	}
	return []string{
		"--tls-cert-file=" + servingCrt,
		"--tls-private-key-file=" + servingKey,
		"--client-ca-file=" + filepath.Join(c.pki, "ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
	}, nil
}

func (c *cluster) startEtcd(ctx context.Context) error {
	data := filepath.Join(c.dir, "etcd")
	p, err := startProc("etcd", c.tp.ns(nsCP), c.logDir, bins.etcd,
		"--name=e2e",
		"--data-dir="+data,
		"--listen-client-urls=http://127.0.0.1:2379,http://"+cpAddr+":2379",
		"--advertise-client-urls=http://"+cpAddr+":2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=e2e=http://127.0.0.1:2380",
		// Fewer fsyncs: the data lives only as long as the test.
		"--unsafe-no-fsync",
	)
	if err != nil {
		return err
	}
	c.etcd = p
	client := nsHTTPClient(c.tp.ns(nsCP), nil, 2*time.Second)
	return harness.Poll("etcd /health", time.Minute, 200*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		return httpGetOK(ctx, client, "http://127.0.0.1:2379/health", nil)
	})
}

func (c *cluster) startAPIServer(ctx context.Context, extra []string) error {
	args := []string{bins.kubeAPIServer,
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=" + cpAddr,
		"--advertise-address=" + cpAddr,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=" + serviceNet,
		"--profiling=false",
	}
	args = append(args, extra...)
	p, err := startProc("kube-apiserver", c.tp.ns(nsCP), c.logDir, args...)
	if err != nil {
		return err
	}
	c.apiserver = p
	client, err := c.apiHTTPClient(nsCP)
	if err != nil {
		return err
	}
	return harness.Poll("kube-apiserver /readyz", 3*time.Minute, 500*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		return httpGetOK(ctx, client, fmt.Sprintf("https://%s:%d/readyz?verbose", cpAddr, apiPort), nil)
	})
}

// apiHTTPClient is an admin HTTP client for kube-apiserver that dials from
// inside namespace role.
func (c *cluster) apiHTTPClient(role string) (*http.Client, error) {
	ca, err := os.ReadFile(filepath.Join(c.pki, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	adminCert, err := tls.LoadX509KeyPair(filepath.Join(c.dir, "harness", "admin.crt"), filepath.Join(c.dir, "harness", "admin.key"))
	if err != nil {
		return nil, err
	}
	return nsHTTPClient(c.tp.ns(role), &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{adminCert}}, 10*time.Second), nil
}

// nsHTTPClient is an HTTP client whose connections start inside ns.
func nsHTTPClient(ns string, tlsConfig *tls.Config, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return harness.DialIn(ctx, ns, addr)
			},
			TLSClientConfig:   tlsConfig,
			DisableKeepAlives: true,
			Proxy:             nil, // never an HTTP(S)_PROXY from the environment

		},
	}
}

func httpGetOK(ctx context.Context, client *http.Client, u string, body *string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if body != nil {
		*body = string(b)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, tailString(string(b), 2000))
	}
	return nil
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// kubectl runs kubectl as admin from inside namespace role.
func (c *cluster) kubectl(ctx context.Context, role string, args ...string) (string, error) {
	return harness.Run(ctx, c.tp.ns(role), append([]string{bins.kubectl, "--kubeconfig", c.kubeconfig}, args...)...)
}

func (c *cluster) kubectlT(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.kubectl(ctx, nsCP, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// applyYAML pipes a manifest into kubectl apply.
func (c *cluster) applyYAML(ctx context.Context, manifest string, extra ...string) error {
	path := filepath.Join(c.dir, fmt.Sprintf("apply-%s.yaml", randHex(4)))
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		return err
	}
	_, err := c.kubectl(ctx, nsCP, append([]string{"apply", "-f", path}, extra...)...)
	return err
}

// bootstrapObjects creates what a controller-manager and the extension
// server's deployment would (the wardle namespace, kube-system's default
// ServiceAccount, a selector-less Service with Endpoints and an
// EndpointSlice that point at the pod address) and applies the
// ServiceAccount and RBAC that konnect init generated for the tunnel.
func (c *cluster) bootstrapObjects(ctx context.Context) error {
	objs := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: wardle
---
# The controller-manager would create it; pod admission (even a server-side
# dry run of a static pod) needs it.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: default
  namespace: kube-system
---
apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: wardle
spec:
  ports:
  - name: https
    port: 443
    targetPort: %[2]d
---
apiVersion: v1
kind: Endpoints
metadata:
  name: api
  namespace: wardle
subsets:
- addresses:
  - ip: %[1]s
  ports:
  - name: https
    port: %[2]d
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: api-e2e
  namespace: wardle
  labels:
    kubernetes.io/service-name: api
addressType: IPv4
endpoints:
- addresses: [%[1]q]
  conditions:
    ready: true
ports:
- name: https
  port: %[2]d
  protocol: TCP
`, podAddr, podPort)
	if err := c.applyYAML(ctx, objs); err != nil {
		return fmt.Errorf("bootstrap objects: %w", err)
	}
	if err := c.applyKonnectRBAC(ctx); err != nil {
		return err
	}
	return nil
}

// startSampleAPIServer makes its serving cert and APIService with konnect
// certs apiservice and starts it on the pod address in w1.
func (c *cluster) startSampleAPIServer(ctx context.Context) error {
	certFile, keyFile, err := c.konnectCertsAPIService(ctx)
	if err != nil {
		return err
	}
	p, err := startProc("sample-apiserver", c.tp.ns(nsW1), c.logDir, bins.sampleAPIServer,
		"--etcd-servers=http://"+cpAddr+":2379",
		"--kubeconfig="+c.kubeconfig,
		"--authentication-kubeconfig="+c.kubeconfig,
		"--authorization-kubeconfig="+c.kubeconfig,
		"--bind-address="+podAddr,
		"--secure-port="+strconv.Itoa(podPort),
		"--tls-cert-file="+certFile,
		"--tls-private-key-file="+keyFile,
	)
	if err != nil {
		return err
	}
	c.sample = p
	// Its own health, checked from w1 where the pod address is local.
	client := nsHTTPClient(c.tp.ns(nsW1), &tls.Config{InsecureSkipVerify: true}, 3*time.Second) //nolint:gosec // liveness probe only; the real TLS check is the APIService's caBundle
	return harness.Poll("sample-apiserver /readyz", 2*time.Minute, 500*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		return httpGetOK(ctx, client, fmt.Sprintf("https://%s:%d/readyz", podAddr, podPort), nil)
	})
}

// waitAPIService waits for the APIService's Available condition to be want
// ("True" or "False").
func (c *cluster) waitAPIService(ctx context.Context, want string, timeout time.Duration) error {
	var last string
	return harness.Poll("APIService "+apiServiceName+" Available="+want, timeout, time.Second, func() error {
		out, err := c.kubectl(ctx, nsCP, "get", "apiservice", apiServiceName,
			"-o", `jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].message}`)
		if err != nil {
			return err
		}
		last = strings.TrimSpace(out)
		if strings.HasPrefix(last, want+" ") || last == want {
			return nil
		}
		return fmt.Errorf("condition: %q", last)
	})
}

func urlHostPort(u string) (string, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	return pu.Host, nil
}
