package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// EnvKonnect names a konnect binary to test instead of building one.
const EnvKonnect = "KONNECT_BIN"

// KonnectBinary returns the konnect binary under test: $KONNECT_BIN when set, otherwise dir/konnect, built
// as `make build` builds it, so that it carries the Makefile's VERSION (konnect init's default --image is
// the image `make image` tags with that VERSION).
func KonnectBinary(dir string) (string, error) {
	if p := os.Getenv(EnvKonnect); p != "" {
		return filepath.Abs(p)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "konnect")
	cmd := exec.Command("make", "-s", "build", "BIN="+bin)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make build: %w\n%s", err, out)
	}
	return bin, nil
}

// RepoRoot returns the directory of konnect's go.mod.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		wd, _ := os.Getwd()
		return "", fmt.Errorf("cannot find the konnect module root from %s", wd)
	}
	return filepath.Dir(mod), nil
}
