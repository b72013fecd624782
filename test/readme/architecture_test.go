//go:build integration

package readme

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// floor is one import rule of docs/architecture.md's "Floors", as the shell line `list | filter`: list names
// packages and their dependencies, filter keeps those the rule forbids, and the rule holds when it keeps none.
type floor struct{ list, filter string }

func (f floor) String() string { return f.list + " | " + f.filter }

// impliedFloors are the rules the section states in prose without a line of its own.
var impliedFloors = []floor{
	// "no package imports cmd": cmd/internal is closed to the rest by Go's internal rule and cmd/konnect is a
	// main package, but a new package under cmd would be open to all. Test packages count too.
	{list: `go list -deps -test $(go list ./... | grep -v '/konnect/cmd/')`, filter: `grep 'konnect/cmd/'`},
}

// TestArchitectureFloors runs the checks of docs/architecture.md's "Floors", each line of its sh block and
// the rules its prose states ("no package imports cmd"): each must print nothing, so that the page's claims
// about imports (pki, egress and socks import nothing above them; socks, socks/sshdial and batchtls import no
// Kubernetes code) fail here the day they stop being true. A check that cannot fail proves nothing: each
// filter must find something in the dependencies of the whole module, and each list must run cleanly.
func TestArchitectureFloors(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Floors\n")
	if !ok {
		t.Fatal("docs/architecture.md has no section Floors")
	}
	prose, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("the section Floors has no sh block")
	}
	if !strings.Contains(prose, "no package imports `cmd`") {
		t.Errorf("the section Floors no longer says that no package imports cmd; update impliedFloors:\n%s", prose)
	}
	block, _, _ = strings.Cut(block, "```")
	lines := strings.Split(strings.TrimSpace(block), "\n")
	if len(lines) < 4 {
		t.Fatalf("the section Floors has %d checks, want 4", len(lines))
	}
	var floors []floor
	for _, line := range lines {
		list, filter, ok := strings.Cut(line, "| grep ")
		list, filter = strings.TrimSpace(list), "grep "+strings.TrimSpace(filter)
		if !ok || !strings.HasPrefix(list, "go list -deps ") || strings.Contains(list, "|") {
			t.Errorf("%q is not of the form `go list -deps PACKAGES | grep PATTERN`", line)
			continue
		}
		floors = append(floors, floor{list, filter})
	}
	for _, f := range append(floors, impliedFloors...) {
		// grep exits 1 when it finds nothing, which is the point; with pipefail a failing go list is seen too.
		out, code := shell(t, f.String())
		if len(out) > 0 || code != 1 {
			t.Errorf("%s\nexit %d, printed:\n%s", f, code, out)
		}
		if out, _ := shell(t, "go list -deps ./... | "+f.filter); len(out) == 0 {
			t.Errorf("%s can never fail: %q matches none of the module's packages and dependencies", f, f.filter)
		}
	}
}

// shell runs line with bash in the repository and returns its output and exit code.
func shell(t *testing.T, line string) (string, int) {
	t.Helper()
	cmd := exec.Command("bash", "-o", "pipefail", "-c", line)
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("%s: %v", line, err)
	return "", 0
}
