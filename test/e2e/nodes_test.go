//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/konnect-dev/konnect/hack/image/oci"
	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
)

// The node cluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler as processes in cp,
// and a containerd and a kubelet on each of cp, w1 and w2. konnect runs from its own image: the server as
// the static pod that `konnect init` wrote into cp's manifest directory, the agents as the DaemonSet of
// `kubectl apply -k DIR/konnectivity-agent`.
//
//	           lap 198.18.1.2 ── 198.18.1.1 cp 198.18.0.1 (node IP) ── 198.18.0.2 w1, node IP 198.19.250.1 (lo)
//	                                         198.18.0.5         ── 198.18.0.6 w2, node IP 198.19.250.2 (lo)
//	pods:  cp 198.19.3.0/24, w1 198.19.1.0/24, w2 198.19.2.0/24 (a CNI bridge per node, route 198.18.0.0/15 only)
//
// cp has no route to the workers' node IPs or pod subnets, so kube-apiserver reaches their kubelets only
// through the tunnel; the workers' pods leave masqueraded to the worker's veth address.

// envImage is the konnect image tarball (`make image`); without it the test runs `make image` itself.
const envImage = "KONNECT_IMAGE"

type nodeSpec struct {
	name    string // node name, also the namespace role
	ip      string // kubelet's --node-ip and address
	podCIDR string
}

var nodeSpecs = []nodeSpec{
	{nsCP, cpAddr, "198.19.3.0/24"},
	{nsW1, "198.19.250.1", "198.19.1.0/24"},
	{nsW2, "198.19.250.2", "198.19.2.0/24"},
}

// Images built by the harness; nothing is ever pulled.
const (
	imgPause       = "e2e.local/pause:1"
	imgBusybox     = "e2e.local/busybox:1"
	imgProxyServer = "e2e.local/proxy-server:v0.36.0"
	imgProxyAgent  = "e2e.local/proxy-agent:v0.36.0"
	imgSample      = "e2e.local/sample-apiserver:v0.36.1"
	imgPizza       = "e2e.local/pizza-webhook:e2e"
)

// Inside the upstream images: the command that replaces konnect's in the swaps.
const (
	upstreamServerBin = "/usr/local/bin/proxy-server"
	upstreamAgentBin  = "/usr/local/bin/proxy-agent"
)

type node struct {
	nodeSpec
	ns         string
	dir        string
	sock       string // containerd's grpc socket
	cgroup     string // kubelet's cgroupRoot, e.g. /kn1234-ab12-w1
	containerd *proc
	kubelet    *proc
}

type nodeCluster struct {
	*cluster // etcd, kube-apiserver, konnect init, the harness PKI and kubectl helpers
	nodes    []*node
	kcm      *proc
	sched    *proc

	konnectImage string // the tag in the konnect image tarball
	images       []string
	sysctls      map[string]string // host values kubelet overwrites, restored at teardown
	createdPaths []string          // fixed host paths that did not exist before the cluster
	closed       bool              // guarded by closeMu
}

// sharedNodeCluster returns the running node cluster, starting it (and stopping any other cluster) first.
func sharedNodeCluster(t *testing.T) *nodeCluster {
	t.Helper()
	return shared(t, "nodes", "node cluster", func(name string) (*nodeCluster, error) { return newNodeCluster(t, name) })
}

func (nc *nodeCluster) healthy() error {
	ps := []*proc{nc.etcd, nc.apiserver, nc.kcm, nc.sched}
	for _, n := range nc.nodes {
		ps = append(ps, n.containerd, n.kubelet)
	}
	for _, p := range ps {
		if p == nil {
			return fmt.Errorf("not started")
		}
		if err := p.Exited(); err != nil {
			return err
		}
	}
	return nil
}

func (nc *nodeCluster) node(name string) *node {
	for _, n := range nc.nodes {
		if n.name == name {
			return n
		}
	}
	panic("unknown node " + name)
}

