//go:build integration

package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// kubeconfigWithClusters is a kubeconfig with n clusters c0..c(n-1), each with a context of its name. Their
// servers are never dialled.
func kubeconfigWithClusters(n int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Config\nclusters:\n")
	for i := range n {
		fmt.Fprintf(&b, "- name: c%d\n  cluster:\n    server: https://198.18.0.%d:6443\n", i, i+1)
	}
	b.WriteString("contexts:\n")
	for i := range n {
		fmt.Fprintf(&b, "- name: c%d\n  context:\n    cluster: c%d\n    user: u\n", i, i)
	}
	b.WriteString("users:\n- name: u\n  user:\n    token: not-a-real-token\ncurrent-context: c0\n")
	return b.String()
}

func proxyURLs(t *testing.T, kubeconfig string) map[string]string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatalf("%s no longer loads: %v", kubeconfig, err)
	}
	out := map[string]string{}
	for name, c := range cfg.Clusters {
		out[name] = c.ProxyURL
	}
	return out
}

// TestKubeconfigSetProxyConcurrent runs `konnect kubeconfig set-proxy` several times at once on one
// kubeconfig, each on its own cluster: every run exits 0 and has its change in the file at the end. Without a
// lock, two runs that read the file before either wrote it each wrote back what they had read, with only
// their own change. Then the same with `kubectl config set` of other clusters at the same time: set-proxy
// waits for kubectl's lock and kubectl, which does not wait, fails naming it. kubectl itself reads the file
// before it takes the lock and writes back every cluster that changed since, as it read it: it loses updates
// even between two kubectl runs, so those rounds check no change but that nothing is left or torn. kubectl
// also writes in place: a kubectl that reads the file while another truncated it writes back a kubeconfig of
// its one change alone, without the contexts, and a set-proxy that comes after it then rightly finds no
// context of its name; in those rounds that refusal, and only that one, is kubectl's doing.
func TestKubeconfigSetProxyConcurrent(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl is needed, as the other program that changes kubeconfigs: ", err)
	}
	const rounds, runs = 6, 8
	lost, kubectlFailed, kubectlLost, kubectlEmptied := 0, 0, 0, 0
	for round := range rounds {
		withKubectl := round >= rounds/2
		kc := filepath.Join(shortDir(t), "config")
		writeFile(t, kc, kubeconfigWithClusters(2*runs))
		var wg sync.WaitGroup
		results := make([]result, runs)
		kubectlErrs := make([]error, runs)
		kubectlOut := make([][]byte, runs)
		for i := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = konnect(t, time.Minute, "kubeconfig", "set-proxy", "--kubeconfig", kc,
					"--context", fmt.Sprintf("c%d", i), "--proxy-url", fmt.Sprintf("socks5://127.0.0.1:%d", 1080+i))
			}()
			if !withKubectl {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(kubectl, "config", "set", fmt.Sprintf("clusters.c%d.proxy-url", runs+i), fmt.Sprintf("http://127.0.0.1:%d", 3128+i))
				cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
				kubectlOut[i], kubectlErrs[i] = cmd.CombinedOutput()
			}()
		}
		wg.Wait()
		got := proxyURLs(t, kc) // fails the test if the file does not load
		for i, r := range results {
			emptied := fmt.Sprintf("context \"c%d\" not found in %s (contexts: )", i, kc)
			if r.code != 0 && withKubectl && strings.Contains(r.stderr, emptied) {
				kubectlEmptied++
				continue
			}
			if r.code != 0 {
				t.Errorf("round %d: run %d: %s", round, i, r)
				continue
			}
			if want := fmt.Sprintf("socks5://127.0.0.1:%d", 1080+i); got[fmt.Sprintf("c%d", i)] != want && !withKubectl {
				lost++
				t.Errorf("round %d: run %d exited 0, but cluster c%d has proxy-url %q, want %q: another run overwrote it", round, i, i, got[fmt.Sprintf("c%d", i)], want)
			}
		}
		for i, err := range kubectlErrs {
			if !withKubectl {
				break
			}
			if err != nil {
				kubectlFailed++
				if !strings.Contains(string(kubectlOut[i]), kc+".lock") {
					t.Errorf("round %d: kubectl %d failed without naming the lock: %v\n%s", round, i, err, kubectlOut[i])
				}
			} else if got[fmt.Sprintf("c%d", runs+i)] == "" {
				kubectlLost++
			}
		}
		if _, err := os.Lstat(kc + ".lock"); err == nil {
			t.Errorf("round %d: %s.lock is left behind", round, kc)
		}
	}
	t.Logf("set-proxy alone: %d of %d updates lost; with kubectl: %d kubectl runs refused by the lock, %d kubectl updates lost (by kubectl's own stale writes), %d set-proxy runs that found a kubeconfig kubectl had emptied of contexts",
		lost, rounds/2*runs, kubectlFailed, kubectlLost, kubectlEmptied)
}

