//go:build integration

package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestContainerd loads an image into a real containerd with `ctr images import`, as a node operator would,
// checks that containerd sees the tag and the digest WriteTarball returned, and runs it: the entrypoint and
// the numeric user must work with no /etc/passwd in the image.
func TestContainerd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestContainerd runs a real containerd and needs root: run `make deps` as root, then the tests as root")
	}
	for _, tool := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run `make deps` as root (hack/install-deps.sh installs Debian's containerd and runc)", tool)
		}
	}

	work := t.TempDir()
	hello := filepath.Join(work, "hello")
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not found: %v", err)
	}
	build := exec.Command(gobin, "build", "-trimpath", "-o", hello, "./testdata/hello")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the static test program: %v\n%s", err, out)
	}
	const ref = "registry.example.com/konnect-test:v1"
	img := mustBuild(t, Spec{
		Files:      []File{{Src: hello, Dst: "/usr/local/bin/hello", Mode: 0o755}},
		Entrypoint: []string{"/usr/local/bin/hello"},
		Cmd:        []string{"from-cmd"},
		User:       "65534:65534",
		Labels:     map[string]string{"org.opencontainers.image.version": "v1"},
		Created:    created,
	})
	archive := filepath.Join(work, "img.tar")
	digest, err := WriteTarball(archive, ref, img)
	if err != nil {
		t.Fatal(err)
	}

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

	ctr("images", "import", archive)
	if names := strings.Fields(ctr("images", "ls", "--quiet")); !contains(names, ref) {
		t.Fatalf("ctr images ls: %q, want %s", names, ref)
	}
	check := ctr("images", "check", "name=="+ref)
	if !strings.Contains(check, "complete") {
		t.Errorf("ctr images check: %s", check)
	}
	// containerd writes its own manifest for a docker-archive; it must point at our config, by our digest.
	var manifestDigest string
	for _, f := range strings.Fields(check) {
		if strings.HasPrefix(f, "sha256:") {
			manifestDigest = f
			break
		}
	}
	var m struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal([]byte(ctr("content", "get", manifestDigest)), &m); err != nil {
		t.Fatalf("manifest %s: %v", manifestDigest, err)
	}
	if m.Config.Digest != digest {
		t.Errorf("containerd's image has config %s, WriteTarball returned %s", m.Config.Digest, digest)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := ctr("content", "get", digest); got != string(raw) {
		t.Errorf("containerd's config blob %s:\n%s\nwant\n%s", digest, got, raw)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	ld, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 || m.Layers[0].Digest != ld.String() {
		t.Errorf("containerd's layers %+v, want %s", m.Layers, ld)
	}

	out := ctr("run", "--rm", ref, fmt.Sprintf("kn-hello-%d", os.Getpid()))
	if want := `hello uid=65534 gid=65534 args=["from-cmd"]`; strings.TrimSpace(out) != want {
		t.Errorf("ctr run: %q, want %q", out, want)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// startContainerd runs containerd on a socket of its own under a fresh directory and returns the socket. The
// CRI plugin is off (it would want CNI), and so are the snapshotters a test machine lacks. Cleanup stops it,
// kills its shims, unmounts what it left and removes the directory, also when the test fails.
func startContainerd(t *testing.T) string {
	t.Helper()
	// A unix socket path must fit in 108 bytes; t.TempDir() names are too long.
	dir, err := os.MkdirTemp("", "kn-ctd-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "c.sock")
	if len(sock) >= 100 {
		os.RemoveAll(dir)
		t.Fatalf("socket path %s is too long: set TMPDIR to a short directory", sock)
	}
	t.Cleanup(func() { cleanupDir(t, dir, sock) })

	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = %q

[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc")
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start containerd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		// The whole process group: containerd and anything it forked that kept the group.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "containerd.log")); err == nil {
				t.Logf("containerd log:\n%s", lastLines(string(b), 40))
			}
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			t.Fatalf("containerd exited: %v\n%s", err, lastLines(string(b), 40))
		default:
		}
		if out, err := exec.Command("ctr", "--address", sock, "version").CombinedOutput(); err == nil {
			return sock
		} else if time.Now().After(deadline) {
			t.Fatalf("containerd not serving on %s after 30s: %v\n%s", sock, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cleanupDir kills the shims of the containerd on sock, unmounts everything under dir and removes dir.
func cleanupDir(t *testing.T, dir, sock string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmdline, "containerd-shim") && strings.Contains(cmdline, sock) {
			var pid int
			if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil {
				t.Logf("killing leftover shim %d: %s", pid, cmdline)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for _, mp := range mountsUnder(dir) {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mp, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Errorf("remove %s: %v", dir, err)
	}
}

// mountsUnder returns the mount points at or below dir, deepest first, from /proc/self/mountinfo.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
		mp := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
