//go:build integration

package oci

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// multiarchRef is the name the test gives the image index.
const multiarchRef = "registry.example.com/konnect:multiarch-test"

// makeImageIndex runs `make image-multiarch` on this repository, writing everything under work, and returns
// the index digest it prints.
func makeImageIndex(t *testing.T, work, out string) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", root, "image-multiarch", "PLATFORMS=linux/amd64,linux/arm64",
		"IMAGE_BIN_DIR="+filepath.Join(work, "bin"), "IMAGE_INDEX_TAR="+out, "IMAGE="+multiarchRef,
		"VERSION=v0.0.0-multiarch-test", "REVISION=0123456789abcdef", "SOURCE_DATE_EPOCH=1700000000")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image-multiarch: %v\n%s", err, b)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 3 || f[0] != out+":" || f[1] != multiarchRef || !strings.HasPrefix(f[2], "sha256:") {
		t.Fatalf("make image-multiarch printed %q, want %q", lines[len(lines)-1], out+": "+multiarchRef+" sha256:...")
	}
	return f[2]
}

// TestMultiArchImage builds konnect's image for linux/amd64 and linux/arm64 as `make image-multiarch` does:
// the same bytes twice, each platform's binary a static ELF for its architecture that runs (the arm64 one
// under qemu-user), and an index that a real containerd imports for both platforms.
func TestMultiArchImage(t *testing.T) {
	work := t.TempDir()
	archives := []string{filepath.Join(work, "a.oci.tar"), filepath.Join(work, "b.oci.tar")}
	digest := makeImageIndex(t, work, archives[0])
	if again := makeImageIndex(t, work, archives[1]); again != digest {
		t.Errorf("two builds of one commit: index %s, then %s", digest, again)
	}
	a, _ := os.ReadFile(archives[0])
	b, _ := os.ReadFile(archives[1])
	if !bytes.Equal(a, b) {
		t.Error("two builds of one commit wrote different archives")
	}

	idx := readIndex(t, archives[0], digest)
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	binaries := map[string]string{}
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if desc.Platform == nil || cf.OS != desc.Platform.OS || cf.Architecture != desc.Platform.Architecture {
			t.Errorf("manifest %s: platform %+v, config %s/%s", desc.Digest, desc.Platform, cf.OS, cf.Architecture)
			continue
		}
		if cf.Config.Labels["org.opencontainers.image.version"] != "v0.0.0-multiarch-test" || cf.Config.User != "65534:65534" ||
			strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/konnect" {
			t.Errorf("linux/%s: config %+v", cf.Architecture, cf.Config)
		}
		p := filepath.Join(work, "konnect-"+cf.Architecture)
		if err := os.WriteFile(p, layerFiles(t, img)["usr/local/bin/konnect"], 0o755); err != nil {
			t.Fatal(err)
		}
		binaries[cf.Architecture] = p
	}
	if len(binaries) != 2 || binaries["amd64"] == "" || binaries["arm64"] == "" {
		t.Fatalf("the index holds %v, want linux/amd64 and linux/arm64", binaries)
	}

	t.Run("static ELF per platform", func(t *testing.T) {
		for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
			f, err := elf.Open(binaries[arch])
			if err != nil {
				t.Fatalf("linux/%s: %v", arch, err)
			}
			defer f.Close()
			if f.Class != elf.ELFCLASS64 || f.Machine != machine || f.Type != elf.ET_EXEC {
				t.Errorf("linux/%s: %v %v %v, want a 64-bit %v executable", arch, f.Class, f.Machine, f.Type, machine)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
					t.Errorf("linux/%s: has %v: not a static binary", arch, p.Type)
				}
			}
			if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
				t.Errorf("linux/%s: needs %v", arch, libs)
			}
		}
	})

	t.Run("each binary runs", func(t *testing.T) {
		qemu := ""
		for _, name := range []string{"qemu-aarch64-static", "qemu-aarch64"} {
			if p, err := exec.LookPath(name); err == nil {
				qemu = p
				break
			}
		}
		if qemu == "" {
			t.Fatal("qemu-aarch64-static not found: run `make deps` as root (hack/install-deps.sh installs Debian's qemu-user-static)")
		}
		for arch, argv := range map[string][]string{
			"amd64": {binaries["amd64"]},
			"arm64": {qemu, binaries["arm64"]},
		} {
			out, err := exec.Command(argv[0], append(argv[1:], "version", "-o", "json")...).CombinedOutput()
			if err != nil {
				t.Errorf("linux/%s: %v\n%s", arch, err, out)
				continue
			}
			var v struct{ Version, Platform string }
			if err := json.Unmarshal(out, &v); err != nil || v.Platform != "linux/"+arch || v.Version != "v0.0.0-multiarch-test" {
				t.Errorf("linux/%s: konnect version printed %s (%v)", arch, out, err)
			}
		}
	})

	t.Run("containerd imports the index", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Fatal("runs a real containerd and needs root: run `make deps` as root, then the tests as root")
		}
		lockE2E(t)
		sock := startContainerd(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ctr := func(args ...string) string {
			t.Helper()
			cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("ctr %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
			}
			return string(out)
		}
		ctr("images", "import", "--all-platforms", archives[0])
		var line string
		for _, l := range strings.Split(ctr("images", "ls"), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == multiarchRef {
				line = l
			}
		}
		if !strings.Contains(line, digest) || !strings.Contains(line, "linux/amd64") || !strings.Contains(line, "linux/arm64") {
			t.Fatalf("ctr images ls: %q, want %s at %s for linux/amd64 and linux/arm64", line, multiarchRef, digest)
		}
		// Every blob of both platforms is in containerd's store, byte for byte.
		for _, desc := range im.Manifests {
			img, err := idx.Image(desc.Digest)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := img.RawManifest()
			if got := ctr("content", "get", desc.Digest.String()); got != string(raw) {
				t.Errorf("containerd's manifest for %s differs", desc.Platform)
			}
		}
		// The host's platform runs, as the static pod and the DaemonSet would (ctr's command replaces the
		// entrypoint, which the config check above covers).
		out := ctr("run", "--rm", multiarchRef, fmt.Sprintf("kn-multiarch-%d", os.Getpid()), "/usr/local/bin/konnect", "version")
		if !strings.Contains(out, "konnect v0.0.0-multiarch-test") {
			t.Errorf("ctr run: %q", out)
		}
	})
}

// readIndex opens the OCI layout archive and returns the image index it names, which must have digest.
func readIndex(t *testing.T, archive, digest string) v1.ImageIndex {
	t.Helper()
	lp, err := layout.FromPath(untar(t, archive)) // untar checks the stamps: SOURCE_DATE_EPOCH above is created
	if err != nil {
		t.Fatal(err)
	}
	outer, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	top, err := outer.IndexManifest()
	if err != nil || len(top.Manifests) != 1 || top.Manifests[0].Digest.String() != digest {
		t.Fatalf("index.json: %+v, %v; want one index, %s", top, err, digest)
	}
	idx, err := outer.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// lockE2E holds the lock that keeps anything starting containerd or kubelets apart.
func lockE2E(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/tmp/konnect-e2e.lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
}
