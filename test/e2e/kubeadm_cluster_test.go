//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/konnect-dev/konnect/hack/image/oci"
	"github.com/konnect-dev/konnect/test/harness"
)

// The kubeadm cluster: three control-plane nodes made by `kubeadm init` and `kubeadm join --control-plane`
// (stacked etcd), two workers made by `kubeadm join`, and haproxy in front of the kube-apiservers and the
// Konnectivity servers. Every node is a network namespace and a mount namespace of its own, so that kubeadm's
// fixed paths are the node's: /etc/kubernetes, /var/lib/kubelet, /var/lib/etcd, containerd's /run/containerd
// and /var/lib/containerd, the CNI configuration and state, and the pod logs are bind mounts of directories
// under the node's directory. containerd and kubelet run in both namespaces; the harness starts and stops
// kubelet where kubeadm asks systemd to (a systemctl in the node's mount namespace passes the request on).
//
//	               ┌ lb  198.18.4.1  haproxy :6443 → cp1-3:6443, :8132 → cp1-3:8132
//	switch (a      ├ cp1 198.18.4.11  pods 198.19.11.0/24
//	bridge in its  ├ cp2 198.18.4.12  pods 198.19.12.0/24
//	own namespace) ├ cp3 198.18.4.13  pods 198.19.13.0/24
//	               ├ w1  198.18.4.21  node IP 198.19.250.1 (lo), pods 198.19.1.0/24
//	               └ w2  198.18.4.22  node IP 198.19.250.2 (lo), pods 198.19.2.0/24
//
// No namespace has a route to a worker's node IP or pod subnet: kube-apiserver reaches the workers' kubelets and
// pods only through the tunnel. Pods leave their node masqueraded to its switch address.

const (
	kadmLB       = "198.18.4.1"
	kadmVersion  = "v1.36.1"
	kadmEtcdTag  = "3.6.8-0"
	kadmPauseTag = "3.10.2"
	kadmRegistry = "registry.k8s.io"
	// kadmNodeDev is each node's link to the switch.
	kadmNodeDev = "kn0"
)

type kadmNodeSpec struct {
	name    string
	addr    string // on the switch
	nodeIP  string // kubelet's --node-ip
	podCIDR string
	cp      bool
}

var kadmNodeSpecs = []kadmNodeSpec{
	{"cp1", "198.18.4.11", "198.18.4.11", "198.19.11.0/24", true},
	{"cp2", "198.18.4.12", "198.18.4.12", "198.19.12.0/24", true},
	{"cp3", "198.18.4.13", "198.18.4.13", "198.19.13.0/24", true},
	{"w1", "198.18.4.21", "198.19.250.1", "198.19.1.0/24", false},
	{"w2", "198.18.4.22", "198.19.250.2", "198.19.2.0/24", false},
}

// kadmHostPaths are the paths each node has of its own: bind mounts, in the node's mount namespace, of
// directories under the node's directory (the key is the directory's name there).
var kadmHostPaths = []struct{ dir, path string }{
	{"etc-kubernetes", "/etc/kubernetes"},
	{"var-lib-kubelet", "/var/lib/kubelet"},
	{"var-lib-etcd", "/var/lib/etcd"},
	{"var-log-pods", "/var/log/pods"},
	{"var-log-containers", "/var/log/containers"},
	{"var-lib-cni", "/var/lib/cni"},
	{"etc-cni", "/etc/cni/net.d"},
	{"run-containerd", "/run/containerd"},
	{"var-lib-containerd", "/var/lib/containerd"},
	{"etc-containerd", "/etc/containerd"},
}

type kadmNode struct {
	kadmNodeSpec
	ns     string // network namespace
	mnt    string // the mount namespace, kept by a bind mount of it
	dir    string
	cgroup string

	mu         sync.Mutex // guards kubelet and containerd
	containerd *proc
	kubelet    *proc
	systemctl  string // requests of the node's systemctl, one per line
	stopWatch  chan struct{}
	// kubeletStarted: kubelet was started once (without a systemctl, when kubeadm wrote its flags).
	kubeletStarted bool
	// kubeletWanted: started and not stopped since; kubeletExited is when a wanted kubelet was found exited.
	kubeletWanted bool
	kubeletExited time.Time
	watchDone     chan struct{}
}

type kadmCluster struct {
	*cluster // kubectl helpers (role cp is cp1, w1 and w2 the workers), konnect certs, pizza-webhook
	nodes    []*kadmNode
	lb       *proc
	lbConfig string
	lbSocket string // haproxy's runtime API
	binDir   string // kubeadm, kubelet, konnect and kubectl, first in PATH of every command run on a node
	mntDir   string // the mount namespaces' files

	konnectImage string
	images       map[string]string // image reference -> docker-archive tarball
	blocks       map[string]string // the README's commands (readmeBlocks)
	token        string            // bootstrap token of kubeadm init
	certKey      string            // --upload-certs encryption key
	noSystemctl  bool              // the host has no systemctl to stand in for
	sysctls      map[string]string
	createdPaths []string // mount points that did not exist on the host
	closed       bool
}