func newNodeCluster(t *testing.T, name string) (*nodeCluster, error) {
	c := &cluster{mode: modeGRPCUDS}
	nc := &nodeCluster{cluster: c, sysctls: map[string]string{}}
	if err := c.makeDirs(name); err != nil {
		return nil, err
	}
	// Everything below is released by nc.close, in the order TOPOLOGY.md found to leave nothing behind.
	nc.trackTeardown()

	tp, err := newTopology(name)
	if err != nil {
		return nc, fmt.Errorf("network: %w", err)
	}
	c.tp = tp
	if err := nc.nodeNetwork(); err != nil {
		return nc, fmt.Errorf("node network: %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	// The images build while the control plane starts.
	imgErr := make(chan error, 1)
	imgStart := time.Now()
	go func() { imgErr <- nc.buildImages(ctx) }()

	step := time.Now()
	// The servers keep Leases and the agents count them, as an HA control plane whose server count changes
	// would run: TestNodes/server-leases checks both.
	flags, err := c.konnectInit(ctx, "--server-leases")
	if err != nil {
		return nc, err
	}
	apiFlags, err := c.harnessPKI()
	if err != nil {
		return nc, fmt.Errorf("harness PKI: %w", err)
	}
	harness := filepath.Join(c.dir, "harness")
	apiFlags = append(apiFlags,
		"--kubelet-client-certificate="+filepath.Join(harness, "admin.crt"),
		"--kubelet-client-key="+filepath.Join(harness, "admin.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--enable-admission-plugins=NodeRestriction",
	)
	if err := c.startEtcd(ctx); err != nil {
		return nc, err
	}
	if err := c.startAPIServer(ctx, append(apiFlags, flags...)); err != nil {
		return nc, err
	}
	if err := nc.startControllers(); err != nil {
		return nc, err
	}
	t.Logf("control plane up in %v", time.Since(step).Round(100*time.Millisecond))
	if err := <-imgErr; err != nil {
		return nc, fmt.Errorf("images: %w", err)
	}
	t.Logf("images built in %v", time.Since(imgStart).Round(100*time.Millisecond))
	if err := nc.checkDefaultImage(); err != nil {
		return nc, err
	}

	step = time.Now()
	nc.saveSysctls()
	var wg sync.WaitGroup
	errs := make([]error, len(nodeSpecs))
	for i, s := range nodeSpecs {
		n := &node{nodeSpec: s, ns: tp.ns(s.name), dir: filepath.Join(c.dir, "node-"+s.name), cgroup: "/" + tp.prefix + "-" + s.name}
		nc.nodes = append(nc.nodes, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = nc.startNode(ctx, n)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nc, err
	}
	if err := nc.waitNodesReady(ctx); err != nil {
		return nc, err
	}
	t.Logf("kubelets registered and Ready in %v", time.Since(step).Round(100*time.Millisecond))

	step = time.Now()
	// The kustomization first: it also holds the server's TokenReview permission, which the server's
	// readiness checks.
	if _, err := c.kubectl(ctx, nsCP, "apply", "-k", filepath.Join(c.konnectDir, "konnectivity-agent")); err != nil {
		return nc, fmt.Errorf("kubectl apply -k konnectivity-agent: %w", err)
	}
	if err := nc.waitServerPod(ctx, implKonnect, 2*time.Minute); err != nil {
		return nc, err
	}
	if err := nc.waitAgentsRolledOut(ctx, 2*time.Minute); err != nil {
		return nc, err
	}
	// kubelet has scanned the directory konnect init wrote many times by now (every 2 s here).
	if b, err := os.ReadFile(nc.nodes[0].kubelet.LogPath); err != nil || strings.Contains(string(b), "not recursing into manifest path") {
		return nc, fmt.Errorf("cp's kubelet complains about what konnect init put in its static-pod directory (%v): %s",
			err, grepLine(string(b), "not recursing into manifest path"))
	}
	t.Logf("server static pod and agent DaemonSet ready in %v", time.Since(step).Round(100*time.Millisecond))

	step = time.Now()
	if err := nc.deployWorkloads(ctx); err != nil {
		return nc, err
	}
	t.Logf("sample-apiserver and busybox pods ready, APIService Available in %v", time.Since(step).Round(100*time.Millisecond))
	return nc, nil
}

// nodeNetwork adds what the nodes need to the topology: the workers' node IPs on their own lo, and
// masquerading of their pods' traffic to cp (cp has no route back into a worker's pod subnet).
func (nc *nodeCluster) nodeNetwork() error {
	for _, s := range nodeSpecs {
		ns := nc.tp.ns(s.name)
		if s.name == nsCP {
			continue
		}
		if err := harness.IP("-n", ns, "addr", "add", s.ip+"/32", "dev", "lo"); err != nil {
			return err
		}
		for _, argv := range [][]string{
			{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
			{"iptables", "-t", "nat", "-A", "POSTROUTING", "-s", s.podCIDR, "-o", "to-cp", "-j", "MASQUERADE"},
		} {
			if out, err := harness.Run(context.Background(), ns, argv...); err != nil {
				return fmt.Errorf("%w %s", err, out)
			}
		}
	}
	return nil
}

// imagesDir holds the image tarballs, built once per run.
func imagesDir() string { return filepath.Join(workRoot, "images") }

var imagesOnce struct {
	sync.Mutex
	done    bool
	konnect string // tarball
}

// buildImages builds the pause, busybox, upstream proxy-server/proxy-agent, sample-apiserver and pizza-webhook images
// with hack/image/oci, and finds konnect's (KONNECT_IMAGE, or `make image`).
func (nc *nodeCluster) buildImages(ctx context.Context) error {
	imagesOnce.Lock()
	defer imagesOnce.Unlock()
	dir := imagesDir()
	if !imagesOnce.done {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		root, err := harness.RepoRoot()
		if err != nil {
			return err
		}
		pause := filepath.Join(dir, "pause")
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", pause, "./test/e2e/images/pause")
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build pause: %w\n%s", err, out)
		}
		busybox := oci.Spec{
			Files:    []oci.File{{Src: "/bin/busybox", Dst: "/bin/busybox", Mode: 0o755}},
			Symlinks: map[string]string{},
			Dirs:     []string{"/tmp"},
			Env:      []string{"PATH=/bin"},
			Cmd:      []string{"/bin/sh"},
		}
		for _, applet := range []string{"sh", "tar", "cat", "sleep", "sha256sum", "dd", "httpd", "nc", "ls", "echo", "mkdir", "rm", "test", "[", "head", "wc", "env", "id", "ps", "kill", "true", "false", "mv", "cp", "find", "stat"} {
			busybox.Symlinks["/bin/"+applet] = "busybox"
		}
		tools := filepath.Dir(bins.kubeAPIServer)
		// Each image in its own goroutine, konnect's (make image) too: gzip of the binaries is the slow part.
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for _, im := range []struct {
			ref  string
			spec oci.Spec
		}{
			{imgPause, oci.Spec{Files: []oci.File{{Src: pause, Dst: "/pause", Mode: 0o755}}, Entrypoint: []string{"/pause"}}},
			{imgBusybox, busybox},
			{imgProxyServer, oci.Spec{Files: []oci.File{{Src: bins.proxyServer, Dst: upstreamServerBin, Mode: 0o755}}, Entrypoint: []string{upstreamServerBin}}},
			{imgProxyAgent, oci.Spec{Files: []oci.File{{Src: bins.proxyAgent, Dst: upstreamAgentBin, Mode: 0o755}}, Entrypoint: []string{upstreamAgentBin}, User: "65534:65534"}},
			{imgSample, oci.Spec{Files: []oci.File{{Src: filepath.Join(tools, "sample-apiserver"), Dst: "/usr/local/bin/sample-apiserver", Mode: 0o755}}, Entrypoint: []string{"/usr/local/bin/sample-apiserver"}}},
			{imgPizza, oci.Spec{Files: []oci.File{{Src: bins.pizzaWebhook, Dst: "/usr/local/bin/pizza-webhook", Mode: 0o755}}, Entrypoint: []string{"/usr/local/bin/pizza-webhook"}, User: "65534:65534"}},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				img, err := oci.Build(im.spec)
				if err == nil {
					_, err = oci.WriteTarball(imageTarball(im.ref), im.ref, img)
				}
				if err != nil {
					errs <- fmt.Errorf("image %s: %w", im.ref, err)
				}
			}()
		}
		imagesOnce.konnect = os.Getenv(envImage)
		if imagesOnce.konnect == "" {
			imagesOnce.konnect = filepath.Join(root, "bin", "konnect-image.tar")
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := makeImage(ctx, root); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		imagesOnce.done = true
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(imagesOnce.konnect) })
	if err != nil {
		return fmt.Errorf("konnect image %s: %w", imagesOnce.konnect, err)
	}
	if len(m) != 1 || len(m[0].RepoTags) != 1 {
		return fmt.Errorf("konnect image %s: want one image with one tag, got %+v", imagesOnce.konnect, m)
	}
	nc.konnectImage = m[0].RepoTags[0]
	nc.images = []string{imageTarball(imgPause), imageTarball(imgBusybox), imageTarball(imgProxyServer),
		imageTarball(imgProxyAgent), imageTarball(imgSample), imageTarball(imgPizza), imagesOnce.konnect}
	return nil
}

// makeImage runs `make image` the way `make e2e` does, for the version of the konnect binary under test:
// its init must default to this image.
func makeImage(ctx context.Context, root string) error {
	var v struct {
		Version string `json:"version"`
	}
	out, err := harness.Run(ctx, "", bins.konnect, "version", "-o", "json")
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return fmt.Errorf("konnect version -o json: %w", err)
	}
	cmd := exec.CommandContext(ctx, "make", "-s", "image", "VERSION="+v.Version)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make image: %w\n%s", err, out)
	}
	return nil
}

func imageTarball(ref string) string {
	r := strings.NewReplacer("/", "_", ":", "_")
	return filepath.Join(imagesDir(), r.Replace(ref)+".tar")
}

// checkDefaultImage proves that `konnect init`, run without --image, names the image `make image` built.
func (nc *nodeCluster) checkDefaultImage() error {
	for _, f := range []string{"manifests/konnectivity-server.yaml", "konnectivity-agent/konnectivity-agent.yaml"} {
		b, err := os.ReadFile(filepath.Join(nc.konnectDir, f))
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "image: "+nc.konnectImage+"\n") {
			return fmt.Errorf("konnect init's default --image in %s is not %s, the tag of the konnect image tarball (make image); the manifest names: %s",
				f, nc.konnectImage, grepLine(string(b), "image:"))
		}
	}
	return nil
}

