package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The example in konnect server --help uses the files konnect init writes, so that it runs as printed on a
// node that init set up: every path it names under /etc/kubernetes exists after init there.
func TestServerExampleNamesInitsFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "k")
	if _, _, err := konnect(t, "init", "--dir", dir, "--control-plane-address", "127.0.0.1", "--apiserver-url", "https://127.0.0.1:6443",
		"--agent-auth", "mtls", "--key-algorithm", "ecdsa-p256"); err != nil {
		t.Fatal(err)
	}
	root, err := newRootCommand()
	if err != nil {
		t.Fatal(err)
	}
	server, _, err := root.Find([]string{"server"})
	if err != nil {
		t.Fatal(err)
	}
	paths := regexp.MustCompile(`=(/etc/kubernetes/[^ \\\n]+)`).FindAllStringSubmatch(server.Example, -1)
	if len(paths) < 4 {
		t.Fatalf("the example names %d files under /etc/kubernetes, want the certificate, key, kubeconfig and socket:\n%s", len(paths), server.Example)
	}
	for _, m := range paths {
		p := filepath.Join(dir, strings.TrimPrefix(m[1], "/etc/kubernetes/"))
		if strings.HasSuffix(p, ".socket") {
			continue // the server creates it
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("konnect server --help names %s, which konnect init does not write: %v", m[1], err)
		}
	}
}
