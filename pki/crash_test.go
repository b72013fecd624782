package pki

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const crashChildEnv = "KONNECT_PKI_CRASH_CHILD"

// crashChild runs in a child process that the test kills with SIGKILL at a random moment.
func crashChild(dir string) {
	cfg := Config{Dir: dir, ControlPlaneAddresses: []string{"198.18.0.1"}, AgentMTLS: true, FrontendTLS: true, KeyAlgorithm: ECDSAP256}
	if _, err := Ensure(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestKillDuringEnsure kills konnect's certificate generation at random moments and checks that what is
// left on disk never holds a certificate whose key is lost or torn, and that the next run repairs it.
func TestKillDuringEnsure(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := func(dir string) *exec.Cmd {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	// How long one complete run takes, startup included, bounds the kill delays.
	t0 := time.Now()
	if err := start(t.TempDir()).Wait(); err != nil {
		t.Fatal(err)
	}
	full := time.Since(t0)

	const runs = 25
	deadline := time.Now().Add(60 * time.Second)
	sawPartial := 0
	for i := 0; i < runs && time.Now().Before(deadline); i++ {
		dir := t.TempDir()
		cmd := start(dir)
		time.Sleep(time.Duration(rand.Int64N(int64(full))))
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()

		pki := filepath.Join(dir, PKISubdir)
		certs, _ := filepath.Glob(filepath.Join(pki, "*.crt"))
		if n := len(certs); n > 0 && n < len(Specs()) {
			sawPartial++
		}
		for _, c := range certs {
			cert, _, err := readCert(c)
			if err != nil {
				t.Fatalf("run %d: torn certificate: %v", i, err)
			}
			key, _, err := readKey(strings.TrimSuffix(c, ".crt") + ".key")
			if err != nil {
				t.Fatalf("run %d: certificate %s without a usable key: %v", i, c, err)
			}
			if !samePublicKey(cert.PublicKey, key.Public()) {
				t.Fatalf("run %d: %s does not match its key", i, c)
			}
		}

		cfg := Config{Dir: dir, ControlPlaneAddresses: []string{"198.18.0.1"}, AgentMTLS: true, FrontendTLS: true, KeyAlgorithm: ECDSAP256}
		// Whatever the kill left, including a CA key whose certificate was never written, the rerun completes.
		if _, err := Ensure(cfg); err != nil {
			t.Fatalf("run %d: rerun after kill: %v", i, err)
		}
		for _, r := range mustEnsure(t, cfg) {
			if r.Action != Kept {
				t.Fatalf("run %d: third run %s %s", i, r.Name, r.Action)
			}
		}
		if tmp, _ := filepath.Glob(filepath.Join(pki, ".*.tmp-*")); len(tmp) > 0 {
			t.Fatalf("run %d: temporary files left after the repair run: %v", i, tmp)
		}
	}
	t.Logf("%d of %d kills left a partial set of certificates (full run %v)", sawPartial, runs, full)
}