func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return "(none)"
}

// startControllers starts kube-controller-manager (ServiceAccounts, tokens, kube-root-ca.crt, DaemonSet
// and Deployment controllers, endpoints) and kube-scheduler, each with its own identity.
func (nc *nodeCluster) startControllers() error {
	harness := filepath.Join(nc.dir, "harness")
	ca, err := pkitest.Load(filepath.Join(nc.pki, "ca.crt"), filepath.Join(nc.pki, "ca.key"))
	if err != nil {
		return err
	}
	kc := func(name, cn string, orgs ...string) (string, error) {
		kp, err := pkitest.Issue(ca, pkitest.Spec{CN: cn, Orgs: orgs, Client: true})
		if err != nil {
			return "", err
		}
		path := filepath.Join(harness, name+".conf")
		return path, pkitest.WriteKubeconfig(path, clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:%d", cpAddr, apiPort), CertificateAuthorityData: ca.CertPEM}, kp.User())
	}
	kcmConf, err := kc("controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	schedConf, err := kc("scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	if nc.kcm, err = startProc("kube-controller-manager", nc.tp.ns(nsCP), nc.logDir, filepath.Join(filepath.Dir(bins.kubeAPIServer), "kube-controller-manager"),
		"--kubeconfig="+kcmConf,
		"--authentication-kubeconfig="+kcmConf,
		"--authorization-kubeconfig="+kcmConf,
		"--bind-address=127.0.0.1",
		"--controllers=*",
		"--service-account-private-key-file="+filepath.Join(harness, "sa.key"),
		"--root-ca-file="+filepath.Join(nc.pki, "ca.crt"),
		"--use-service-account-credentials",
		"--cluster-signing-cert-file="+filepath.Join(nc.pki, "ca.crt"),
		"--cluster-signing-key-file="+filepath.Join(nc.pki, "ca.key"),
		"--leader-elect=false",
	); err != nil {
		return err
	}
	if nc.sched, err = startProc("kube-scheduler", nc.tp.ns(nsCP), nc.logDir, filepath.Join(filepath.Dir(bins.kubeAPIServer), "kube-scheduler"),
		"--kubeconfig="+schedConf,
		"--authentication-kubeconfig="+schedConf,
		"--authorization-kubeconfig="+schedConf,
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
	); err != nil {
		return err
	}
	return nil
}

// kubeletSysctls are the host settings kubelet writes at start (protectKernelDefaults: false); they are
// put back at teardown.
var kubeletSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

func (nc *nodeCluster) saveSysctls() {
	for _, k := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			nc.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	for _, p := range []string{"/var/lib/kubelet", "/var/lib/cni", "/run/containerd", "/var/log/containers"} {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			nc.createdPaths = append(nc.createdPaths, p)
		}
	}
}

// cgroupMounts lists the host's cgroup hierarchies (v1, and the v2 one of a hybrid layout).
func cgroupMounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				out = append(out, fields[4])
			}
		}
	}
	return out
}

