//go:build integration

package readme

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var (
	// repoRoot is the repository this package is in.
	repoRoot string
	// konnectBin is bin/konnect built from this tree, as make build builds it (without the version stamp).
	konnectBin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = root
	dir, err := os.MkdirTemp("", "kn-readme-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	konnectBin = filepath.Join(dir, "konnect")
	build := exec.Command("go", "build", "-o", konnectBin, "./cmd/konnect")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build konnect: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// goEnv is the go command's settings that live under HOME (GOENV, the module and build caches): the demo's
// go build, run with a HOME of its own, must still find them.
var goEnvKeys = []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOFLAGS", "GOTOOLCHAIN", "GOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE"}

// cleanEnv is the environment for the README's commands and the demo: no proxy (every address is loopback),
// no kubeconfig of the machine's, a home of their own, and the go command's settings.
func cleanEnv(t *testing.T, home string, extra ...string) []string {
	t.Helper()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8", "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"}
	if v, ok := os.LookupEnv("TMPDIR"); ok {
		env = append(env, "TMPDIR="+v)
	}
	out, err := exec.Command("go", append([]string{"env"}, goEnvKeys...)...).Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	for i, v := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if i < len(goEnvKeys) {
			env = append(env, goEnvKeys[i]+"="+v)
		}
	}
	return append(env, extra...)
}
