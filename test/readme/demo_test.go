//go:build integration

package readme

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// demoPorts are hack/demo.sh's port overrides.
var demoPorts = []string{"DEMO_AGENT_PORT", "DEMO_SERVER_ADMIN_PORT", "DEMO_SERVER_HEALTH_PORT", "DEMO_AGENT_HEALTH_PORT", "DEMO_AGENT_ADMIN_PORT"}

func runDemo(t *testing.T, env []string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(repoRoot, "hack", "demo.sh"))
	cmd.Env = cleanEnv(t, t.TempDir(), env...)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			cmd.Process.Kill()
		}
	}()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestDemo runs make demo's script with a konnect built from this tree, on ports of its own (through the
// overrides it names), and then the commands it suggests trying next.
func TestDemo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	env := []string{"KONNECT=" + konnectBin, "DEMO_DIR=" + dir}
	for i, p := range harness.FreePorts(t, len(demoPorts)) {
		env = append(env, fmt.Sprintf("%s=%d", demoPorts[i], p))
	}
	out, err := runDemo(t, env)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"OK dial 127.0.0.1:", "HTTP/1.1 200 OK", "agent exited with status 0", "server exited with status 0",
		"demo complete", "what to try next"} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output has no %q:\n%s", want, out)
		}
	}
	// What it suggests must work: each konnect command it prints runs.
	_, next, _ := strings.Cut(out, "what to try next")
	tried := 0
	for _, line := range strings.Split(next, "\n") {
		args := strings.Fields(line)
		if len(args) == 0 || args[0] != konnectBin {
			continue
		}
		cmd := exec.Command(konnectBin, args[1:]...)
		cmd.Env = cleanEnv(t, t.TempDir())
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("the demo suggests %q, which fails: %v\n%s", line, err, b)
		}
		tried++
	}
	if tried < 2 {
		t.Errorf("the demo suggests %d konnect commands to try next:\n%s", tried, next)
	}
}

// A port that is taken stops the demo before anything is built, with the override that moves it.
func TestDemoNamesThePortOverride(t *testing.T) {
	for _, v := range demoPorts {
		t.Run(v, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
			env := []string{v + "=" + port, "KONNECT=/nonexistent/konnect", "DEMO_DIR=" + filepath.Join(t.TempDir(), "demo")}
			// The other ports are free ones, so that only this one is taken.
			for i, p := range harness.FreePorts(t, len(demoPorts)) {
				if demoPorts[i] != v {
					env = append(env, fmt.Sprintf("%s=%d", demoPorts[i], p))
				}
			}
			out, err := runDemo(t, env)
			if err == nil {
				t.Fatalf("the demo ran with port %s taken:\n%s", port, out)
			}
			if !strings.Contains(out, "port "+port+" on 127.0.0.1 is taken") || !strings.Contains(out, "set "+v+" to a free port") {
				t.Errorf("with %s=%s taken, the demo says:\n%s", v, port, out)
			}
			if strings.Contains(out, "konnect init") || strings.Contains(out, "demo failed") {
				t.Errorf("the demo went on after finding the port taken:\n%s", out)
			}
		})
	}
}

// Without KONNECT, the demo builds bin/konnect, and first says what it builds and roughly how long that
// takes. A stand-in for go that names two packages and fails stops it there.
func TestDemoSaysWhatItBuilds(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "go")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho example.com/a >&2\necho example.com/b >&2\necho 'x.go:1:1: syntax error' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"GO=" + fake, "DEMO_DIR=" + filepath.Join(t.TempDir(), "demo")}
	for i, p := range harness.FreePorts(t, len(demoPorts)) {
		env = append(env, fmt.Sprintf("%s=%d", demoPorts[i], p))
	}
	out, err := runDemo(t, env)
	if err == nil {
		t.Fatalf("the demo went on after a failed build:\n%s", out)
	}
	for _, want := range []string{"building bin/konnect", "about 780 packages", "about 3 minutes", "2 packages compiled", "x.go:1:1: syntax error"} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's build step does not say %q:\n%s", want, out)
		}
	}
	if i, j := strings.Index(out, "about 3 minutes"), strings.Index(out, "2 packages compiled"); i > j {
		t.Errorf("the demo says how long the build takes only after it:\n%s", out)
	}
}