// createCgroupRoot makes kubelet's cgroupRoot in every hierarchy, with cpuset's cpus and mems filled in: kubelet
// needs it to exist.
func createCgroupRoot(root string) error {
	for _, m := range cgroupMounts() {
		d := filepath.Join(m, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(m, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", filepath.Join(d, f), err)
				}
			}
		}
	}
	return nil
}

func (nc *nodeCluster) startNode(ctx context.Context, n *node) error {
	for _, d := range []string{"containerd", "cni", "cni-ipam", "kubelet", "kubelet-certs", "pod-logs", "vp", "runc"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := createCgroupRoot(n.cgroup); err != nil {
		return err
	}

	n.sock = filepath.Join(n.dir, "containerd.sock")
	cfg := filepath.Join(n.dir, "containerd.toml")
	toml := containerdTOML{root: filepath.Join(n.dir, "containerd", "root"), state: filepath.Join(n.dir, "containerd", "state"),
		address: n.sock, opt: filepath.Join(n.dir, "containerd", "opt"), sandboxImage: imgPause,
		runcRoot: filepath.Join(n.dir, "runc"), cniConfDir: filepath.Join(n.dir, "cni")}
	if err := os.WriteFile(cfg, []byte(toml.String()), 0o644); err != nil {
		return err
	}
	// One /24 per node; pods get only the route to 198.18.0.0/15, no default route.
	if err := os.WriteFile(filepath.Join(n.dir, "cni", "10-kn.conflist"), []byte(fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [{
    "type": "bridge", "bridge": "kn-br0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "198.18.0.0/15"}], "dataDir": %q}
  }]
}
`, cniNetwork(), n.podCIDR, filepath.Join(n.dir, "cni-ipam"))), 0o644); err != nil {
		return err
	}
	var err error
	if n.containerd, err = startHostMountProc("containerd-"+n.name, n.ns, nc.logDir, "containerd", "--config", cfg); err != nil {
		return err
	}
	if err := harness.Poll("containerd on "+n.name, time.Minute, 200*time.Millisecond, func() error {
		if err := n.containerd.Exited(); err != nil {
			return err
		}
		_, err := harness.Run(ctx, "", "ctr", "--address", n.sock, "version")
		return err
	}); err != nil {
		return err
	}
	for _, img := range nc.images {
		if out, err := harness.Run(ctx, "", "ctr", "--address", n.sock, "-n", "k8s.io", "images", "import", img); err != nil {
			return fmt.Errorf("node %s: import %s: %w\n%s", n.name, img, err, out)
		}
	}

	ca, err := pkitest.Load(filepath.Join(nc.pki, "ca.crt"), filepath.Join(nc.pki, "ca.key"))
	if err != nil {
		return err
	}
	kp, err := pkitest.Issue(ca, pkitest.Spec{CN: "system:node:" + n.name, Orgs: []string{"system:nodes"}, Client: true})
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(n.dir, "kubelet.conf")
	if err := pkitest.WriteKubeconfig(kubeconfig, clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:%d", cpAddr, apiPort), CertificateAuthorityData: ca.CertPEM}, kp.User()); err != nil {
		return err
	}
	staticPods := ""
	if n.name == nsCP {
		// The directory konnect init wrote, unedited: the server static pod runs from it.
		staticPods = fmt.Sprintf("staticPodPath: %s\nfileCheckFrequency: 2s\n", filepath.Join(nc.konnectDir, "manifests"))
	}
	kcfg := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(kcfg, []byte(fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[1]s
imageServiceEndpoint: unix://%[1]s
cgroupDriver: cgroupfs
cgroupRoot: %[2]s
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
%[3]spodLogsDir: %[4]s
volumePluginDir: %[5]s
address: %[6]s
readOnlyPort: 0
authentication:
  x509:
    clientCAFile: %[7]s
  anonymous:
    enabled: false
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
resolvConf: ""
makeIPTablesUtilChains: false
serializeImagePulls: false
`, n.sock, n.cgroup, staticPods, filepath.Join(n.dir, "pod-logs"), filepath.Join(n.dir, "vp"), n.ip,
		filepath.Join(nc.pki, "ca.crt"))), 0o644); err != nil {
		return err
	}
	n.kubelet, err = startHostMountProc("kubelet-"+n.name, n.ns, nc.logDir, filepath.Join(filepath.Dir(bins.kubeAPIServer), "kubelet"),
		"--config="+kcfg,
		"--kubeconfig="+kubeconfig,
		"--root-dir="+filepath.Join(n.dir, "kubelet"),
		"--cert-dir="+filepath.Join(n.dir, "kubelet-certs"),
		"--hostname-override="+n.name,
		"--node-ip="+n.ip,
		"--v=1",
	)
	return err
}

