//go:build integration

package reliability

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"k8s.io/klog/v2"
)

// konnectBin is the binary under test, built once by TestMain; runDir holds what the whole run shares
// and is removed at its end.
var konnectBin, runDir string

// konnectEnv keeps the host's kubeconfig and ssh-agent away from konnect under test.
var konnectEnv = []string{"KUBECONFIG=/nonexistent/kubeconfig", "SSH_AUTH_SOCK="}

func TestMain(m *testing.M) {
	flag.Parse()
	// konnectivity-client logs every cancelled stream through klog; the figures matter here, not that.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reliability:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	tmp, err := os.MkdirTemp("", "konnect-reliability-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	runDir = tmp
	if konnectBin, err = harness.KonnectBinary(tmp); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// result is what one finished konnect command left behind.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("konnect %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// konnect runs the binary to completion (bounded by timeout) and returns its output and exit code.
func konnect(t testing.TB, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, konnectBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), konnectEnv...)
	err := cmd.Run()
	r := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	default:
		t.Fatalf("konnect %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("konnect %s did not finish within %s\n%s", strings.Join(args, " "), timeout, r)
	}
	return r
}

// startKonnect starts a konnect daemon, logging to the test's temporary directory. It is killed when the
// test ends if it still runs.
func startKonnect(t testing.TB, name string, args ...string) *harness.Proc {
	t.Helper()
	return harness.Start(t, t.TempDir(), name, konnectEnv, konnectBin, args...)
}

// httpOK reports nil when GET url answers 200.
func httpOK(url string) error {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// fileState is one entry of a directory snapshot.
type fileState struct {
	mode fs.FileMode
	sum  string
}

// snapshot records every file and directory under dir with its mode and content checksum.
func snapshot(t testing.TB, dir string) map[string]fileState {
	t.Helper()
	snap := map[string]fileState{}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return snap // a run killed before it created the directory
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		st := fileState{mode: info.Mode()}
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			st.sum = hex.EncodeToString(sum[:])
		}
		snap[rel] = st
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return snap
}

// diffSnapshots lists what differs between two snapshots.
func diffSnapshots(before, after map[string]fileState) []string {
	var diffs []string
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			diffs = append(diffs, "removed "+p)
		case a.mode != b.mode:
			diffs = append(diffs, fmt.Sprintf("mode of %s changed %v -> %v", p, b.mode, a.mode))
		case a.sum != b.sum:
			diffs = append(diffs, "content of "+p+" changed")
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			diffs = append(diffs, "created "+p)
		}
	}
	sort.Strings(diffs)
	return diffs
}

// requireRoot fails (never skips) a test that needs root: the suite is meant to run as root in CI.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (mounts, read-only bind mounts); run the suite as root")
	}
}

// shortDir is a temporary directory with a short path: unix socket paths may not exceed 107 bytes, and
// t.TempDir's names are long.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
