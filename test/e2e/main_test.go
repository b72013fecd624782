//go:build e2e

package e2e

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// Environment variables understood by the tests.
const (
	// envKeep keeps namespaces, processes and files after the run for debugging.
	envKeep = "KONNECT_E2E_KEEP"
	// envBin points at a directory holding kube-apiserver, sample-apiserver,
	// proxy-server and proxy-agent; without it tools/build.sh is run (a cache hit
	// when nothing changed).
	envBin = "KONNECT_E2E_BIN"
	// harness.EnvKonnect (KONNECT_BIN) points at a konnect binary; without it one is built.
)

// tools holds the paths of every program the tests run.
type tools struct {
	kubeAPIServer, sampleAPIServer string
	proxyServer, proxyAgent        string // upstream apiserver-network-proxy v0.36.0
	pizzaWebhook                   string // tools/pizza-webhook
	konnect                        string
	etcd, kubectl                  string
	curl                           string
}

var (
	bins    tools
	keepEnv = os.Getenv(envKeep) == "1"
	// workRoot holds every file of this run; short, because unix socket paths
	// are limited to 108 bytes.
	workRoot string
	// runID makes names unique per run: it carries our pid so that a later run
	// can tell a stale namespace from a live one.
	runID string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if err := checkHost(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: %v\n", err)
		return 1
	}
	sweepStale()
	runID = fmt.Sprintf("kn%d-%s", os.Getpid(), randHex(2))
	var err error
	if workRoot, err = os.MkdirTemp("", "kn-e2e-"+runID+"-"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: work dir: %v\n", err)
		return 1
	}
	// Cleanup must run whatever happens: on return, on SIGINT/SIGTERM, and
	// before go test's own -timeout panics (which would skip every deferred call).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "e2e: %v: cleaning up\n", s)
		teardownAll()
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > 0 {
			margin := min(d/10, time.Minute)
			time.AfterFunc(d-margin, func() {
				fmt.Fprintf(os.Stderr, "e2e: about to hit -timeout %v: dumping logs and cleaning up\n", d)
				dumpAllLogs(os.Stderr)
				teardownAll()
				os.Exit(3)
			})
		}
	}
	defer teardownAll()
	if err := findTools(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: %v\n", err)
		return 1
	}
	isolateEnv()
	return m.Run()
}

// isolateEnv keeps the programs the tests start (they inherit this environment) to the run's own
// addresses and files. A proxy from the environment (HTTPS_PROXY for kubectl and client-go, http_proxy
// for curl) would send requests to an address outside the namespaces, and kubectl's discovery cache would
// outlive the run in ~/.kube/cache. It runs after findTools, whose builds may need the proxy.
func isolateEnv() {
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"} {
		_ = os.Unsetenv(v)
	}
	_ = os.Setenv("KUBECACHEDIR", filepath.Join(workRoot, "kube-cache"))
}

// checkHost fails, never skips, when the machine cannot run the tests.
func checkHost() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the end-to-end tests need root (network namespaces, veth pairs); run them as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("the end-to-end tests need 'ip' from iproute2 (run test/e2e/tools/build.sh): %w", err)
	}
	probe := fmt.Sprintf("knprobe%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		return fmt.Errorf("the end-to-end tests need 'ip netns add' to work: %v: %s", err, bytes.TrimSpace(out))
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
	return nil
}

