package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testConfig enables every certificate. ECDSA keeps tests fast; tests about RSA say so.
func testConfig(t *testing.T) Config {
	t.Helper()
	return Config{
		Dir:                   t.TempDir(),
		ControlPlaneAddresses: []string{"198.18.0.1", "cp.example.test"},
		Hostname:              "node-1",
		KeyAlgorithm:          ECDSAP256,
		AgentMTLS:             true,
		FrontendTLS:           true,
	}
}

func mustEnsure(t *testing.T, cfg Config, names ...string) []Result {
	t.Helper()
	res, err := Ensure(cfg, names...)
	if err != nil {
		t.Fatalf("Ensure(%v): %v", names, err)
	}
	return res
}

// snapshot maps every file under dir to its mode, size, modification time and sha256.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[p] = info.Mode().String()
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		out[p] = info.Mode().String() + " " + info.ModTime().Format(time.RFC3339Nano) + " " + hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffSnapshots(before, after map[string]string) (changed []string) {
	for p, v := range after {
		if before[p] != v {
			changed = append(changed, p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			changed = append(changed, p+" (removed)")
		}
	}
	return changed
}

func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	c, _, err := readCert(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func specByName(t *testing.T, name string) *Spec {
	t.Helper()
	s, ok := Lookup(Specs(), name)
	if !ok {
		t.Fatalf("no spec %q", name)
	}
	return s
}

func resultByName(t *testing.T, res []Result, name string) Result {
	t.Helper()
	for _, r := range res {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no result for %q in %+v", name, res)
	return Result{}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