// cniNetwork names the pod network; libcni caches results in /var/lib/cni/results/NAME-*, which teardown
// removes by this name.
func cniNetwork() string { return "kn-" + runID }

func (nc *nodeCluster) waitNodesReady(ctx context.Context) error {
	return harness.Poll("3 nodes Ready", 3*time.Minute, time.Second, func() error {
		for _, n := range nc.nodes {
			if err := n.kubelet.Exited(); err != nil {
				return err
			}
		}
		out, err := nc.kubectl(ctx, nsCP, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err != nil {
			return err
		}
		if got := strings.Fields(out); len(got) != 3 || strings.Count(out, "=True") != 3 {
			return fmt.Errorf("nodes: %s", out)
		}
		return nil
	})
}

// waitServerPod waits for cp's mirror pod of the server static pod to be Ready with the image of impl.
func (nc *nodeCluster) waitServerPod(ctx context.Context, impl impl, timeout time.Duration) error {
	want := nc.konnectImage
	if impl == implUpstream {
		want = imgProxyServer
	}
	return harness.Poll("server static pod ("+string(impl)+") Ready", timeout, time.Second, func() error {
		out, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", "konnectivity-server-cp", "-o",
			`jsonpath={.spec.containers[0].image} {.status.conditions[?(@.type=="Ready")].status} {.status.containerStatuses[0].restartCount}`)
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		if len(f) < 2 || f[0] != want || f[1] != "True" {
			return fmt.Errorf("mirror pod: %q", out)
		}
		return nil
	})
}