func findTools() error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	binDir := os.Getenv(envBin)
	if binDir == "" {
		script := filepath.Join(root, "test", "e2e", "tools", "build.sh")
		cmd := exec.Command("bash", script)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%s failed: %w", script, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		binDir = lines[len(lines)-1]
	}
	bins.kubeAPIServer = filepath.Join(binDir, "kube-apiserver")
	bins.sampleAPIServer = filepath.Join(binDir, "sample-apiserver")
	bins.proxyServer = filepath.Join(binDir, "proxy-server")
	bins.proxyAgent = filepath.Join(binDir, "proxy-agent")
	bins.pizzaWebhook = filepath.Join(binDir, "pizza-webhook")
	for _, p := range []string{bins.kubeAPIServer, bins.sampleAPIServer, bins.proxyServer, bins.proxyAgent, bins.pizzaWebhook} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("tool missing (run test/e2e/tools/build.sh or set %s): %w", envBin, err)
		}
	}

	if bins.konnect, err = harness.KonnectBinary(workRoot); err != nil {
		return err
	}

	for _, lp := range []struct {
		dst  *string
		name string
	}{
		{&bins.etcd, "etcd"}, {&bins.kubectl, "kubectl"}, {&bins.curl, "curl"},
	} {
		p, err := exec.LookPath(lp.name)
		if err != nil {
			for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
				if _, serr := os.Stat(filepath.Join(dir, lp.name)); serr == nil {
					p, err = filepath.Join(dir, lp.name), nil
					break
				}
			}
		}
		if err != nil {
			return fmt.Errorf("%s is not installed (test/e2e/tools/build.sh installs it): %w", lp.name, err)
		}
		*lp.dst = p
	}
	return nil
}

// Resources (namespaces, processes, files) register an idempotent release
// function here, so that a signal or a timeout can release whatever is left.
var (
	resMu     sync.Mutex
	resources []*resource
)

type resource struct {
	name string
	once sync.Once
	fn   func()
}

func (r *resource) release() { r.once.Do(r.fn) }

// track registers fn and returns the resource; callers release it in
// t.Cleanup or at teardown. With KONNECT_E2E_KEEP=1 nothing is released.
func track(name string, fn func()) *resource {
	r := &resource{name: name, fn: fn}
	resMu.Lock()
	resources = append(resources, r)
	resMu.Unlock()
	return r
}

// earlyResources are released before every resource of track: a cluster whose teardown order matters
// (the node cluster: containers, then containerd, then the namespaces) must not lose its processes and
// namespaces one by one first.
var earlyResources []*resource

// trackEarly is track for such a teardown.
func trackEarly(name string, fn func()) *resource {
	r := &resource{name: name, fn: fn}
	resMu.Lock()
	earlyResources = append(earlyResources, r)
	resMu.Unlock()
	return r
}

// teardownMu makes a second teardown (a signal during the deferred one)
// wait for the first to finish instead of exiting half-way.
var teardownMu sync.Mutex

// teardownAll releases every resource in reverse order of creation.
func teardownAll() {
	teardownMu.Lock()
	defer teardownMu.Unlock()
	resMu.Lock()
	rs := append(append([]*resource(nil), resources...), earlyResources...)
	resources, earlyResources = nil, nil
	resMu.Unlock()
	if keepEnv {
		if len(rs) > 0 {
			printKeepHelp(os.Stderr)
		}
		return
	}
	for i := len(rs) - 1; i >= 0; i-- {
		rs[i].release()
	}
	if workRoot != "" {
		_ = os.RemoveAll(workRoot)
	}
}

func printKeepHelp(w *os.File) {
	fmt.Fprintf(w, "\ne2e: %s=1: the environment is kept.\n", envKeep)
	fmt.Fprintf(w, "  files and logs:  %s/<cluster>/logs  (clusters: grpc1, hcuds2, ...)\n", workRoot)
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), runID+"-") {
			fmt.Fprintf(w, "  namespace:       %s\n", e.Name())
		}
	}
	fmt.Fprintf(w, "  enter one:       ip netns exec %s-<cluster>-cp bash\n", runID)
	fmt.Fprintf(w, "  kubectl there:   kubectl --kubeconfig %s/<cluster>/harness/admin.conf get apiservices\n", workRoot)
	fmt.Fprintf(w, "  remove all:      for n in $(ip netns list | awk '/^%s-/{print $1}'); do ip netns pids $n | xargs -r kill -9; ip netns del $n; done; rm -rf %s\n\n", runID, workRoot)
}
