//go:build integration

package reliability

import (
	"bufio"
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
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
	"github.com/konnect-dev/konnect/test/harness"
	corev1 "k8s.io/api/core/v1"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// otherUID is the local user who is not root and not us: nobody, whose uid every Linux has.
const otherUID = 65534

// asOtherUser runs argv as otherUID, a real second user on this host.
func asOtherUser(t *testing.T, argv ...string) {
	t.Helper()
	uid := strconv.Itoa(otherUID)
	out, err := exec.Command("setpriv", append([]string{"--reuid", uid, "--regid", uid, "--clear-groups", "--"}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("as uid %d: %v: %v\n%s", otherUID, argv, err, out)
	}
}

// TestInitRefusesHostileHost is the review's attack, run for real: another local user who owns DIR/pki
// plants front-proxy-client.key as a symlink to a file of root's elsewhere, and root runs konnect init. It
// refuses before anything is written, naming --dir and what the other user owns, and the file stays as it
// was; so for a link planted in a directory of root's, a --dir everyone may write to, or one below a
// directory another user owns. A symlink of root's to a shared CA is still written through.
func TestInitRefusesHostileHost(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name string
		// setUp prepares dir and returns what the error must say.
		setUp func(t *testing.T, dir, victim string) []string
	}{
		{"another user owns pki and plants a symlink in it", func(t *testing.T, dir, victim string) []string {
			mustMkdir(t, filepath.Join(dir, "pki"), 0o755)
			if err := os.Chown(filepath.Join(dir, "pki"), otherUID, otherUID); err != nil {
				t.Fatal(err)
			}
			asOtherUser(t, "ln", "-s", victim, filepath.Join(dir, "pki", "front-proxy-client.key"))
			return []string{"--dir " + dir, filepath.Join(dir, "pki") + " belongs to uid 65534"}
		}},
		{"another user's symlink in root's pki", func(t *testing.T, dir, victim string) []string {
			link := filepath.Join(dir, "pki", "front-proxy-client.key")
			mustMkdir(t, filepath.Dir(link), 0o700)
			if err := os.Symlink(victim, link); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(link, otherUID, otherUID); err != nil {
				t.Fatal(err)
			}
			return []string{"refusing to write " + link, "belongs to uid 65534"}
		}},
		{"--dir writable by everyone", func(t *testing.T, dir, _ string) []string {
			mustMkdir(t, dir, 0o777)
			return []string{"--dir " + dir, "writable by everyone"}
		}},
		{"--dir below another user's directory", func(t *testing.T, dir, _ string) []string {
			mustMkdir(t, filepath.Dir(dir), 0o755)
			if err := os.Chown(filepath.Dir(dir), otherUID, otherUID); err != nil {
				t.Fatal(err)
			}
			return []string{"--dir " + dir, filepath.Dir(dir) + " belongs to uid 65534"}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := shortDir(t)
			if err := os.Chmod(base, 0o755); err != nil { // the other user must reach what is theirs
				t.Fatal(err)
			}
			dir := filepath.Join(base, "etc", "k")
			victim := filepath.Join(shortDir(t), "victim")
			writeFile(t, victim, "root's file\n")
			want := c.setUp(t, dir, victim)
			before := snapshot(t, base)
			r := konnect(t, time.Minute, initArgs(dir)...)
			checkRefused(t, r, want, "")
			if d := diffSnapshots(before, snapshot(t, base)); len(d) > 0 {
				t.Errorf("the refused init changed %v", d)
			}
			if b, _ := os.ReadFile(victim); string(b) != "root's file\n" {
				t.Errorf("the symlink's target was overwritten: %q", b)
			}
		})
	}

	t.Run("root's symlink to a shared CA is written through", func(t *testing.T) {
		shared := filepath.Join(shortDir(t), "shared")
		if r := konnect(t, time.Minute, initArgs(shared)...); r.code != 0 {
			t.Fatalf("init: %s", r)
		}
		dir := filepath.Join(shortDir(t), "k")
		mustMkdir(t, filepath.Join(dir, "pki"), 0o700)
		for _, f := range []string{"front-proxy-ca.crt", "front-proxy-ca.key"} {
			if err := os.Symlink(filepath.Join(shared, "pki", f), filepath.Join(dir, "pki", f)); err != nil {
				t.Fatal(err)
			}
		}
		if r := konnect(t, time.Minute, initArgs(dir)...); r.code != 0 {
			t.Fatalf("init with a shared front-proxy CA: %s", r)
		}
		before := snapshot(t, filepath.Join(shared, "pki"))["front-proxy-ca.crt"]
		if r := konnect(t, time.Minute, "certs", "renew", "front-proxy-ca", "--dir", dir); r.code != 0 {
			t.Fatalf("renew through the link: %s", r)
		}
		if after := snapshot(t, filepath.Join(shared, "pki"))["front-proxy-ca.crt"]; after.sum == before.sum {
			t.Error("renewing the linked CA did not reach the shared file")
		}
		if fi, err := os.Lstat(filepath.Join(dir, "pki", "front-proxy-ca.crt")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("the link was replaced: %v", err)
		}
	})
}

func mustMkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentInit runs konnect init several times at once on a fresh directory, and certs renew and
// init phase certs against it: each exits 0, and afterwards every leaf is signed by the CA on disk and
// every key matches its certificate. Without the directory's lock two runs each created a CA and left
// leaves that the other's had signed. It also shows a run that finds the lock held waiting, and saying so.
func TestConcurrentInit(t *testing.T) {
	const rounds, runs = 4, 4
	for round := range rounds {
		dir := filepath.Join(shortDir(t), "k")
		var wg sync.WaitGroup
		results := make([]result, runs)
		for i := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = konnect(t, 2*time.Minute, initArgs(dir)...)
			}()
		}
		wg.Wait()
		waited := 0
		for i, r := range results {
			if r.code != 0 {
				t.Fatalf("round %d: run %d: %s", round, i, r)
			}
			if strings.Contains(r.stderr, "Waiting for another konnect command") {
				waited++
			}
		}
		checkConsistent(t, fmt.Sprintf("round %d", round), dir)
		t.Logf("round %d: %d of %d runs waited for another", round, waited, runs)
	}

	// Writers of different kinds at once on one directory.
	dir := filepath.Join(shortDir(t), "k")
	if r := konnect(t, time.Minute, initArgs(dir)...); r.code != 0 {
		t.Fatalf("init: %s", r)
	}
	var wg sync.WaitGroup
	cmds := [][]string{
		append(initArgs(dir), "--force"),
		{"certs", "renew", "all", "--dir", dir},
		append([]string{"init", "phase", "certs"}, initArgs(dir)[1:]...),
		{"certs", "renew", "ca", "--dir", dir},
	}
	results := make([]result, len(cmds))
	for i, args := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = konnect(t, 2*time.Minute, args...)
		}()
	}
	wg.Wait()
	for _, r := range results {
		if r.code != 0 {
			t.Errorf("%s", r)
		}
	}
	checkConsistent(t, "mixed writers", dir)

	// A run that finds the lock held waits, says by whom, and goes on once it is free.
	lockPath := filepath.Join(dir, ".konnect.lock")
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "%d\n", os.Getpid())
	p := startKonnect(t, "init-waiting", initArgs(dir)...)
	want := fmt.Sprintf("Waiting for another konnect command (pid %d), which is writing into %s", os.Getpid(), dir)
	harness.Eventually(t, 20*time.Second, "init saying it waits", func() error {
		if !strings.Contains(p.Log(), want) {
			return fmt.Errorf("log so far: %s", p.Log())
		}
		return nil
	})
	if !p.Running() {
		t.Fatalf("init did not wait for the lock:\n%s", p.Log())
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if code, ok := p.Wait(time.Minute); !ok || code != 0 {
		t.Fatalf("init after the lock was free: exit %d (finished %v)\n%s", code, ok, p.Log())
	}
	if _, err := os.Lstat(lockPath); !os.IsNotExist(err) {
		t.Errorf("the lock file is left after the run: %v", err)
	}
}