// waitAgentsRolledOut waits until the agent DaemonSet's rollout is complete on all three nodes.
func (nc *nodeCluster) waitAgentsRolledOut(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if out, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "rollout", "status", "ds/konnectivity-agent", "--timeout="+timeout.String()); err != nil {
		return fmt.Errorf("agent DaemonSet rollout: %w\n%s", err, out)
	}
	return harness.Poll("3 agents ready", 30*time.Second, time.Second, func() error {
		out, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "ds", "konnectivity-agent", "-o", "jsonpath={.status.numberReady}/{.status.desiredNumberScheduled}/{.status.updatedNumberScheduled}")
		if err != nil {
			return err
		}
		if out != "3/3/3" {
			return fmt.Errorf("ready/desired/updated %s", out)
		}
		return nil
	})
}

// wardleAccess is sample-apiserver's namespace and ServiceAccount, with what its own deployment grants it
// besides the delegation that konnect certs apiservice binds: it watches namespaces (its admission plugin),
// webhook configurations and flow control.
const wardleAccess = `apiVersion: v1
kind: Namespace
metadata:
  name: wardle
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: api
  namespace: wardle
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: e2e:wardle-read
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e:wardle-read
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: e2e:wardle-read
subjects:
- kind: ServiceAccount
  name: api
  namespace: wardle
`

// deployWorkloads runs sample-apiserver (Deployment on w1, with the Secret, APIService and RBAC of
// `konnect certs apiservice`) and a busybox pod pinned to each worker.
func (nc *nodeCluster) deployWorkloads(ctx context.Context) error {
	if err := nc.applyYAML(ctx, wardleAccess); err != nil {
		return fmt.Errorf("wardle namespace: %w", err)
	}
	if _, _, err := nc.konnectCertsAPIService(ctx); err != nil {
		return err
	}
	// hostNetwork: upstream's destHost strategy matches agent identifiers (host=NODE_IP), not pod CIDRs,
	// and kube-apiserver (--enable-aggregator-routing) dials the endpoint IP. On the host network the
	// endpoint is w1's node IP, which w1's agent names, so the dial goes to w1's agent; a pod IP would go
	// to a random agent, which cannot reach w1's pod subnet. No kube-proxy runs: the API server's address
	// is given directly.
	if err := nc.applyYAML(ctx, sampleAPIServerManifest("http://"+cpAddr+":2379", false, cpAddr, apiPort)); err != nil {
		return fmt.Errorf("sample-apiserver: %w", err)
	}
	for _, w := range []string{nsW1, nsW2} {
		if err := nc.applyYAML(ctx, busyboxPod("bb-"+w, w)); err != nil {
			return err
		}
	}
	if err := nc.waitAPIService(ctx, "True", 2*time.Minute); err != nil {
		return err
	}
	for _, w := range []string{nsW1, nsW2} {
		if _, err := nc.kubectl(ctx, nsCP, "wait", "--for=condition=Ready", "pod/bb-"+w, "--timeout=90s"); err != nil {
			return err
		}
	}
	return nil
}