func (kc *kadmCluster) node(name string) *kadmNode {
	for _, n := range kc.nodes {
		if n.name == name {
			return n
		}
	}
	panic("unknown node " + name)
}

func (kc *kadmCluster) cps() []*kadmNode {
	var out []*kadmNode
	for _, n := range kc.nodes {
		if n.cp {
			out = append(out, n)
		}
	}
	return out
}

func (kc *kadmCluster) where() string {
	return fmt.Sprintf("namespaces %s-*, files %s", kc.tp.prefix, kc.dir)
}

func (kc *kadmCluster) healthy() error {
	if kc.lb == nil {
		return fmt.Errorf("not started")
	}
	if err := kc.lb.Exited(); err != nil {
		return err
	}
	for _, n := range kc.nodes {
		n.mu.Lock()
		c, k := n.containerd, n.kubelet
		n.mu.Unlock()
		for _, p := range []*proc{c, k} {
			if p == nil {
				return fmt.Errorf("%s: not running", n.name)
			}
			if err := p.Exited(); err != nil {
				return err
			}
		}
	}
	return nil
}

// sharedKubeadmCluster returns the running kubeadm cluster, starting it (and stopping any other cluster) first.
func sharedKubeadmCluster(t *testing.T) *kadmCluster {
	t.Helper()
	return shared(t, "kubeadm", "kubeadm cluster", func(name string) (*kadmCluster, error) { return newKadmCluster(t.Logf, name) })
}

// newKadmCluster makes the namespaces, the nodes' mount namespaces, containerd on every node and the load
// balancer; kubeadm is the test's to run (the README's blocks).
func newKadmCluster(logf func(string, ...any), name string) (*kadmCluster, error) {
	c := &cluster{mode: modeGRPCUDS}
	kc := &kadmCluster{cluster: c, sysctls: map[string]string{}, images: map[string]string{}}
	if err := c.makeDirs(name); err != nil {
		return nil, err
	}
	trackEarly("kubeadm cluster "+c.dir, kc.close)
	var err error
	if kc.blocks, err = readmeBlocks(); err != nil {
		return kc, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	step := time.Now()
	imgErr := make(chan error, 1)
	go func() { imgErr <- kc.buildImages(ctx) }()

	if err := kc.network(name); err != nil {
		return kc, fmt.Errorf("network: %w", err)
	}
	if err := kc.binaries(); err != nil {
		return kc, err
	}
	kc.saveHostState()
	if err := kc.mountNamespaces(); err != nil {
		return kc, fmt.Errorf("mount namespaces: %w", err)
	}
	if err := kc.startLB(); err != nil {
		return kc, err
	}
	if err := <-imgErr; err != nil {
		return kc, fmt.Errorf("images: %w", err)
	}
	logf("images built, namespaces and load balancer up in %v", time.Since(step).Round(100*time.Millisecond))

	step = time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(kc.nodes))
	for i, n := range kc.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = kc.prepareNode(ctx, n)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return kc, err
	}
	logf("containerd running and images imported on %d nodes in %v", len(kc.nodes), time.Since(step).Round(100*time.Millisecond))
	return kc, nil
}

