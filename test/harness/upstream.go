package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// upstreamPkgs are upstream apiserver-network-proxy's binaries, at the version go.mod pins.
var upstreamPkgs = map[string]string{
	"proxy-server": "sigs.k8s.io/apiserver-network-proxy/cmd/server",
	"proxy-agent":  "sigs.k8s.io/apiserver-network-proxy/cmd/agent",
}

var (
	upstreamMu    sync.Mutex
	upstreamDir   string
	upstreamBuilt = map[string]error{}
)

// UpstreamBinary returns the path of upstream's proxy-server or proxy-agent, built from the module cache
// once per test binary. KONNECT_UPSTREAM_BIN may name a directory that already has them. The tests that
// ask for them are about interoperating with upstream, so a failed build fails the test: it never skips.
func UpstreamBinary(t testing.TB, name string) string {
	t.Helper()
	if d := os.Getenv("KONNECT_UPSTREAM_BIN"); d != "" {
		return filepath.Join(d, name)
	}
	upstreamMu.Lock()
	defer upstreamMu.Unlock()
	if upstreamDir == "" {
		dir, err := os.MkdirTemp("", "konnect-upstream-bin-")
		if err != nil {
			t.Fatal(err)
		}
		upstreamDir = dir
	}
	bin := filepath.Join(upstreamDir, name)
	err, done := upstreamBuilt[name]
	if !done {
		if out, berr := exec.Command("go", "build", "-o", bin, upstreamPkgs[name]).CombinedOutput(); berr != nil {
			err = fmt.Errorf("build upstream %s: %v\n%s", name, berr, out)
		}
		upstreamBuilt[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// RemoveUpstreamBinaries deletes what UpstreamBinary built; TestMain calls it after m.Run.
func RemoveUpstreamBinaries() {
	upstreamMu.Lock()
	defer upstreamMu.Unlock()
	if upstreamDir != "" {
		os.RemoveAll(upstreamDir)
	}
}