// sampleAPIServerManifest runs sample-apiserver on w1's host network (see deployWorkloads) with the Secret
// api-tls of konnect certs apiservice, reaching kube-apiserver at apiHost:apiPort and storing its objects in
// etcdServers; with etcdTLS, as the client of the Secret etcd-client.
func sampleAPIServerManifest(etcdServers string, etcdTLS bool, apiHost string, apiPort int) string {
	var etcdArgs, mounts, volumes string
	if etcdTLS {
		etcdArgs = "\n        - --etcd-cafile=/etcd/ca.crt\n        - --etcd-certfile=/etcd/tls.crt\n        - --etcd-keyfile=/etcd/tls.key\n        - --etcd-prefix=/wardle"
		mounts = "\n        - {name: etcd, mountPath: /etcd, readOnly: true}"
		volumes = "\n      - name: etcd\n        secret: {secretName: etcd-client}"
	}
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
  namespace: wardle
spec:
  replicas: 1
  selector:
    matchLabels: {app: wardle-api}
  template:
    metadata:
      labels: {app: wardle-api}
    spec:
      serviceAccountName: api
      hostNetwork: true
      nodeSelector: {kubernetes.io/hostname: w1}
      containers:
      - name: sample-apiserver
        image: %[1]s
        imagePullPolicy: Never
        command: [/usr/local/bin/sample-apiserver]
        args:
        - --etcd-servers=%[2]s%[5]s
        - --secure-port=%[8]d
        - --tls-cert-file=/certs/tls.crt
        - --tls-private-key-file=/certs/tls.key
        env:
        - {name: KUBERNETES_SERVICE_HOST, value: %[3]q}
        - {name: KUBERNETES_SERVICE_PORT, value: "%[4]d"}
        volumeMounts:
        - {name: certs, mountPath: /certs, readOnly: true}%[6]s
      volumes:
      - name: certs
        secret: {secretName: api-tls}%[7]s
---
apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: wardle
spec:
  selector: {app: wardle-api}
  ports:
  - {name: https, port: 443, targetPort: %[8]d}
`, imgSample, etcdServers, apiHost, apiPort, etcdArgs, mounts, volumes, podPort)
}

// busyboxPod writes a 64 MiB random file, serves its directory with busybox httpd on :8080 and prints a
// numbered tick every second.
func busyboxPod(name, nodeName string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: %s
    imagePullPolicy: Never
    command: [/bin/sh, -c]
    args:
    - |
      mkdir -p /tmp/www && dd if=/dev/urandom of=/tmp/www/big bs=1048576 count=64 2>/dev/null
      httpd -p 8080 -h /tmp/www
      touch /tmp/ready
      i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 1; done
    readinessProbe:
      exec: {command: [test, -f, /tmp/ready]}
      periodSeconds: 1
`, name, nodeName, imgBusybox)
}

// trackTeardown registers the cluster's release to run before every other resource (its processes and
// namespaces are tracked one by one too): containers must die before containerd, and containerd before
// the namespaces, whatever stops the run.
func (nc *nodeCluster) trackTeardown() {
	trackEarly("node cluster "+nc.dir, nc.close)
}

var closeMu sync.Mutex

// close tears the node cluster down in the order that leaves nothing behind (TOPOLOGY.md): kubelets,
// containers, containerd and its shims, the control plane, mounts, cgroups, namespaces, fixed paths.
func (nc *nodeCluster) close() {
	closeMu.Lock()
	defer closeMu.Unlock()
	if keepEnv || nc.closed {
		return
	}
	nc.closed = true
	var wg sync.WaitGroup
	for _, n := range nc.nodes {
		if n.kubelet != nil {
			wg.Add(1)
			go func() { defer wg.Done(); n.kubelet.res.release() }()
		}
	}
	wg.Wait()
	var (
		shimMu      sync.Mutex
		shimSockets []string
	)
	for _, n := range nc.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := n.stopContainers()
			shimMu.Lock()
			shimSockets = append(shimSockets, s...)
			shimMu.Unlock()
		}()
	}
	wg.Wait()
	for _, n := range nc.nodes {
		if n.containerd != nil {
			n.containerd.res.release()
		}
		killShims(n.sock)
	}
	for _, p := range []*proc{nc.sched, nc.kcm, nc.apiserver, nc.etcd} {
		if p != nil {
			p.res.release()
		}
	}
	unmountUnder(nc.dir)
	for _, n := range nc.nodes {
		removeCgroups(n.cgroup)
	}
	if nc.tp != nil {
		nc.tp.destroy()
	}
	for _, s := range shimSockets {
		_ = os.Remove(strings.TrimPrefix(s, "unix://"))
	}
	if matches, _ := filepath.Glob("/var/lib/cni/results/" + cniNetwork() + "-*"); len(matches) > 0 {
		for _, m := range matches {
			_ = os.Remove(m)
		}
	}
	if links, _ := filepath.Glob("/var/log/containers/*.log"); len(links) > 0 {
		for _, l := range links {
			if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, nc.dir) {
				_ = os.Remove(l)
			}
		}
	}
	for k, v := range nc.sysctls {
		_ = os.WriteFile("/proc/sys/"+k, []byte(v), 0o644)
	}
	for _, p := range nc.createdPaths {
		_ = os.RemoveAll(p)
	}
	nc.nodes = nil
}

