//go:build integration

package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestArchitectureFloors runs the checks of docs/architecture.md's "Floors": each line must print nothing,
// so that the page's claims about imports (no package imports cmd; socks, socks/sshdial and batchtls import
// no Kubernetes code) fail here the day they stop being true.
func TestArchitectureFloors(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Floors\n")
	if !ok {
		t.Fatal("docs/architecture.md has no section Floors")
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("the section Floors has no sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	lines := strings.Split(strings.TrimSpace(block), "\n")
	if len(lines) < 4 {
		t.Fatalf("the section Floors has %d checks, want 4", len(lines))
	}
	for _, line := range lines {
		cmd := exec.Command("bash", "-c", line)
		cmd.Dir = repoRoot
		out, _ := cmd.CombinedOutput() // grep exits 1 when it finds nothing, which is the point
		if len(out) > 0 {
			t.Errorf("%s\nprinted:\n%s", line, out)
		}
	}
}