// TestKubeconfigSetProxyTakesTurnsWithKubectl holds `kubectl config set` inside its lock, deterministically:
// one file of its KUBECONFIG is a FIFO, which kubectl reads once more after it has created config.lock, and
// which the test answers only when set-proxy has shown that it waits. set-proxy then finishes after kubectl,
// and the file has both changes, although both changed the same cluster. Without the lock, set-proxy wrote
// at once, and kubectl then wrote back the cluster as it had read it before, without the proxy-url.
func TestKubeconfigSetProxyTakesTurnsWithKubectl(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl is needed, as the other program that changes kubeconfigs: ", err)
	}
	dir := shortDir(t)
	kc, fifo := filepath.Join(dir, "config"), filepath.Join(dir, "extra")
	writeFile(t, kc, kubeconfigWithClusters(1))
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kcmd := exec.CommandContext(ctx, kubectl, "config", "set", "clusters.c0.server", "https://198.18.0.99:6443")
	kcmd.Env = append(os.Environ(), "KUBECONFIG="+kc+":"+fifo)
	var kout bytes.Buffer
	kcmd.Stdout, kcmd.Stderr = &kout, &kout
	if err := kcmd.Start(); err != nil {
		t.Fatal(err)
	}
	kdone := make(chan error, 1)
	go func() { kdone <- kcmd.Wait() }()

	// feed answers kubectl's next read of the FIFO: it waits until kubectl opens it, and reports whether
	// kubectl held its lock by then; only then does it write (nothing: an empty kubeconfig) and close.
	openFIFO := func() (*os.File, bool) {
		for ctx.Err() == nil {
			f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
			if err == nil {
				_, lerr := os.Lstat(kc + ".lock")
				return f, lerr == nil
			}
			if !errors.Is(err, syscall.ENXIO) {
				t.Fatal(err)
			}
			select {
			case err := <-kdone:
				t.Fatalf("kubectl ended before it took its lock: %v\n%s", err, kout.String())
			case <-time.After(5 * time.Millisecond):
			}
		}
		t.Fatal("kubectl never read its KUBECONFIG")
		return nil, false
	}
	// Until kubectl holds its lock, each read gets an empty file. A reader found before the lock exists may
	// be one that has had its answer and not yet closed the FIFO: closing again answers nobody, or the next
	// read. The lock is created after the reads before it are closed, so a reader found while it exists is
	// kubectl inside its lock.
	var held *os.File
	for held == nil {
		f, locked := openFIFO()
		if locked {
			held = f
			break
		}
		f.Close()
		time.Sleep(time.Millisecond)
	}

	// kubectl holds config.lock and waits for the FIFO. set-proxy must wait for it.
	scmd := exec.CommandContext(ctx, konnectBin, "kubeconfig", "set-proxy", "--kubeconfig", kc, "--context", "c0", "--proxy-url", "socks5://127.0.0.1:1080")
	scmd.Env = append(os.Environ(), konnectEnv...)
	var sout syncBuf
	scmd.Stdout, scmd.Stderr = &sout, &sout
	if err := scmd.Start(); err != nil {
		t.Fatal(err)
	}
	sdone := make(chan error, 1)
	go func() { sdone <- scmd.Wait() }()
	for !strings.Contains(sout.String(), "Waiting for") {
		select {
		case err := <-sdone:
			held.Close()
			<-kdone
			t.Fatalf("set-proxy finished (%v) while kubectl held %s.lock:\n%s\nfile afterwards:\n%s", err, kc, sout.String(), readFile(t, kc))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !strings.Contains(sout.String(), kc+".lock") {
		t.Errorf("the waiting message does not name the lock: %s", sout.String())
	}
	held.Close() // kubectl reads an empty file, writes its change and removes its lock
	if err := <-kdone; err != nil {
		t.Fatalf("kubectl: %v\n%s", err, kout.String())
	}
	if err := <-sdone; err != nil {
		t.Fatalf("set-proxy: %v\n%s", err, sout.String())
	}
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.Clusters["c0"]; c.Server != "https://198.18.0.99:6443" || c.ProxyURL != "socks5://127.0.0.1:1080" {
		t.Errorf("cluster c0 has server %q and proxy-url %q; want kubectl's server and set-proxy's proxy-url\n%s", c.Server, c.ProxyURL, readFile(t, kc))
	}
	if _, err := os.Lstat(kc + ".lock"); err == nil {
		t.Errorf("%s.lock is left behind", kc)
	}
}

// TestKubeconfigSetProxyRefusesForeignLink: a kubeconfig that is a symlink another user owns, or that leads
// through one, is refused, naming the file, and the file it leads to is not changed; set-proxy used to
// resolve the link itself and write through it. A link of one's own is still written through.
func TestKubeconfigSetProxyRefusesForeignLink(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name string
		// plant returns the path to give --kubeconfig, and what the refusal must name besides it.
		plant func(t *testing.T, home, victim string) (string, []string)
	}{
		{"another user's link", func(t *testing.T, home, victim string) (string, []string) {
			link := foreignLink(t, victim, filepath.Join(home, "config"))
			return link, []string{"symlink " + link + " belongs to uid 65534"}
		}},
		{"our link to another user's link", func(t *testing.T, home, victim string) (string, []string) {
			theirs := foreignLink(t, victim, filepath.Join(home, "theirs"))
			link := filepath.Join(home, "config")
			if err := os.Symlink(theirs, link); err != nil {
				t.Fatal(err)
			}
			return link, []string{"symlink " + theirs + " belongs to uid 65534"}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			home := shortDir(t)
			victim := filepath.Join(shortDir(t), "victim")
			writeFile(t, victim, testKubeconfig)
			kc, want := c.plant(t, home, victim)
			before := snapshot(t, filepath.Dir(victim))
			r := konnect(t, time.Minute, "kubeconfig", "set-proxy", "--kubeconfig", kc, "--context", "dev", "--proxy-url", "socks5://127.0.0.1:1080")
			checkRefused(t, r, append(want, "--kubeconfig", kc), "")
			if d := diffSnapshots(before, snapshot(t, filepath.Dir(victim))); len(d) > 0 {
				t.Errorf("the refused set-proxy changed %v", d)
			}
		})
	}
	t.Run("our own link", func(t *testing.T) {
		home, dotfiles := shortDir(t), shortDir(t)
		target := filepath.Join(dotfiles, "kubeconfig")
		writeFile(t, target, testKubeconfig)
		link := filepath.Join(home, "config")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if r := konnect(t, time.Minute, "kubeconfig", "set-proxy", "--kubeconfig", link, "--context", "dev", "--proxy-url", "socks5://127.0.0.1:1080"); r.code != 0 {
			t.Fatalf("%s", r)
		}
		if got := proxyURLs(t, target)["dev"]; got != "socks5://127.0.0.1:1080" {
			t.Errorf("the file the link leads to has proxy-url %q", got)
		}
	})
}

// foreignLink makes link, a symlink to target that another user owns.
func foreignLink(t *testing.T, target, link string) string {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, otherUID, otherUID); err != nil {
		t.Fatal(err)
	}
	return link
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// syncBuf is a bytes.Buffer that a process's output and the test may use at once.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
