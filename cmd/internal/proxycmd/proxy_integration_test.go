//go:build integration

package proxycmd

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The same check against the kubectl installed on this machine, from its own help text.
func TestFlagsMatchInstalledKubectl(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed")
	}
	out, err := exec.Command(kubectl, "proxy", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl proxy --help: %v\n%s", err, out)
	}
	// Lines look like "    -p, --port=8001:" and "    --accept-paths='^.*':".
	re := regexp.MustCompile(`(?m)^\s+(?:-(\w), )?--([\w-]+)=(.*):$`)
	matches := re.FindAllStringSubmatch(string(out), -1)
	if len(matches) < 10 {
		t.Fatalf("found only %d flags in kubectl's help; has its format changed?\n%s", len(matches), out)
	}
	fs := NewProxyCommand().Flags()
	for _, m := range matches {
		short, name, def := m[1], m[2], strings.Trim(m[3], "'")
		got := fs.Lookup(name)
		if got == nil {
			t.Errorf("kubectl has --%s; konnect proxy does not", name)
			continue
		}
		if got.Shorthand != short || got.DefValue != kubectlDefault(name, def) {
			t.Errorf("--%s: konnect -%s default %q; kubectl -%s default %q", name, got.Shorthand, got.DefValue, short, def)
		}
	}
}

// kubectl and curl, the clients people point at kubectl proxy, work through konnect proxy.
func TestCommandWithKubectlAndCurl(t *testing.T) {
	b := newBackend(t)
	addr, stop := runCommand(t, "--kubeconfig", b.kubeconfig(t, "token"), "--port=0")
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	run := func(name string, args ...string) string {
		t.Helper()
		path, err := exec.LookPath(name)
		if err != nil {
			t.Skipf("%s is not installed", name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, path, args...)
		// kubectl must not find a kubeconfig of its own: the proxy holds the credentials.
		empty := filepath.Join(t.TempDir(), "empty-kubeconfig")
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(os.Environ(), "KUBECONFIG="+empty, "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	if out := run("kubectl", "--server", "http://"+addr, "get", "--raw", "/api"); !strings.Contains(out, `"path":"/api"`) {
		t.Errorf("kubectl get --raw /api through the proxy: %q", out)
	}
	if out := run("curl", "-sS", "http://"+addr+"/api"); !strings.Contains(out, `"kind":"APIVersions"`) {
		t.Errorf("curl /api: %q", out)
	}
	if out := run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: evil.example", "http://"+addr+"/api"); out != "403" {
		t.Errorf("curl with Host: evil.example got %q, want 403", out)
	}
	if out := run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "http://"+addr+"/api/v1/namespaces/default/pods/web/exec?command=id"); out != "403" {
		t.Errorf("curl POST exec got %q, want 403", out)
	}
}