// removeContainers kills and deletes every task and container in the k8s.io namespace of the containerd
// at sock, the node named name.
func removeContainers(ctx context.Context, sock, name string) {
	ctr := func(args ...string) string {
		out, _ := harness.Run(ctx, "", append([]string{"ctr", "--address", sock, "-n", "k8s.io"}, args...)...)
		return out
	}
	for _, id := range strings.Fields(ctr("tasks", "ls", "-q")) {
		ctr("tasks", "kill", "-s", "SIGKILL", id)
	}
	_ = harness.Poll("the tasks of "+name+" to be deleted", 20*time.Second, 200*time.Millisecond, func() error {
		left := strings.Fields(ctr("tasks", "ls", "-q"))
		for _, id := range left {
			ctr("tasks", "delete", "-f", id)
		}
		if len(left) > 0 {
			return fmt.Errorf("%d left", len(left))
		}
		return nil
	})
	if ids := strings.Fields(ctr("containers", "ls", "-q")); len(ids) > 0 {
		ctr(append([]string{"containers", "rm"}, ids...)...)
	}
}

// stopContainers kills and deletes every task and container of the node's containerd, and returns the
// shim sockets they used (under /run/containerd/s, which cannot be configured).
func (n *node) stopContainers() []string {
	if n.containerd == nil || !n.containerd.Running() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var sockets []string
	addrs, _ := filepath.Glob(filepath.Join(n.dir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io", "*", "address"))
	for _, a := range addrs {
		if b, err := os.ReadFile(a); err == nil {
			sockets = append(sockets, strings.TrimSpace(string(b)))
		}
	}
	removeContainers(ctx, n.sock, n.name)
	return sockets
}

// killShims stops containerd-shim processes left for the containerd at sock, found by the -address in
// their command line.
func killShims(sock string) {
	if sock == "" {
		return
	}
	for _, pid := range pidsWithArgs("-address", sock) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// pidsWithArgs returns the processes whose command line has the argument flag followed by value.
func pidsWithArgs(flag, value string) []int {
	var pids []int
	for _, p := range harness.Processes() {
		for i := 0; i+1 < len(p.Args); i++ {
			if p.Args[i] == flag && p.Args[i+1] == value {
				pids = append(pids, p.Pid)
				break
			}
		}
	}
	return pids
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	for range 3 { // a mount can hide one below it that only shows once it is gone
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			return
		}
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		for _, m := range mps {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
}

func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 {
			mp := unescapeMount(f[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	return out
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// removeCgroups removes the cgroup tree root in every hierarchy, deepest first.
func removeCgroups(root string) {
	for _, m := range cgroupMounts() {
		top := filepath.Join(m, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = harness.Poll("rmdir "+dirs[i], 5*time.Second, 100*time.Millisecond, func() error {
				if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
					return err
				}
				return nil
			})
		}
	}
}

// containerdTOML is a test node's containerd configuration: CRI with runc on overlayfs, cgroupfs (no
// systemd), the locally built pause image, and CNI. Empty fields keep containerd's defaults.
type containerdTOML struct {
	root, state, address string // containerd's directories and socket (ttrpc beside it)
	opt                  string // where the opt plugin installs
	sandboxImage         string
	runcRoot             string
	cniConfDir           string
}

func (c containerdTOML) String() string {
	var b strings.Builder
	b.WriteString("version = 2\n")
	if c.root != "" {
		fmt.Fprintf(&b, "root = %q\nstate = %q\n", c.root, c.state)
	}
	b.WriteString(`disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]` + "\n")
	if c.address != "" {
		fmt.Fprintf(&b, "[grpc]\n  address = %q\n[ttrpc]\n  address = %q\n", c.address, c.address+".ttrpc")
	}
	fmt.Fprintf(&b, `[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, c.opt, c.sandboxImage)
	if c.runcRoot != "" {
		fmt.Fprintf(&b, "        Root = %q\n", c.runcRoot)
	}
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"/usr/lib/cni\"\n    conf_dir = %q\n", c.cniConfDir)
	return b.String()
}