// network creates the switch, the load balancer's and the nodes' namespaces.
func (kc *kadmCluster) network(name string) error {
	tp := &topology{prefix: runID + "-" + name, names: map[string]string{}}
	kc.tp = tp
	roles := []string{"sw", "lb"}
	for _, s := range kadmNodeSpecs {
		roles = append(roles, s.name)
	}
	var names []string
	for _, r := range roles {
		tp.names[r] = tp.prefix + "-" + r
		names = append(names, tp.names[r])
	}
	// The shared helpers know the roles cp, w1 and w2: cp is the first control-plane node.
	tp.names[nsCP] = tp.names["cp1"]
	track("netns "+tp.prefix+"-*", func() { harness.DeleteNetns(names...) })
	sw := tp.ns("sw")
	extra := [][]string{
		{"-n", sw, "link", "add", "br0", "type", "bridge"},
		{"-n", sw, "link", "set", "br0", "up"},
	}
	attach := func(role, addr string) {
		port := "p-" + role
		extra = append(extra,
			[]string{"link", "add", kadmNodeDev, "netns", tp.ns(role), "type", "veth", "peer", "name", port, "netns", sw},
			[]string{"-n", sw, "link", "set", port, "master", "br0"},
			[]string{"-n", sw, "link", "set", port, "up"},
			[]string{"-n", tp.ns(role), "addr", "add", addr + "/24", "dev", kadmNodeDev},
			[]string{"-n", tp.ns(role), "link", "set", kadmNodeDev, "up"})
	}
	attach("lb", kadmLB)
	for _, s := range kadmNodeSpecs {
		attach(s.name, s.addr)
		if s.nodeIP != s.addr {
			extra = append(extra, []string{"-n", tp.ns(s.name), "addr", "add", s.nodeIP + "/32", "dev", "lo"})
		}
	}
	if err := harness.CreateNetns(names, nil, extra...); err != nil {
		return err
	}
	for _, s := range kadmNodeSpecs {
		ns := tp.ns(s.name)
		// kubeadm's preflight wants forwarding on; the pods leave masqueraded, as TestNodes' workers.
		for _, argv := range [][]string{
			{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
			{"iptables", "-t", "nat", "-A", "POSTROUTING", "-s", s.podCIDR, "!", "-d", s.podCIDR, "-j", "MASQUERADE"},
		} {
			if out, err := harness.Run(context.Background(), ns, argv...); err != nil {
				return fmt.Errorf("%w %s", err, out)
			}
		}
		kc.nodes = append(kc.nodes, &kadmNode{kadmNodeSpec: s, ns: ns, dir: filepath.Join(kc.dir, "node-"+s.name), cgroup: "/" + tp.prefix + "-" + s.name})
	}
	return nil
}

// binaries puts the programs the README's commands name into one directory, first in their PATH.
func (kc *kadmCluster) binaries() error {
	kc.binDir = filepath.Join(kc.dir, "bin")
	if err := os.MkdirAll(kc.binDir, 0o755); err != nil {
		return err
	}
	tools := filepath.Dir(bins.kubeAPIServer)
	for name, src := range map[string]string{
		"kubeadm": filepath.Join(tools, "kubeadm"),
		"kubelet": filepath.Join(tools, "kubelet"),
		"konnect": bins.konnect,
		"kubectl": bins.kubectl,
	} {
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("%s: %w (run test/e2e/tools/build.sh)", name, err)
		}
		if err := os.Symlink(src, filepath.Join(kc.binDir, name)); err != nil {
			return err
		}
	}
	return nil
}

// saveHostState records what kubelet changes on the host (sysctls) and the mount points this run creates.
func (kc *kadmCluster) saveHostState() {
	for _, k := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			kc.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
}

// mountNamespaces makes one mount namespace per node, with the node's own directories bind-mounted over
// kubeadm's, containerd's and kubelet's fixed paths, an empty resolv.conf (nothing is ever looked up), and a
// systemctl that hands kubelet's start and stop to the harness.
func (kc *kadmCluster) mountNamespaces() error {
	for _, hp := range kadmHostPaths {
		if _, err := os.Stat(hp.path); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(hp.path, 0o755); err != nil {
				return err
			}
			kc.createdPaths = append(kc.createdPaths, hp.path)
		}
	}
	// unshare --mount=FILE needs FILE on a mount that does not propagate.
	kc.mntDir = filepath.Join(kc.dir, "mnt")
	if err := os.MkdirAll(kc.mntDir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(kc.mntDir, kc.mntDir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", kc.mntDir, err)
	}
	if err := unix.Mount("", kc.mntDir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", kc.mntDir, err)
	}
	for _, n := range kc.nodes {
		for _, hp := range kadmHostPaths {
			if err := os.MkdirAll(filepath.Join(n.dir, hp.dir), 0o755); err != nil {
				return err
			}
		}
		// logs; and kubelet's static pod directory, which the kubelet package makes on a node (kubelet on a
		// worker would complain every second without it).
		for _, d := range []string{"logs", filepath.Join("etc-kubernetes", "manifests")} {
			if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
				return err
			}
		}
		resolv := filepath.Join(n.dir, "resolv.conf")
		if err := os.WriteFile(resolv, nil, 0o644); err != nil {
			return err
		}
		n.systemctl = filepath.Join(n.dir, "systemctl.requests")
		for _, f := range []string{n.systemctl, n.systemctl + ".done"} {
			if err := os.WriteFile(f, nil, 0o644); err != nil {
				return err
			}
		}
		shim := filepath.Join(n.dir, "systemctl")
		if err := os.WriteFile(shim, []byte(fmt.Sprintf(`#!/bin/sh
# The systemctl of test node %[1]s: the harness is its init system. kubeadm's requests to start, restart or
# stop kubelet are written down for the harness, which carries them out.
# Like systemctl, it returns once the request is carried out (the harness acknowledges each line).
echo "$*" >> %[2]s
n=$(wc -l < %[2]s)
i=0
while [ "$(wc -l < %[3]s)" -lt "$n" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
case "$*" in
"status kubelet") echo "Loaded: loaded (e2e harness)" ;;
"is-enabled kubelet") echo enabled ;;
*kubelet | daemon-reload) ;;
# No other service runs here (kubeadm asks about firewalld and systemd-resolved).
status*) echo "Loaded: not-found"; exit 4 ;;
*) exit 3 ;;
esac
exit 0
`, n.name, n.systemctl, n.systemctl+".done")), 0o755); err != nil {
			return err
		}
		n.mnt = filepath.Join(kc.mntDir, n.name)
		if err := os.WriteFile(n.mnt, nil, 0o644); err != nil {
			return err
		}
		script := []string{"set -e"}
		for _, hp := range kadmHostPaths {
			script = append(script, fmt.Sprintf("mount --bind %s %s", filepath.Join(n.dir, hp.dir), hp.path))
		}
		script = append(script, "mount --bind "+resolv+" /etc/resolv.conf")
		if _, err := os.Stat("/usr/bin/systemctl"); err == nil {
			script = append(script, "mount --bind "+shim+" /usr/bin/systemctl")
		} else {
			// Without a systemctl kubeadm says "no supported init system" and asks nobody; the harness then
			// starts kubelet once kubeadm has written its flags (see systemd).
			kc.noSystemctl = true
		}
		cmd := exec.Command("unshare", "--mount="+n.mnt, "--propagation", "private", "sh", "-c", strings.Join(script, "\n"))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("node %s: mount namespace: %w: %s", n.name, err, out)
		}
	}
	return nil
}