// checkConsistent fails the test unless every pair in dir/pki is complete and signed by the CA on disk.
func checkConsistent(t *testing.T, what, dir string) {
	t.Helper()
	st := inspectPKI(dir)
	for _, p := range st.problems {
		t.Errorf("%s: %s", what, p)
	}
	for _, n := range []string{"ca", "front-proxy-ca", "front-proxy-client", "konnectivity-server-client", "konnectivity-server"} {
		if st.pairs[n] != pairComplete {
			t.Errorf("%s: %s is not complete", what, n)
		}
	}
	if len(st.temps) > 0 {
		t.Errorf("%s: temporary files left: %v", what, st.temps)
	}
	if err := checkServerConf(dir); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// TestInitUnusableAddresses: addresses that agents cannot dial are refused naming the flag, and nothing is
// written; init rendered them as the agents' --proxy-server-host.
func TestInitUnusableAddresses(t *testing.T) {
	for _, a := range []string{"0.0.0.0", "::", "224.0.0.1", "ff02::1", "255.255.255.255"} {
		t.Run(a, func(t *testing.T) {
			base := shortDir(t)
			dir := filepath.Join(base, "k")
			args := initArgs(dir)
			args[4] = a // --control-plane-address's value
			r := konnect(t, time.Minute, args...)
			checkRefused(t, r, []string{"--control-plane-address: " + a}, "")
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("the refused init created %s", dir)
			}
		})
	}
}

