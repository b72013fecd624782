package kubeconfigcmd

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// TestKubeconfigLock: the lock is kubectl's NAME.lock; a second holder waits and is told who holds it; an
// empty lock (kubectl's) is waited for and then named in the error, never removed; a lock of konnect's
// whose process is gone is taken over; nothing is left after release.
func TestKubeconfigLock(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "config")

	release, err := lockKubeconfig([]string{kc}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(kc + ".lock"); err != nil || string(b) != lockMarker+strconv.Itoa(os.Getpid())+"\n" {
		t.Fatalf("lock file: %q %v", b, err)
	}
	var told []string
	t0 := time.Now()
	_, err = lockKubeconfig([]string{kc}, 300*time.Millisecond, func(lock, holder string) { told = append(told, lock+" "+holder) })
	if err == nil || time.Since(t0) < 300*time.Millisecond {
		t.Fatalf("a second holder: %v after %s, want an error after the wait", err, time.Since(t0))
	}
	want := "konnect (pid " + strconv.Itoa(os.Getpid()) + ")"
	if len(told) != 1 || told[0] != kc+".lock "+want || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), kc+".lock") {
		t.Fatalf("told %q, error %v; want one call and an error naming %s and %s", told, err, kc+".lock", want)
	}
	release()
	if _, err := os.Lstat(kc + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lock is left after release: %v", err)
	}

	// Waiting ends when the holder lets go.
	release, _ = lockKubeconfig([]string{kc}, time.Second, nil)
	go func() { time.Sleep(100 * time.Millisecond); release() }()
	if r, err := lockKubeconfig([]string{kc}, 5*time.Second, nil); err != nil {
		t.Fatalf("after the holder let go: %v", err)
	} else {
		r()
	}

	// kubectl's lock is empty: it is waited for, named, and left in place.
	if err := os.WriteFile(kc+".lock", nil, 0); err != nil {
		t.Fatal(err)
	}
	_, err = lockKubeconfig([]string{kc}, 100*time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "kubectl") || !strings.Contains(err.Error(), "remove "+kc+".lock") {
		t.Fatalf("kubectl's lock: %v", err)
	}
	if _, err := os.Lstat(kc + ".lock"); err != nil {
		t.Fatalf("kubectl's lock was removed: %v", err)
	}
	os.Remove(kc + ".lock")

	// A lock of konnect's that no process holds any more: a killed run's.
	if err := os.WriteFile(kc+".lock", []byte(lockMarker+"999999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := lockKubeconfig([]string{kc}, 100*time.Millisecond, nil); err != nil {
		t.Fatalf("a stale lock of konnect's was not taken over: %v", err)
	} else {
		r()
	}

	// A symlink in the lock's place is not followed.
	target := filepath.Join(dir, "elsewhere")
	if err := os.Symlink(target, kc+".lock"); err != nil {
		t.Fatal(err)
	}
	if _, err := lockKubeconfig([]string{kc}, 100*time.Millisecond, nil); err == nil {
		t.Fatal("a symlink in the lock's place was taken as the lock")
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the symlink was followed: %v", err)
	}
}

// Several set-proxy runs at once, each on its own cluster, all keep their change.
func TestKubeconfigSetProxyConcurrent(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "config")
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Config\nclusters:\n")
	const n = 8
	for i := range n {
		b.WriteString("- name: c" + strconv.Itoa(i) + "\n  cluster:\n    server: https://198.18.0.1:6443\n")
	}
	b.WriteString("contexts:\n")
	for i := range n {
		b.WriteString("- name: c" + strconv.Itoa(i) + "\n  context:\n    cluster: c" + strconv.Itoa(i) + "\n")
	}
	if err := os.WriteFile(kc, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &SetProxyOptions{Kubeconfig: kc, Context: "c" + strconv.Itoa(i), ProxyURL: "socks5://127.0.0.1:" + strconv.Itoa(1080+i)}
			if err := o.Run(io.Discard, io.Discard); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if got, want := cfg.Clusters["c"+strconv.Itoa(i)].ProxyURL, "socks5://127.0.0.1:"+strconv.Itoa(1080+i); got != want {
			t.Errorf("cluster c%d: proxy-url %q, want %q", i, got, want)
		}
	}
}