// via is the command prefix that runs a program on node n: in its mount and network namespaces.
func (n *kadmNode) via() []string {
	return []string{"nsenter", "--mount=" + n.mnt, "--net=" + filepath.Join("/run/netns", n.ns), "--"}
}

// sock is the node's containerd socket as the host sees it.
func (n *kadmNode) sock() string { return filepath.Join(n.dir, "run-containerd", "containerd.sock") }

func (kc *kadmCluster) startLB() error {
	var b strings.Builder
	kc.lbSocket = filepath.Join(kc.dir, "haproxy.sock")
	// A connection that cannot reach its server is tried on another (retries, redispatch), as load balancers in
	// front of kube-apiservers are set up; the runtime socket takes a server out of rotation for maintenance.
	fmt.Fprintf(&b, `global
  maxconn 4000
  stats socket %[2]s mode 600 level admin
defaults
  mode tcp
  retries 3
  option redispatch
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  timeout tunnel 24h
frontend kube-apiserver
  bind %[1]s:6443
  default_backend kube-apiserver
backend kube-apiserver
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 1s fall 2 rise 2 check check-ssl verify none
`, kadmLB, kc.lbSocket)
	for _, n := range kc.cpSpecs() {
		fmt.Fprintf(&b, "  server %s %s:6443\n", n.name, n.addr)
	}
	fmt.Fprintf(&b, `frontend konnectivity-agents
  bind %s:8132
  default_backend konnectivity-servers
backend konnectivity-servers
  default-server inter 1s fall 2 rise 2 check
`, kadmLB)
	for _, n := range kc.cpSpecs() {
		fmt.Fprintf(&b, "  server %s %s:8132\n", n.name, n.addr)
	}
	kc.lbConfig = filepath.Join(kc.dir, "haproxy.cfg")
	if err := os.WriteFile(kc.lbConfig, []byte(b.String()), 0o644); err != nil {
		return err
	}
	p, err := startProc("haproxy", kc.tp.ns("lb"), kc.logDir, "/usr/sbin/haproxy", "-db", "-f", kc.lbConfig)
	if err != nil {
		return err
	}
	kc.lb = p
	return harness.Poll("haproxy listening", 30*time.Second, 200*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := harness.DialIn(ctx, kc.tp.ns("lb"), kadmLB+":6443")
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// lbSet sets the state of node's kube-apiserver in the load balancer: "drain" takes it out of rotation (no new
// connections), "ready" puts it back.
func (kc *kadmCluster) lbSet(node, state string) error {
	conn, err := net.Dial("unix", kc.lbSocket)
	if err != nil {
		return fmt.Errorf("haproxy runtime API: %w", err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "set server kube-apiserver/%s state %s\n", node, state); err != nil {
		return err
	}
	out, _ := io.ReadAll(conn)
	if msg := strings.TrimSpace(string(out)); msg != "" {
		return fmt.Errorf("haproxy: set server kube-apiserver/%s state %s: %s", node, state, msg)
	}
	return nil
}

func (kc *kadmCluster) cpSpecs() []kadmNodeSpec {
	var out []kadmNodeSpec
	for _, s := range kadmNodeSpecs {
		if s.cp {
			out = append(out, s)
		}
	}
	return out
}

// kadmImage names the control-plane images as kubeadm does.
func kadmImage(name, tag string) string { return kadmRegistry + "/" + name + ":" + tag }

// buildImages builds the control-plane images under the names kubeadm looks for, with the pause, konnect,
// sample-apiserver and pizza-webhook images of the node cluster.
func (kc *kadmCluster) buildImages(ctx context.Context) error {
	nc := &nodeCluster{cluster: kc.cluster}
	if err := nc.buildImages(ctx); err != nil {
		return err
	}
	kc.konnectImage = nc.konnectImage
	kc.images[kc.konnectImage] = imagesOnce.konnect
	for _, ref := range []string{imgSample, imgPizza, imgBusybox} {
		kc.images[ref] = imageTarball(ref)
	}
	tools := filepath.Dir(bins.kubeAPIServer)
	type img struct{ ref, bin string }
	list := []img{
		{kadmImage("kube-apiserver", kadmVersion), filepath.Join(tools, "kube-apiserver")},
		{kadmImage("kube-controller-manager", kadmVersion), filepath.Join(tools, "kube-controller-manager")},
		{kadmImage("kube-scheduler", kadmVersion), filepath.Join(tools, "kube-scheduler")},
		{kadmImage("etcd", kadmEtcdTag), filepath.Join(tools, "etcd")},
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(list)+1)
	for _, im := range list {
		kc.images[im.ref] = imageTarball(im.ref)
		if _, err := os.Stat(imageTarball(im.ref)); err == nil {
			continue // built by an earlier kubeadm cluster of this run
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// kubeadm's static pods run the program by name: it must be on the image's PATH.
			base := filepath.Base(im.bin)
			image, err := oci.Build(oci.Spec{Files: []oci.File{{Src: im.bin, Dst: "/usr/local/bin/" + base, Mode: 0o755}}, Env: []string{"PATH=/usr/local/bin"}, Entrypoint: []string{"/usr/local/bin/" + base}})
			if err == nil {
				_, err = oci.WriteTarball(imageTarball(im.ref), im.ref, image)
			}
			if err != nil {
				errs <- fmt.Errorf("image %s: %w", im.ref, err)
			}
		}()
	}
	pause := kadmImage("pause", kadmPauseTag)
	kc.images[pause] = imageTarball(pause)
	if _, err := os.Stat(imageTarball(pause)); err != nil {
		image, err := oci.Build(oci.Spec{Files: []oci.File{{Src: filepath.Join(imagesDir(), "pause"), Dst: "/pause", Mode: 0o755}}, Entrypoint: []string{"/pause"}})
		if err == nil {
			_, err = oci.WriteTarball(imageTarball(pause), pause, image)
		}
		if err != nil {
			errs <- err
		}
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// prepareNode starts containerd on n, imports the images n runs, and starts the harness's "systemd", which
// starts kubelet when kubeadm asks for it.
func (kc *kadmCluster) prepareNode(ctx context.Context, n *kadmNode) error {
	if err := createCgroupRoot(n.cgroup); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(n.dir, "containerd-opt"), 0o755); err != nil {
		return err
	}
	toml := containerdTOML{opt: filepath.Join(n.dir, "containerd-opt"), sandboxImage: kadmImage("pause", kadmPauseTag), cniConfDir: "/etc/cni/net.d"}
	if err := os.WriteFile(filepath.Join(n.dir, "etc-containerd", "config.toml"), []byte(toml.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.dir, "etc-cni", "10-kn.conflist"), []byte(fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [{
    "type": "bridge", "bridge": "kn-br0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "198.18.0.0/15"}]}
  }]
}
`, cniNetwork(), n.podCIDR)), 0o644); err != nil {
		return err
	}
	if err := kc.startContainerd(ctx, n); err != nil {
		return err
	}
	var refs []string
	if n.cp {
		refs = []string{kadmImage("kube-apiserver", kadmVersion), kadmImage("kube-controller-manager", kadmVersion),
			kadmImage("kube-scheduler", kadmVersion), kadmImage("etcd", kadmEtcdTag)}
	} else {
		refs = []string{imgSample, imgPizza, imgBusybox}
	}
	refs = append(refs, kadmImage("pause", kadmPauseTag), kc.konnectImage)
	for _, ref := range refs {
		if out, err := harness.Run(ctx, "", "ctr", "--address", n.sock(), "-n", "k8s.io", "images", "import", kc.images[ref]); err != nil {
			return fmt.Errorf("node %s: import %s: %w\n%s", n.name, ref, err, out)
		}
	}
	n.stopWatch, n.watchDone = make(chan struct{}), make(chan struct{})
	go kc.systemd(n)
	return nil
}

func (kc *kadmCluster) startContainerd(ctx context.Context, n *kadmNode) error {
	p, err := startProcVia(n.via(), "containerd-"+n.name, n.ns, kc.logDir, "containerd")
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.containerd = p
	n.mu.Unlock()
	return harness.Poll("containerd on "+n.name, time.Minute, 200*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		_, err := harness.Run(ctx, "", "ctr", "--address", n.sock(), "version")
		return err
	})
}

// kubeletCommand is what kubeadm's systemd drop-in (10-kubeadm.conf) runs: kubelet with the flags kubeadm
// wrote to /var/lib/kubelet/kubeadm-flags.env, and its configuration /var/lib/kubelet/config.yaml.
func kubeletCommand(kubelet string) string {
	return `. /var/lib/kubelet/kubeadm-flags.env; exec ` + kubelet + ` --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf ` +
		`--kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml $KUBELET_KUBEADM_ARGS`
}

// startKubelet starts kubelet as kubeadm's systemd unit would.
func (kc *kadmCluster) startKubelet(n *kadmNode) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet != nil && n.kubelet.Running() {
		return nil
	}
	p, err := startProcVia(n.via(), "kubelet-"+n.name, n.ns, kc.logDir, "sh", "-c", kubeletCommand(filepath.Join(kc.binDir, "kubelet")))
	if err != nil {
		return err
	}
	n.kubelet, n.kubeletWanted, n.kubeletExited = p, true, time.Time{}
	return nil
}

func (n *kadmNode) stopKubelet() {
	n.mu.Lock()
	p := n.kubelet
	n.kubeletWanted = false
	n.mu.Unlock()
	if p != nil {
		p.res.release()
	}
}

// systemd carries out the node's systemctl requests about kubelet, in order, until the node is torn down.
func (kc *kadmCluster) systemd(n *kadmNode) {
	defer close(n.watchDone)
	done := 0
	for {
		select {
		case <-n.stopWatch:
			return
		case <-time.After(200 * time.Millisecond):
		}
		kc.restartExited(n)
		if kc.noSystemctl {
			if _, err := os.Stat(filepath.Join(n.dir, "var-lib-kubelet", "kubeadm-flags.env")); err == nil && !n.kubeletStarted {
				n.kubeletStarted = true
				if err := kc.startKubelet(n); err != nil {
					fmt.Fprintf(os.Stderr, "e2e: node %s: start kubelet: %v\n", n.name, err)
				}
			}
			continue
		}
		b, err := os.ReadFile(n.systemctl)
		if err != nil {
			continue
		}
		lines := strings.Split(string(b), "\n")
		for ; done < len(lines)-1; done++ {
			f := strings.Fields(lines[done])
			if len(f) >= 2 && f[len(f)-1] == "kubelet" {
				switch f[0] {
				case "stop":
					n.stopKubelet()
				case "restart":
					n.stopKubelet()
					fallthrough
				case "start":
					if err := kc.startKubelet(n); err != nil {
						fmt.Fprintf(os.Stderr, "e2e: node %s: start kubelet: %v\n", n.name, err)
					}
				}
			}
			if f, err := os.OpenFile(n.systemctl+".done", os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
				_, _ = f.WriteString("done\n")
				_ = f.Close()
			}
		}
	}
}

// restartExited restarts a kubelet that exited on its own 10 s later, as kubeadm's unit does (Restart=always,
// RestartSec=10).
func (kc *kadmCluster) restartExited(n *kadmNode) {
	n.mu.Lock()
	p, wanted := n.kubelet, n.kubeletWanted
	if !wanted || p == nil || p.Running() {
		n.mu.Unlock()
		return
	}
	if n.kubeletExited.IsZero() {
		n.kubeletExited = time.Now()
	}
	due := time.Since(n.kubeletExited) >= 10*time.Second
	n.mu.Unlock()
	if due {
		fmt.Fprintf(os.Stderr, "e2e: node %s: kubelet exited (%v); restarting it\n", n.name, p.Err())
		if err := kc.startKubelet(n); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: node %s: start kubelet: %v\n", n.name, err)
		}
	}
}

// readmeBlocks returns the shell blocks of the README's kubeadm section, by the step named in the HTML
// comment that precedes each, `<!-- needs: a kubeadm cluster (step NAME), covered by TestKubeadm -->`, the
// marker by which TestREADME leaves them to this test.
func readmeBlocks() (map[string]string, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	blocks := map[string]string{}
	mark := regexp.MustCompile(`^<!-- needs: a kubeadm cluster \(step ([a-z0-9-]+)\), covered by TestKubeadm -->$`)
	sc := bufio.NewScanner(f)
	name, in := "", false
	var body []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && mark.MatchString(line):
			name = mark.FindStringSubmatch(line)[1]
		case !in && name != "" && line == "```sh":
			in, body = true, nil
		case in && line == "```":
			blocks[name] = strings.Join(body, "\n") + "\n"
			in, name = false, ""
		case in:
			body = append(body, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, want := range kadmBlocks {
		if blocks[want] == "" {
			return nil, fmt.Errorf("README.md has no block marked (step %s) followed by a ```sh block", want)
		}
	}
	return blocks, nil
}

// The README's blocks, in the order the test runs them.
var kadmBlocks = []string{"first-control-plane", "konnect-first", "agents", "more-control-planes", "workers", "upgrade-first", "upgrade-others", "remove-agents", "remove"}

// run runs the README's block name on node n as root would, from the node's directory (where the harness put
// kubeadm's configuration files), with env set, and returns its output (also in the node's logs).
func (kc *kadmCluster) run(ctx context.Context, n *kadmNode, block string, env ...string) (string, error) {
	script, ok := kc.blocks[block]
	if !ok {
		return "", fmt.Errorf("no README block %s", block)
	}
	logPath := filepath.Join(n.dir, "logs", block+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	defer lf.Close()
	argv := append(n.via(), "sh", "-euxc", "cd "+n.dir+"\n"+script)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out strings.Builder
	w := &teeWriter{a: lf, b: &out}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.Env = append(os.Environ(), append([]string{"PATH=" + kc.binDir + ":/usr/sbin:/usr/bin:/sbin:/bin", "LB=" + kadmLB, "NODE_IP=" + n.nodeIP}, env...)...)
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("README block %s on %s: %w\n%s", block, n.name, err, tailString(out.String(), 6000))
	}
	return out.String(), nil
}

type teeWriter struct {
	mu   sync.Mutex
	a, b interface{ Write([]byte) (int, error) }
}

func (w *teeWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.a.Write(p)
	return w.b.Write(p)
}

// kubeadmPreflightIgnored are the preflight checks that fail on these nodes for reasons of the test machine, each
// for one reason:
//   - SystemVerification: the host's cgroups are v1, which kubeadm's system validators refuse; kubelet is told
//     to accept them (failCgroupV1: false).
var kubeadmPreflightIgnored = []string{"SystemVerification"}

// kubeletConfiguration is the KubeletConfiguration of the cluster (TOPOLOGY.md's must-haves); kubeadm hands it to
// every node.
const kubeletConfiguration = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
fileCheckFrequency: 2s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
resolvConf: ""
makeIPTablesUtilChains: false
serializeImagePulls: false
`

// nodeRegistration is the node-specific part of kubeadm's configuration.
func (kc *kadmCluster) nodeRegistration(n *kadmNode) string {
	return fmt.Sprintf(`nodeRegistration:
  name: %s
  imagePullPolicy: Never
  ignorePreflightErrors: [%s]
  kubeletExtraArgs:
  - {name: node-ip, value: %s}
  - {name: cgroup-root, value: %s}
`, n.name, strings.Join(kubeadmPreflightIgnored, ", "), n.nodeIP, n.cgroup)
}

// writeInitConfig writes kubeadm-config.yaml for kubeadm init on the first control-plane node.
func (kc *kadmCluster) writeInitConfig(n *kadmNode) error {
	kc.token = randHex(3) + "." + randHex(8)
	kc.certKey = randHex(32)
	cfg := fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: %[1]s
  ttl: 2h
certificateKey: %[2]s
localAPIEndpoint:
  advertiseAddress: %[3]s
  bindPort: 6443
%[4]s---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: %[5]s
controlPlaneEndpoint: %[6]s:6443
networking:
  serviceSubnet: %[7]s
# Neither add-on runs: pods get addresses, not names, and kube-apiserver dials endpoints itself.
proxy:
  disabled: true
dns:
  disabled: true
etcd:
  local:
    extraArgs:
    # Fewer fsyncs on a machine shared by three etcd members: the data lives only as long as the test.
    - {name: unsafe-no-fsync, value: "true"}
---
%[8]s`, kc.token, kc.certKey, n.addr, kc.nodeRegistration(n), kadmVersion, kadmLB, serviceNet, kubeletConfiguration)
	return os.WriteFile(filepath.Join(n.dir, "kubeadm-config.yaml"), []byte(cfg), 0o600)
}

// writeJoinConfig writes kubeadm-join.yaml for kubeadm join on n, from what kubeadm init made on the first
// node: the bootstrap token, the CA's public key hash and the certificate key.
func (kc *kadmCluster) writeJoinConfig(n *kadmNode) error {
	hash, err := caCertHash(filepath.Join(kc.nodes[0].dir, "etc-kubernetes", "pki", "ca.crt"))
	if err != nil {
		return err
	}
	cp := ""
	if n.cp {
		cp = fmt.Sprintf("controlPlane:\n  certificateKey: %s\n  localAPIEndpoint:\n    advertiseAddress: %s\n    bindPort: 6443\n", kc.certKey, n.addr)
	}
	cfg := fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: %s:6443
    token: %s
    caCertHashes: [%s]
%s%s`, kadmLB, kc.token, hash, cp, kc.nodeRegistration(n))
	return os.WriteFile(filepath.Join(n.dir, "kubeadm-join.yaml"), []byte(cfg), 0o600)
}

// writeUpgradeConfig writes kubeadm-upgrade.yaml for kubeadm upgrade apply and kubeadm upgrade node on n.
func (kc *kadmCluster) writeUpgradeConfig(n *kadmNode) error {
	ignore := strings.Join(kubeadmPreflightIgnored, ", ")
	// kubeadm upgrade apply checks a CoreDNS migration even with the add-on disabled, and fails on the version
	// of the CoreDNS that does not run ("start version '' not supported"); there is nothing to migrate. etcd and
	// the certificates are left as they are: kube-apiserver's manifest is what the test is about, and each etcd
	// restart costs the three-member cluster a minute here.
	cfg := fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: UpgradeConfiguration
apply:
  kubernetesVersion: %[1]s
  imagePullPolicy: Never
  etcdUpgrade: false
  certificateRenewal: false
  ignorePreflightErrors: [%[2]s, CoreDNSUnsupportedPlugins, CoreDNSMigration]
node:
  imagePullPolicy: Never
  etcdUpgrade: false
  certificateRenewal: false
  ignorePreflightErrors: [%[2]s]
`, kadmVersion, ignore)
	return os.WriteFile(filepath.Join(n.dir, "kubeadm-upgrade.yaml"), []byte(cfg), 0o600)
}

// caCertHash is kubeadm's --discovery-token-ca-cert-hash of the CA certificate at path.
func caCertHash(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("%s: no PEM block", path)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// stopNode stops everything of n and cuts its link: kubelet, every container, containerd.
func (kc *kadmCluster) stopNode(n *kadmNode) {
	n.stopKubelet()
	kc.stopContainers(n)
	n.mu.Lock()
	c := n.containerd
	n.mu.Unlock()
	if c != nil {
		c.res.release()
	}
	killInMountNS(n.mnt)
}

// startNode brings a stopped node back: containerd, then kubelet (its static pods follow).
func (kc *kadmCluster) startNode(ctx context.Context, n *kadmNode) error {
	if err := kc.startContainerd(ctx, n); err != nil {
		return err
	}
	return kc.startKubelet(n)
}

// stopContainers kills and deletes every task and container of n's containerd.
func (kc *kadmCluster) stopContainers(n *kadmNode) {
	n.mu.Lock()
	c := n.containerd
	n.mu.Unlock()
	if c == nil || !c.Running() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	removeContainers(ctx, n.sock(), n.name)
}

// killInMountNS kills every process in the mount namespace kept at file (the shims, after containerd).
func killInMountNS(file string) {
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var ps unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid), &ps) == nil && ps.Ino == st.Ino && ps.Dev == st.Dev {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// close tears the cluster down: kubelets, containers, containerd and what else runs in the nodes' mount
// namespaces, the load balancer, the mount namespaces, cgroups, network namespaces, created mount points.
func (kc *kadmCluster) close() {
	closeMu.Lock()
	defer closeMu.Unlock()
	if keepEnv || kc.closed {
		return
	}
	kc.closed = true
	for _, n := range kc.nodes {
		if n.stopWatch != nil {
			close(n.stopWatch)
			<-n.watchDone
		}
	}
	var wg sync.WaitGroup
	for _, n := range kc.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.stopKubelet() }()
	}
	wg.Wait()
	for _, n := range kc.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); kc.stopContainers(n) }()
	}
	wg.Wait()
	for _, n := range kc.nodes {
		n.mu.Lock()
		c := n.containerd
		n.mu.Unlock()
		if c != nil {
			c.res.release()
		}
		if n.mnt != "" {
			killInMountNS(n.mnt)
		}
	}
	if kc.lb != nil {
		kc.lb.res.release()
	}
	time.Sleep(200 * time.Millisecond) // the killed processes leave their namespaces
	unmountUnder(kc.dir)
	for _, n := range kc.nodes {
		removeCgroups(n.cgroup)
	}
	if kc.tp != nil {
		kc.tp.destroy()
	}
	for k, v := range kc.sysctls {
		_ = os.WriteFile("/proc/sys/"+k, []byte(v), 0o644)
	}
	for _, p := range kc.createdPaths {
		_ = os.Remove(p)
	}
	kc.nodes = nil
}
