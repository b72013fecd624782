//go:build integration

package proxycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// withProxyURL rewrites kubeconfig's cluster to use proxyURL.
func withProxyURL(t *testing.T, kubeconfig, proxyURL string) {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc.Clusters["test"].ProxyURL = proxyURL
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
}

// --via against a real OpenSSH sshd: the API traffic goes through an SSH direct-tcpip channel, and the
// kubeconfig's proxy-url (here a dead one) is ignored.
func TestViaRealSSHD(t *testing.T) {
	t.Setenv("SSH_AUTH_SOCK", "")
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_ed25519", "")
	sshd := harness.StartSSHD(t, pub)
	knownHosts := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(knownHosts, []byte(sshd.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t)
	kc := b.kubeconfig(t, "cert")
	withProxyURL(t, kc, "socks5://127.0.0.1:1")
	u, _ := url.Parse(b.url)
	_, backendPort, _ := net.SplitHostPort(u.Host)

	sshArgs := func(knownHosts string) []string {
		return []string{"--kubeconfig", kc, "--port=0", "--via", "root@127.0.0.1", "--ssh-port", strconv.Itoa(sshd.Port),
			"-i", key, "--known-hosts", knownHosts, "--ssh-config", "none", "--connect-timeout", "5s"}
	}

	t.Run("API through SSH", func(t *testing.T) {
		addr, stop := runCommand(t, sshArgs(knownHosts)...)
		code, body := get(t, "http://"+addr+"/api", "")
		if code != 200 || !strings.Contains(body, `"path":"/api"`) {
			t.Fatalf("GET /api over SSH: %d %q", code, body)
		}
		if code, _ := get(t, "http://"+addr+"/api", "evil.example"); code != 403 {
			t.Fatalf("Host evil.example over SSH: %d, want 403", code)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		// sshd (LogLevel DEBUG1) logs each direct-tcpip channel with its target.
		want := "target 127.0.0.1 port " + backendPort
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(sshd.Log(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("sshd log has no channel to the API server (%q):\n%s", want, sshd.Log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("sshd restart", func(t *testing.T) {
		addr, stop := runCommand(t, sshArgs(knownHosts)...)
		if code, _ := get(t, "http://"+addr+"/api", ""); code != 200 {
			t.Fatalf("before the restart: %d", code)
		}
		// The SSH connection, and every pooled connection to the API server inside it, dies; the proxy
		// keeps its port, reconnects, and serves again.
		sshd.Restart()
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body := get(t, "http://"+addr+"/api", "")
			if code == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no success within 20s of the sshd restart; last: %d %q", code, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})

	// A failed request says which hop failed, as konnect socks does: the SSH server that is down (503), or
	// the API server as the SSH server reports it (502), as the message of a Status. Each is logged at the
	// default level, rate-limited.
	t.Run("errors name the hop", func(t *testing.T) {
		logs := harness.CaptureKlogAt(t, 0)
		closedKC := b.kubeconfig(t, "cert")
		kc, err := clientcmd.LoadFromFile(closedKC)
		if err != nil {
			t.Fatal(err)
		}
		closed := harness.FreePort(t)
		kc.Clusters["test"].Server = "https://127.0.0.1:" + strconv.Itoa(closed)
		if err := clientcmd.WriteToFile(*kc, closedKC); err != nil {
			t.Fatal(err)
		}
		args := sshArgs(knownHosts)
		args[1] = closedKC
		addr, stop := runCommand(t, args...)
		server := "SSH server root@" + sshd.Addr()
		code, body := get(t, "http://"+addr+"/api", "")
		want := fmt.Sprintf("konnect proxy: %s could not open 127.0.0.1:%d: connect failed (Connection refused)", server, closed)
		if code != 502 || !strings.HasPrefix(statusMessage(t, body), want) {
			t.Errorf("API server down: %d %q, want 502 %q", code, body, want)
		}
		sshd.Stop()
		t.Cleanup(sshd.Restart)
		// At once: each waits for the SSH connection up to --connect-timeout, and they fail together.
		const n = 20
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, body := get(t, "http://"+addr+"/api", "")
				want := "konnect proxy: " + server + " is unreachable: "
				if code != 503 || !strings.HasPrefix(statusMessage(t, body), want) {
					t.Errorf("SSH server down: %d %q, want 503 %q...", code, body, want)
				}
			}()
		}
		wg.Wait()

		if err := stop(); err != nil {
			t.Fatal(err)
		}
		klog.Flush()
		log := logs()
		for _, w := range []string{"answer=502", "could not open 127.0.0.1:" + strconv.Itoa(closed), "answer=503", server + " is unreachable"} {
			if !strings.Contains(log, w) {
				t.Errorf("the log does not say %q:\n%s", w, log)
			}
		}
		// The first failure and a burst of 5 more at most, and one a second for the time the requests took.
		if lines := strings.Count(log, `"Proxying to the API server failed"`); lines < 5 || lines > 8 {
			t.Errorf("%d failures logged %d lines, want a burst of 5 and then one a second:\n%s", n+1, lines, log)
		}
	})

	// Start-up mistakes end the command at once, naming --via: a port nobody listens on (unless
	// --retry-first), a key others may read (unless --allow-unprotected-key).
	t.Run("start-up mistakes end the command", func(t *testing.T) {
		open := filepath.Join(t.TempDir(), "id_open")
		pem, _ := os.ReadFile(key)
		os.WriteFile(open, pem, 0o600)
		os.Chmod(open, 0o644)
		closed := strconv.Itoa(harness.FreePort(t))
		for _, c := range []struct {
			name   string
			change func(args []string) []string
			want   []string
		}{
			{"closed port", func(a []string) []string { a[6] = closed; return a }, []string{"--via: cannot connect to root@127.0.0.1:" + closed, "--retry-first"}},
			{"unprotected key", func(a []string) []string { a[8] = open; return a }, []string{"--via: UNPROTECTED PRIVATE KEY FILE", "0644", open, "--allow-unprotected-key"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				cmd := NewProxyCommand()
				out := &harness.SyncBuffer{}
				cmd.SetOut(out)
				cmd.SetErr(out)
				args := sshArgs(knownHosts)
				if args[5] != "--ssh-port" || args[7] != "-i" {
					t.Fatalf("sshArgs changed: %v", args)
				}
				cmd.SetArgs(c.change(args))
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				t0 := time.Now()
				err := cmd.ExecuteContext(ctx)
				if err == nil || time.Since(t0) > 10*time.Second {
					t.Fatalf("command returned %v after %s; want an error at once", err, time.Since(t0))
				}
				for _, want := range c.want {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not say %q: %v", want, err)
					}
				}
			})
		}
	})

	// It ends without logging "Serving": until the SSH connection is up the log says "Listening; connecting".
	t.Run("unknown host key ends the command", func(t *testing.T) {
		logs := harness.CaptureKlogAt(t, 0)
		empty := filepath.Join(t.TempDir(), "known_hosts")
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := NewProxyCommand()
		out := &harness.SyncBuffer{}
		cmd.SetOut(out)
		cmd.SetErr(out)
		cmd.SetArgs(sshArgs(empty))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := cmd.ExecuteContext(ctx)
		if err == nil || ctx.Err() != nil {
			t.Fatalf("command returned %v (ctx %v); want an SSH host key error before the timeout", err, ctx.Err())
		}
		if !strings.Contains(err.Error(), "--via") || !strings.Contains(strings.ToLower(err.Error()), "host") {
			t.Fatalf("error %q does not name --via and the host key", err)
		}
		klog.Flush()
		if log := logs(); !strings.Contains(log, `"Listening; connecting to the SSH server"`) || strings.Contains(log, `"Serving"`) {
			t.Errorf("want Listening and no Serving in the log:\n%s", log)
		}
	})
}

// kubectl, through konnect proxy --via in front of a real kube-apiserver, prints konnect proxy's own
// answers: which hop is down (503), why a path is refused (400) and which filter rule refused exec (403),
// where for a plain-text body it printed only its generic sentence for the code ("the server is currently
// unable to handle the request"). A watch open when SSH drops ends.
func TestViaKubectlPrintsWhy(t *testing.T) {
	t.Setenv("SSH_AUTH_SOCK", "")
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_ed25519", "")
	sshd := harness.StartSSHD(t, pub)
	knownHosts := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(knownHosts, []byte(sshd.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ports := harness.FreePorts(t, 3)
	api := harness.StartAPIServer(t, harness.APIServerOptions{Bin: harness.E2ETool(t, "kube-apiserver"), Etcd: harness.E2ETool(t, "etcd"),
		Dir: filepath.Join(dir, "api"), Host: "127.0.0.1", Port: ports[0], EtcdPorts: [2]int{ports[1], ports[2]}})
	addr, stop := runCommand(t, "--kubeconfig", api.Kubeconfig, "--port=0", "--via", "root@127.0.0.1", "--ssh-port", strconv.Itoa(sshd.Port),
		"-i", key, "--known-hosts", knownHosts, "--ssh-config", "none", "--connect-timeout", "5s")
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	// One HOME for every run, so that kubectl's discovery cache is warm after the first, as it is for a user.
	home := t.TempDir()
	server := "http://" + addr
	if out, err := kubectl(t, home, "--server", server, "get", "namespaces"); err != nil || !strings.Contains(out, "kube-system") {
		t.Fatalf("kubectl get namespaces through konnect proxy --via: %v\n%s", err, out)
	}

	refused := "/api/v1/namespaces/default/services/http:foo:80/proxy/caf%C3%A9"
	want := fmt.Sprintf(`Error from server (BadRequest): konnect proxy: path %q holds a control character or a byte outside ASCII`, refused)
	if out, err := kubectl(t, home, "--server", server, "get", "--raw", refused); err == nil || !strings.Contains(out, want) {
		t.Errorf("kubectl get --raw %s: %v %q, want %q", refused, err, out, want)
	}
	// A pod to exec into: it stays Pending (nothing schedules it), which kubectl exec does not mind. No
	// controller-manager runs, so its ServiceAccount is created here.
	for _, args := range [][]string{{"create", "serviceaccount", "default"}, {"run", "web", "--image", "konnect.invalid/none", "--restart", "Never"}} {
		if out, err := kubectl(t, home, append([]string{"--server", server}, args...)...); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	want = `konnect proxy: the request filter refuses the path /api/v1/namespaces/default/pods/web/exec (--reject-paths)`
	if out, err := kubectl(t, home, "--server", server, "exec", "web", "--", "id"); err == nil || !strings.Contains(out, want) {
		t.Errorf("kubectl exec: %v %q, want %q", err, out, want)
	}

	// A watch open when SSH drops ends with it, and kubectl get -w then exits with status 0 and no message,
	// as through kubectl proxy: the proxy keeps its port, not the connections on it (README).
	path, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty-kubeconfig")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	watch := exec.Command(path, "--server", server, "get", "namespaces", "--watch")
	watch.Env = append(os.Environ(), "KUBECONFIG="+empty, "HOME="+home)
	var watchOut harness.SyncBuffer
	watch.Stdout, watch.Stderr = &watchOut, &watchOut
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	watchDone := make(chan error, 1)
	go func() { watchDone <- watch.Wait() }()
	t.Cleanup(func() {
		if watch.ProcessState == nil {
			_ = watch.Process.Kill()
			<-watchDone
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(watchOut.String(), "kube-system") {
		if time.Now().After(deadline) {
			t.Fatalf("kubectl get --watch printed no namespaces: %q", watchOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	sshd.Stop()
	t.Cleanup(sshd.Restart)
	select {
	case err := <-watchDone:
		if err != nil {
			t.Errorf("kubectl get --watch after the SSH connection dropped: %v, want exit status 0\n%s", err, watchOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("kubectl get --watch still runs 30s after the SSH connection dropped")
	}
	want = "Error from server (ServiceUnavailable): konnect proxy: SSH server root@" + sshd.Addr() + " is unreachable: "
	if out, err := kubectl(t, home, "--server", server, "get", "namespaces"); err == nil || !strings.Contains(out, want) {
		t.Errorf("kubectl get namespaces with the SSH server down: %v %q, want %q...", err, out, want)
	}
}

// statusMessage is the message of the Status that konnect proxy answers its own errors with.
func statusMessage(t *testing.T, body string) string {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Kind != "Status" {
		t.Errorf("not a Status (%v): %q", err, body)
	}
	return st.Message
}

// kubectl runs the installed kubectl with no kubeconfig of its own and home as HOME (its caches), and
// returns what it printed.
func kubectl(t *testing.T, home string, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is required: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	empty := filepath.Join(t.TempDir(), "empty-kubeconfig")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "KUBECONFIG="+empty, "HOME="+home)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
