package sshdial

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki/smallfile"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// TestKnownHostsLargerThanSmallFiles: a fleet's known_hosts may pass the bound on credential files; its
// hosts are still found, and a file past known_hosts' own bound is refused, naming it.
func TestKnownHostsLargerThanSmallFiles(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "known_hosts")
	// Other hosts' lines (comments here: the parser skips them as it skips any line of another host), then ours.
	filler := strings.Repeat("# "+strings.Repeat("x", 97)+"\n", smallfile.MaxSize/100+1000)
	line := knownhosts.Line([]string{"bastion.example.com"}, key) + "\n"
	if err := os.WriteFile(path, []byte(filler+line), 0o600); err != nil {
		t.Fatal(err)
	}
	// As a start checks it (UserKnownHostsFile), then as a connection reads it.
	if _, err := knownHostsFiles(path, nil, endpoint{}); err != nil {
		t.Fatalf("a known_hosts of %d bytes refused at start: %v", len(filler)+len(line), err)
	}
	k := &knownHosts{files: []string{path}}
	algos, err := k.algorithms("bastion.example.com:22")
	if err != nil || len(algos) != 1 || algos[0] != ssh.KeyAlgoED25519 {
		t.Fatalf("a known_hosts of %d bytes: algorithms %v, %v; want [%s]", len(filler)+len(line), algos, err, ssh.KeyAlgoED25519)
	}

	if err := os.Truncate(path, maxKnownHostsSize+1); err != nil { // sparse
		t.Fatal(err)
	}
	if _, err := k.algorithms("bastion.example.com:22"); !errors.Is(err, smallfile.ErrTooLarge) || !strings.Contains(err.Error(), path) {
		t.Fatalf("a known_hosts past %d bytes: %v, want an error naming it", maxKnownHostsSize, err)
	}
}