// TestInitSharedSocketDir: with --uds-name in a directory everyone may write to, init refuses, naming
// --uds-name and --allow-shared-uds-dir; with that flag it writes a server pod that carries it, and the
// server run with exactly that pod's arguments binds the socket. Without the flag in the pod, as init
// rendered it before, the server refuses to start.
func TestInitSharedSocketDir(t *testing.T) {
	requireRoot(t)
	base := shortDir(t)
	shared := filepath.Join(base, "shared")
	mustMkdir(t, shared, 0o777)
	sock := filepath.Join(shared, "s", "k.sock")
	dir := filepath.Join(base, "k")
	args := []string{"init", "--dir", dir, "--control-plane-address", "127.0.0.1", "--apiserver-url", "https://127.0.0.1:6443", "--uds-name", sock}
	r := konnect(t, time.Minute, args...)
	checkRefused(t, r, []string{"--uds-name " + sock, shared + " is writable by everyone", "--allow-shared-uds-dir"}, "")
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the refused init created %s", dir)
	}
	if r := konnect(t, time.Minute, append(args, "--allow-shared-uds-dir")...); r.code != 0 {
		t.Fatalf("init --allow-shared-uds-dir: %s", r)
	}
	data, err := os.ReadFile(filepath.Join(dir, "manifests", "konnectivity-server.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		t.Fatal(err)
	}
	podArgs := pod.Spec.Containers[0].Args
	ports := harness.FreePorts(t, 3)
	// The pod's own arguments, on free ports: the host network is shared with other tests.
	run := func(name string, drop string) *harness.Proc {
		var a []string
		for _, arg := range podArgs {
			switch {
			case arg == drop:
			case strings.HasPrefix(arg, "--agent-port="):
				a = append(a, "--agent-port="+strconv.Itoa(ports[0]))
			case strings.HasPrefix(arg, "--admin-port="):
				a = append(a, "--admin-port="+strconv.Itoa(ports[1]))
			case strings.HasPrefix(arg, "--health-port="):
				a = append(a, "--health-port="+strconv.Itoa(ports[2]))
			default:
				a = append(a, arg)
			}
		}
		return startKonnect(t, name, a...)
	}
	if !containsArg(podArgs, "--allow-shared-uds-dir") {
		t.Fatalf("the server's pod lacks --allow-shared-uds-dir: %v", podArgs)
	}
	without := run("server-without-flag", "--allow-shared-uds-dir")
	if code, ok := without.Wait(30 * time.Second); !ok || code == 0 || !strings.Contains(without.Log(), "--allow-shared-uds-dir") {
		t.Errorf("the server without --allow-shared-uds-dir: exit %d (finished %v), want a refusal naming the flag\n%s", code, ok, without.Log())
	}
	with := run("server", "")
	harness.Eventually(t, 30*time.Second, "the server's socket", func() error {
		if !with.Running() {
			t.Fatalf("the server with the pod's arguments exited:\n%s", with.Log())
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

func containsArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}

// TestProxyPathTricks drives konnect proxy (default filter) with curl, which sends paths as given, and
// with raw request lines, against a loopback HTTPS server that stands for kube-apiserver and records every
// request it gets: no spelling of a pod exec reaches it, and plain paths reach it exactly as sent.
func TestProxyPathTricks(t *testing.T) {
	var mu sync.Mutex
	var got []string
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.RequestURI)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"Status","status":"Success"}`)
	}))
	backend.EnableHTTP2 = true
	backend.StartTLS()
	t.Cleanup(backend.Close)
	dir := shortDir(t)
	kc := filepath.Join(dir, "kubeconfig")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: backend.Certificate().Raw})
	if err := pkitest.WriteKubeconfig(kc, clientcmdapi.Cluster{Server: backend.URL, CertificateAuthorityData: caPEM}, clientcmdapi.AuthInfo{Token: "t"}); err != nil {
		t.Fatal(err)
	}
	port := harness.FreePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p := startKonnect(t, "proxy", "proxy", "--kubeconfig", kc, "--port", strconv.Itoa(port))
	harness.Eventually(t, 20*time.Second, "proxy serving", func() error {
		if !p.Running() {
			t.Fatalf("proxy exited:\n%s", p.Log())
		}
		return httpOK("http://" + addr + "/version")
	})
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	const execPath = "/api/v1/namespaces/d/pods/p/exec"
	for _, target := range []string{
		"/%2e" + execPath + "?command=id",
		"/%2E%2E" + execPath,
		"/x/%2e%2e" + execPath,
		"/x%2f..%2f" + execPath[1:],
		"/%252e" + execPath,
		"/x%5c..%5c" + execPath[1:],
		`/x\..\` + execPath[1:],
		"/api;x/v1/namespaces/d/pods/p/exec",
		"/api./v1/namespaces/d/pods/p/exec",
		"/api%20/v1/namespaces/d/pods/p/exec",
		"/%EF%BC%8E" + execPath,
		"/%C0%AE" + execPath,
		"//api/v1/namespaces/d/pods/p/exec",
		"/./api/v1/namespaces/d/pods/p/exec",
		"/api/v1/namespaces/d/pods/p/ex%65c?command=id",
		"/api/v1/namespaces/d/pods/p/attach",
		// The kubelet's exec, run, attach, portForward, checkpoint and debug/flags through the node proxy (kubectl proxy passes them).
		"/api/v1/nodes/w1/proxy/exec/d/p/c?command=id",
		"/api/v1/nodes/w1:10250/proxy/run/d/p/c?cmd=id",
		"/api/v1/nodes/w1/proxy/%61ttach/d/p/c",
		"/api/v1/nodes/w1/proxy/portForward/d/p?port=22",
		"/api/v1/nodes/w1/proxy/checkpoint/d/p/c",
		"/api/v1/nodes/w1/proxy/debug/flags/v",
	} {
		before := len(seen())
		code := curlStatus(t, "http://"+addr+target)
		raw := rawStatus(t, addr, target)
		if code < 300 || code >= 500 || raw < 300 || raw >= 500 {
			t.Errorf("GET %s: curl %d, raw %d; want a refusal", target, code, raw)
		}
		if after := seen(); len(after) != before {
			t.Errorf("GET %s reached the API server as %q", target, after[before:])
		}
	}
	for _, target := range []string{
		"/api/v1/namespaces/d/pods",
		"/api/v1/namespaces/d/services/http:web:80/proxy/",
		"/api/v1/namespaces/d/services/http%3Aweb%3A80/proxy/a%20b",
		"/api/v1/namespaces/d/pods?labelSelector=app%3Dweb&limit=5",
	} {
		if code := curlStatus(t, "http://"+addr+target); code != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", target, code)
			continue
		}
		if after := seen(); after[len(after)-1] != target {
			t.Errorf("GET %s reached the API server as %q", target, after[len(after)-1])
		}
	}
}

func curlStatus(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "curl", "--path-as-is", "--globoff", "-s", "-o", "/dev/null", "-w", "%{http_code}", url).Output()
	if err != nil {
		t.Fatalf("curl %s: %v", url, err)
	}
	code, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return code
}

func rawStatus(t *testing.T, addr, target string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %q: %v", target, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
