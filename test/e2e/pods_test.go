//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/test/harness"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestNodes runs konnect from its own image on real kubelets: the server as the static pod konnect init
// wrote, the agents as its DaemonSet, and kubectl logs, exec, port-forward and cp reaching pods on w1 and
// w2, whose kubelets kube-apiserver can reach only through the tunnel.
func TestNodes(t *testing.T) {
	dumpLogsOnFailure(t)
	start := time.Now()
	nc := sharedNodeCluster(t)
	defer func() { t.Logf("node scenarios took %v (cluster included)", time.Since(start).Round(time.Second)) }()

	t.Run("kubelets-only-through-the-tunnel", func(t *testing.T) {
		for _, w := range []string{nsW1, nsW2} {
			n := nc.node(w)
			for _, addr := range []string{net.JoinHostPort(n.ip, "10250"), net.JoinHostPort(strings.TrimSuffix(n.podCIDR, "0/24")+"2", "8080")} {
				if err := expectUnreachable(nc.tp.ns(nsCP), addr); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Logf("direct dials from cp to the workers' kubelets and pod subnets: network is unreachable")
	})

	t.Run("from-cp", func(t *testing.T) { nc.podOperations(t, nsCP, nc.kubeconfig) })
	t.Run("from-lap", func(t *testing.T) { nc.podOperations(t, nsLap, nc.startLaptop(t).kubeconfig) })

	t.Run("node-targeted-routing", func(t *testing.T) {
		// With a random choice of agent, about two dials in three would go to an agent that cannot reach the
		// node (TOPOLOGY.md); every one must succeed.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, w := range []string{nsW1, nsW2} {
			for i := range 10 {
				if _, err := nc.kubectl(ctx, nsCP, "logs", "bb-"+w, "--tail=1"); err != nil {
					t.Fatalf("logs of bb-%s, try %d: %v", w, i, err)
				}
			}
		}
		t.Logf("20 of 20 kubectl logs on w1 and w2 reached the right node's agent (destHost, host=NODE_IP)")
	})

	t.Run("doctor-extensions", func(t *testing.T) { nc.checkDoctorExtensions(t) })
	t.Run("slow-reader", func(t *testing.T) { nc.checkSlowReader(t) })
	t.Run("least-privilege", func(t *testing.T) { nc.checkLeastPrivilege(t) })
	t.Run("honest-streams", func(t *testing.T) { nc.checkHonestStreams(t) })
	t.Run("certs-renew", func(t *testing.T) { nc.renewServerCerts(t) })
	t.Run("server-leases", func(t *testing.T) { nc.checkServerLeases(t) })
	t.Run("drop-in-agent", func(t *testing.T) { nc.swapAgents(t) })
	t.Run("drop-in-server", func(t *testing.T) { nc.swapServer(t) })
}

// kc runs kubectl from namespace role with kubeconfig.
func (nc *nodeCluster) kc(ctx context.Context, role, kubeconfig string, args ...string) (string, error) {
	return harness.Run(ctx, nc.tp.ns(role), append([]string{bins.kubectl, "--kubeconfig", kubeconfig}, args...)...)
}

// podOperations runs logs, logs -f, exec (stdin, exit code), port-forward and cp of 64 MiB both ways on
// the busybox pods of w1 and w2, with kubectl in namespace role.
func (nc *nodeCluster) podOperations(t *testing.T, role, kubeconfig string) {
	for i, w := range []string{nsW1, nsW2} {
		pod := "bb-" + w
		t.Run(w, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			kc := func(args ...string) string {
				t.Helper()
				out, err := nc.kc(ctx, role, kubeconfig, args...)
				if err != nil {
					t.Fatal(err)
				}
				return out
			}

			if out := kc("logs", pod, "--tail=5"); !strings.Contains(out, "tick ") {
				t.Fatalf("kubectl logs %s: %q", pod, out)
			}
			follow := startProcT(t, "kubectl-logs-f-"+role+"-"+w, nc.tp.ns(role), nc.logDir, bins.kubectl, "--kubeconfig", kubeconfig, "logs", "-f", "--tail=1", pod)
			if err := harness.Poll("kubectl logs -f to stream 3 lines", 30*time.Second, 200*time.Millisecond, func() error {
				if n := strings.Count(readFile(follow.LogPath), "tick "); n < 3 {
					return fmt.Errorf("%d lines so far", n)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			follow.res.release()

			// exec with stdin; the command's exit code comes back as kubectl's.
			in := "hello through the tunnel " + randHex(4)
			out, code, err := nc.kubectlStdin(ctx, role, kubeconfig, in, "exec", "-i", pod, "--", "sh", "-c", "cat; exit 3")
			if code != 3 || out != in {
				t.Fatalf("kubectl exec -i %s -- sh -c 'cat; exit 3': exit %d (%v), stdout %q, want exit 3 and %q", pod, code, err, out, in)
			}

			want := strings.Fields(kc("exec", pod, "--", "sha256sum", "/tmp/www/big"))[0]
			// port-forward: 64 MiB from busybox httpd.
			port := 18080 + i
			pf := startProcT(t, "kubectl-port-forward-"+role+"-"+w, nc.tp.ns(role), nc.logDir, bins.kubectl, "--kubeconfig", kubeconfig,
				"port-forward", "pod/"+pod, fmt.Sprintf("%d:8080", port))
			if err := harness.Poll("kubectl port-forward to listen", 30*time.Second, 200*time.Millisecond, func() error {
				if err := pf.Exited(); err != nil {
					return err
				}
				if !strings.Contains(pf.Log(), "Forwarding from") {
					return errNotYet
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(nc.dir, fmt.Sprintf("pf-%s-%s", role, w))
			tStart := time.Now()
			if out, err := harness.Run(ctx, nc.tp.ns(role), bins.curl, "-sS", "--fail", "--max-time", "120", "-o", dst, fmt.Sprintf("http://127.0.0.1:%d/big", port)); err != nil {
				t.Fatalf("curl through kubectl port-forward: %v %s", err, out)
			}
			d := time.Since(tStart)
			if got := fileSHA256(t, dst); got != want {
				t.Fatalf("64 MiB through port-forward: sha256 %s, want %s", got, want)
			}
			pf.res.release()
			t.Logf("port-forward: 64 MiB in %v, sha256 matches", d.Round(10*time.Millisecond))

			// cp both ways.
			up := uploadFile(t)
			remote := "/tmp/up-" + role
			tStart = time.Now()
			kc("cp", up, "default/"+pod+":"+remote)
			if got := strings.Fields(kc("exec", pod, "--", "sha256sum", remote))[0]; got != fileSHA256(t, up) {
				t.Fatalf("kubectl cp to %s: sha256 %s, want %s", pod, got, fileSHA256(t, up))
			}
			kc("exec", pod, "--", "rm", "-f", remote)
			down := filepath.Join(nc.dir, fmt.Sprintf("cp-%s-%s", role, w))
			kc("cp", "default/"+pod+":/tmp/www/big", down)
			if got := fileSHA256(t, down); got != want {
				t.Fatalf("kubectl cp from %s: sha256 %s, want %s", pod, got, want)
			}
			_ = os.Remove(down)
			_ = os.Remove(dst)
			t.Logf("from %s on %s: logs, logs -f, exec -i (exit 3 passed on), port-forward and cp of 64 MiB both ways (%v for cp) work",
				role, w, time.Since(tStart).Round(10*time.Millisecond))
		})
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// kubectlStdin runs kubectl with stdin and returns stdout and the exit code.
func (nc *nodeCluster) kubectlStdin(ctx context.Context, role, kubeconfig, stdin string, args ...string) (string, int, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", nc.tp.ns(role), bins.kubectl, "--kubeconfig", kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0, nil
	case errors.As(err, &ee):
		return stdout.String(), ee.ExitCode(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	default:
		return stdout.String(), -1, err
	}
}

var upload struct {
	sync.Mutex
	path string
}

// uploadFile is a 64 MiB random file, made once per run.
func uploadFile(t *testing.T) string {
	upload.Lock()
	defer upload.Unlock()
	if upload.path == "" {
		p := filepath.Join(workRoot, "upload-64MiB")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(f, rand.Reader, 64<<20); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		upload.path = p
	}
	return upload.path
}

func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// containerPID finds the host PID of a pod's container through the node's containerd.
func (nc *nodeCluster) containerPID(t *testing.T, nodeName, ns, pod string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := nc.kubectl(ctx, nsCP, "-n", ns, "get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimPrefix(id, "containerd://")
	out, err := harness.Run(ctx, "", "ctr", "--address", nc.node(nodeName).sock, "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("container %s of %s/%s is not a running task on %s:\n%s", id, ns, pod, nodeName, out)
	return 0
}

// agentPod returns the name of the running agent pod on nodeName.
func (nc *nodeCluster) agentPod(ctx context.Context, nodeName string) (string, error) {
	out, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pods", "-l", "k8s-app=konnectivity-agent",
		"--field-selector", "spec.nodeName="+nodeName+",status.phase=Running", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 1 {
			return f[0], nil
		}
	}
	return "", fmt.Errorf("no running agent pod on %s: %q", nodeName, out)
}

// checkLeastPrivilege looks into the running containers: the server sees the files it reads and not the
// CA keys next to them; the agent runs as 65534 on a read-only root filesystem.
func (nc *nodeCluster) checkLeastPrivilege(t *testing.T) {
	pid := nc.containerPID(t, nsCP, "kube-system", "konnectivity-server-cp")
	mi := readFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	root := fmt.Sprintf("/proc/%d/root", pid)
	if strings.Contains(mi, " "+nc.pki+" ") {
		t.Fatalf("the server container mounts the whole %s:\n%s", nc.pki, mi)
	}
	for _, f := range []string{"ca.key", "front-proxy-ca.key", "front-proxy-client.key", "konnectivity-server-client.key"} {
		if _, err := os.Stat(root + filepath.Join(nc.pki, f)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s is visible in the server container (%v)", filepath.Join(nc.pki, f), err)
		}
	}
	for _, f := range []string{"konnectivity-server.crt", "konnectivity-server.key"} {
		p := filepath.Join(nc.pki, f)
		if _, err := os.Stat(root + p); err != nil {
			t.Fatalf("%s, which the server reads, is not visible in its container: %v", p, err)
		}
		if !mountedRO(mi, p) {
			t.Fatalf("%s is not a read-only mount in the server container:\n%s", p, mi)
		}
	}
	t.Logf("server container (pid %d): konnectivity-server.{crt,key} mounted read-only; ca.key, front-proxy-ca.key and the other keys not visible", pid)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, err := nc.agentPod(ctx, nsW1)
	if err != nil {
		t.Fatal(err)
	}
	apid := nc.containerPID(t, nsW1, "kube-system", agent)
	status := readFile(fmt.Sprintf("/proc/%d/status", apid))
	uid := grepLine(status, "Uid:")
	if f := strings.Fields(uid); len(f) != 5 || f[1] != "65534" || f[2] != "65534" || f[3] != "65534" || f[4] != "65534" {
		t.Fatalf("agent %s (pid %d): %q, want Uid 65534", agent, apid, uid)
	}
	if !mountedRO(readFile(fmt.Sprintf("/proc/%d/mountinfo", apid)), "/") {
		t.Fatalf("agent %s: root filesystem is not read-only", agent)
	}
	t.Logf("agent %s (pid %d): %s, root filesystem read-only", agent, apid, uid)
}

// mountedRO reports whether mountinfo has a read-only mount at mountPoint.
func mountedRO(mountinfo, mountPoint string) bool {
	for _, l := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && unescapeMount(f[4]) == mountPoint {
			for _, o := range strings.Split(f[5], ",") {
				if o == "ro" {
					return true
				}
			}
		}
	}
	return false
}

// checkHonestStreams deletes w1's agent under a running exec and logs -f: both must end with an error
// (ANP issue 748: a stream cut by the tunnel must never look like a clean end).
func (nc *nodeCluster) checkHonestStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	exe := startProcT(t, "kubectl-exec-long", nc.tp.ns(nsCP), nc.logDir, bins.kubectl, "--kubeconfig", nc.kubeconfig,
		"exec", "bb-w1", "--", "sh", "-c", "i=0; while [ $i -lt 600 ]; do echo line $i; i=$((i+1)); sleep 0.2; done")
	follow := startProcT(t, "kubectl-logs-f-long", nc.tp.ns(nsCP), nc.logDir, bins.kubectl, "--kubeconfig", nc.kubeconfig,
		"logs", "-f", "--tail=1", "bb-w1")
	if err := harness.Poll("exec and logs -f to stream", 30*time.Second, 200*time.Millisecond, func() error {
		if !strings.Contains(exe.Log(), "line 3") || strings.Count(readFile(follow.LogPath), "tick ") < 3 {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	agent, err := nc.agentPod(ctx, nsW1)
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if _, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "delete", "pod", agent, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proc{exe, follow} {
		if _, ok := p.Wait(90 * time.Second); !ok {
			t.Fatalf("%s still runs 90 s after w1's agent was deleted", p.Name)
		}
		after := time.Since(deleted).Round(100 * time.Millisecond)
		var ee *exec.ExitError
		if errors.As(p.Err(), &ee) && ee.ExitCode() != 0 {
			t.Logf("%s ended %v after the agent was deleted, with %v: %s", p.Name, after, p.Err(), lastLine(p.LogTail(3)))
			continue
		}
		if p == follow {
			// kube-apiserver cannot report it: StreamObject (k8s.io/apiserver v0.36.1,
			// pkg/endpoints/handlers/responsewriters/writers.go) ignores the error of its io.Copy from
			// kubelet's response and ends the chunked response cleanly, so kubectl logs -f sees a normal end
			// whatever broke behind kube-apiserver. What the tunnel owes it, ending the stream instead of
			// hanging, is checked above; the pod still prints, so the end is not the log's.
			t.Logf("KNOWN LIMITATION (kube-apiserver, not the tunnel): %s ended %v after the agent was deleted with exit 0; "+
				"kube-apiserver ends a cut log stream as if complete", p.Name, after)
			continue
		}
		t.Fatalf("%s ended with %v after w1's agent was deleted; want a non-zero exit:\n%s", p.Name, p.Err(), p.LogTail(5))
	}
	var newAgent string
	if err := harness.Poll("a new agent on w1", 90*time.Second, time.Second, func() error {
		a, err := nc.agentPod(ctx, nsW1)
		if err != nil {
			return err
		}
		if a == agent {
			return fmt.Errorf("only the old agent %s", a)
		}
		newAgent = a
		_, err = nc.kubectl(ctx, nsCP, "-n", "kube-system", "wait", "--for=condition=Ready", "pod/"+a, "--timeout=5s")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	if err := harness.Poll("a new exec on w1", 30*time.Second, time.Second, func() error {
		_, err := nc.kubectl(ctx, nsCP, "exec", "bb-w1", "--", "echo", "ok")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("new agent %s Ready; exec works again %v later", newAgent, time.Since(ready).Round(100*time.Millisecond))
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

// loop is a bounded request loop against the APIService (GET of flunders) while something changes.
type loop struct {
	stop     chan struct{}
	done     chan struct{}
	total    int
	failed   int
	firstErr error
}

func (nc *nodeCluster) startLoop(t *testing.T) *loop {
	client, err := nc.apiHTTPClient(nsCP)
	if err != nil {
		t.Fatal(err)
	}
	l := &loop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		deadline := time.Now().Add(5 * time.Minute)
		for l.total < 3000 && time.Now().Before(deadline) {
			select {
			case <-l.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := httpGetOK(ctx, client, fmt.Sprintf("https://%s:%d%s", cpAddr, apiPort, flundersPath), nil)
			cancel()
			l.total++
			if err != nil {
				l.failed++
				if l.firstErr == nil {
					l.firstErr = err
				}
			}
		}
	}()
	return l
}

func (l *loop) finish() *loop {
	close(l.stop)
	<-l.done
	return l
}

func (l *loop) String() string {
	s := fmt.Sprintf("%d of %d requests failed", l.failed, l.total)
	if l.firstErr != nil {
		s += fmt.Sprintf(" (first: %s)", tailString(l.firstErr.Error(), 300))
	}
	return s
}

// swapAgents changes the DaemonSet's image and command to upstream proxy-agent and back while requests
// run, then restarts konnect's agents; that last rollout must lose no request.
func (nc *nodeCluster) swapAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	set := func(image, command string) string {
		return fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":%q},`+
			`{"op":"replace","path":"/spec/template/spec/containers/0/command","value":[%q]}]`, image, command)
	}
	roll := func(what string, change ...string) *loop {
		t.Helper()
		l := nc.startLoop(t)
		start := time.Now()
		if _, err := nc.kubectl(ctx, nsCP, append([]string{"-n", "kube-system"}, change...)...); err != nil {
			l.finish()
			t.Fatal(err)
		}
		if err := nc.waitAgentsRolledOut(ctx, 3*time.Minute); err != nil {
			l.finish()
			t.Fatal(err)
		}
		// The window ends when the last old agent is gone: it drains after the rollout counts as complete.
		if err := harness.Poll("the old agents to be gone", 90*time.Second, 500*time.Millisecond, func() error {
			out, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pods", "-l", "k8s-app=konnectivity-agent", "-o", "name")
			if err != nil {
				return err
			}
			if n := len(strings.Fields(out)); n != 3 {
				return fmt.Errorf("%d agent pods", n)
			}
			return nil
		}); err != nil {
			l.finish()
			t.Fatal(err)
		}
		l.finish()
		t.Logf("%s: rollout in %v; %s", what, time.Since(start).Round(100*time.Millisecond), l)
		if err := harness.Poll("flunders after "+what, 30*time.Second, time.Second, func() error { return nc.flundersWork(ctx) }); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.kubectl(ctx, nsCP, "exec", "bb-w2", "--", "echo", "ok"); err != nil {
			t.Fatalf("exec on w2 after %s: %v", what, err)
		}
		return l
	}
	roll("konnect agents -> upstream proxy-agent", "patch", "ds", "konnectivity-agent", "--type=json", "-p", set(imgProxyAgent, upstreamAgentBin))
	roll("upstream proxy-agent -> konnect agents", "patch", "ds", "konnectivity-agent", "--type=json", "-p", set(nc.konnectImage, "/usr/local/bin/konnect"))
	l := roll("konnect -> konnect (rollout restart)", "rollout", "restart", "ds", "konnectivity-agent")
	if l.failed != 0 {
		t.Errorf("konnect-to-konnect rollout with maxSurge and drain: %s, want none", l)
	}
}

// swapServer replaces the server's static pod manifest with upstream proxy-server's image and command,
// then puts konnect's file back, byte for byte, while requests run.
func (nc *nodeCluster) swapServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	path := filepath.Join(nc.konnectDir, "manifests", "konnectivity-server.yaml")
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(orig, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Spec.Containers[0].Image = imgProxyServer
	pod.Spec.Containers[0].Command = []string{upstreamServerBin}
	upstream, err := yaml.Marshal(&pod)
	if err != nil {
		t.Fatal(err)
	}
	// Written next to the manifest directory and renamed in: kubelet would run any *.yaml it sees there.
	replace := func(data []byte) {
		t.Helper()
		tmp := filepath.Join(nc.konnectDir, ".konnectivity-server.yaml.tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if b, _ := os.ReadFile(path); !bytes.Equal(b, orig) {
			replace(orig)
		}
	})
	for _, step := range []struct {
		what string
		data []byte
		impl impl
	}{
		{"konnect server -> upstream proxy-server", upstream, implUpstream},
		{"upstream proxy-server -> konnect server", orig, implKonnect},
	} {
		l := nc.startLoop(t)
		start := time.Now()
		replace(step.data)
		if err := nc.waitServerPod(ctx, step.impl, 2*time.Minute); err != nil {
			l.finish()
			t.Fatal(err)
		}
		if err := harness.Poll("flunders after "+step.what, 60*time.Second, time.Second, func() error { return nc.flundersWork(ctx) }); err != nil {
			l.finish()
			t.Fatal(err)
		}
		l.finish()
		t.Logf("%s: new server pod Ready and flunders served %v after the swap; %s", step.what, time.Since(start).Round(100*time.Millisecond), l)
		if _, err := nc.kubectl(ctx, nsCP, "exec", "bb-w1", "--", "echo", "ok"); err != nil {
			t.Fatalf("exec on w1 after %s: %v", step.what, err)
		}
	}
}

// phantomLease is a second server's Lease, valid for an hour, that no server renews.
const phantomLease = `apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: konnectivity-e2e-phantom
  namespace: %s
  labels:
    k8s-app: konnectivity-server
spec:
  holderIdentity: e2e-phantom
  leaseDurationSeconds: 3600
  renewTime: "%s"
`

// checkServerLeases: konnect init --server-leases on real kubelets. The server's lease controller keeps its
// Lease with the server's kubeconfig, and every agent pod counts the Leases with its own kubeconfig, token
// and Role: a phantom server's Lease raises each agent's count to 2, and deleting it brings it back to 1.
func (nc *nodeCluster) checkServerLeases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// Least privilege: the server may write the Leases of its own namespace, and none of kube-system's
	// (kube-controller-manager's and kube-scheduler's leader election, kube-apiserver's identity).
	for ns, want := range map[string]string{manifests.LeaseNamespace: "yes", "kube-system": "no"} {
		if out, _ := nc.kubectl(ctx, nsCP, "auth", "can-i", "update", "leases.coordination.k8s.io", "-n", ns, "--as=system:konnectivity-server"); strings.TrimSpace(out) != want {
			t.Errorf("system:konnectivity-server may update Leases in %s: %q, want %s", ns, out, want)
		}
	}
	harness.Eventually(t, time.Minute, "the server's own Lease in "+manifests.LeaseNamespace, func() error {
		out, err := nc.kubectl(ctx, nsCP, "-n", manifests.LeaseNamespace, "get", "leases", "-l", "k8s-app=konnectivity-server", "-o", "name")
		if err != nil {
			return err
		}
		if n := len(strings.Fields(out)); n != 1 {
			return fmt.Errorf("%d Leases: %q", n, out)
		}
		return nil
	})
	counts := func(want int) {
		t.Helper()
		for _, n := range nc.nodes {
			harness.Eventually(t, time.Minute, fmt.Sprintf("the agent on %s to count %d servers", n.name, want), func() error {
				got, err := nc.agentKnownServers(ctx, n)
				if err == nil && got != want {
					err = fmt.Errorf("it counts %d", got)
				}
				return err
			})
		}
	}
	counts(1)
	// Left behind by a failure, the phantom would keep every agent short of a server for an hour.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := nc.kubectl(ctx, nsCP, "-n", manifests.LeaseNamespace, "delete", "--ignore-not-found", "lease", "konnectivity-e2e-phantom"); err != nil {
			t.Logf("cleanup: delete the phantom Lease: %v\n%s", err, out)
		}
	})
	lease := fmt.Sprintf(phantomLease, manifests.LeaseNamespace, time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"))
	if err := nc.applyYAML(ctx, lease); err != nil {
		t.Fatalf("the phantom Lease: %v", err)
	}
	counts(2)
	if _, err := nc.kubectl(ctx, nsCP, "-n", manifests.LeaseNamespace, "delete", "lease", "konnectivity-e2e-phantom"); err != nil {
		t.Fatal(err)
	}
	counts(1)
	t.Logf("the server keeps its Lease; the agents on %d nodes counted 1, 2 with a phantom server's Lease, and 1 again", len(nc.nodes))
}

// agentKnownServers reads known_server_count from the metrics of the agent pod on node n, from n's network
// namespace, where the pod's address is routed.
func (nc *nodeCluster) agentKnownServers(ctx context.Context, n *node) (int, error) {
	pod, err := nc.agentPod(ctx, n.name)
	if err != nil {
		return 0, err
	}
	ip, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", pod, "-o", "jsonpath={.status.podIP}")
	if err != nil {
		return 0, err
	}
	var body string
	client := nsHTTPClient(n.ns, nil, 5*time.Second)
	if err := httpGetOK(ctx, client, "http://"+net.JoinHostPort(strings.TrimSpace(ip), "8093")+"/metrics", &body); err != nil {
		return 0, err
	}
	return knownServerCount(body)
}
