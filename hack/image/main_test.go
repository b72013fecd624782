package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestRunIsReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "konnect")
	if err := os.WriteFile(bin, []byte("binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	const ref = "registry.example.com/konnect:v1"
	args := func(out string) []string {
		return []string{"-o", out, "-tag", ref,
			"-file", bin + ":/usr/local/bin/konnect:0755",
			"-entrypoint", "/usr/local/bin/konnect", "-cmd", "server,--help",
			"-user", "65534:65534",
			"-label", "org.opencontainers.image.version=v1", "-label", "org.opencontainers.image.source=https://x/y=z",
			"-env", "A=b", "-symlink", "/bin/konnect:../usr/local/bin/konnect", "-created", "1700000000"}
	}
	var digests [2]string
	for i := range digests {
		var stdout, stderr bytes.Buffer
		out := filepath.Join(dir, "out", "img.tar") // -o creates its directory
		if err := run(args(out), &stdout, &stderr); err != nil {
			t.Fatalf("run: %v\n%s", err, stderr.Bytes())
		}
		digests[i] = strings.TrimSpace(stdout.String())
		if !strings.HasPrefix(digests[i], "sha256:") || strings.Count(stdout.String(), "\n") != 1 {
			t.Fatalf("stdout %q, want one digest line", stdout.String())
		}
	}
	if digests[0] != digests[1] {
		t.Errorf("two runs on one input: %s and %s", digests[0], digests[1])
	}

	tag, _ := name.NewTag(ref)
	img, err := tarball.ImageFromPath(filepath.Join(dir, "out", "img.tar"), &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !reflect.DeepEqual(c.Entrypoint, []string{"/usr/local/bin/konnect"}) || !reflect.DeepEqual(c.Cmd, []string{"server", "--help"}) ||
		c.User != "65534:65534" || !reflect.DeepEqual(c.Env, []string{"A=b"}) ||
		!reflect.DeepEqual(c.Labels, map[string]string{"org.opencontainers.image.version": "v1", "org.opencontainers.image.source": "https://x/y=z"}) ||
		!cf.Created.Time.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("config %+v created %v", c, cf.Created)
	}
	if cn, _ := img.ConfigName(); cn.String() != digests[0] {
		t.Errorf("printed %s, image's config digest %s", digests[0], cn)
	}
}

func TestRunErrorsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "img.tar")
	ok := []string{"-o", out, "-tag", "r.example.com/k:v1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-tag", "r.example.com/k:v1"}, "-o:"},
		{[]string{"-o", out}, "-tag:"},
		{append(ok, "-file", "onlysrc"), "-file"},
		{append(ok, "-file", "a:/b:9"), "not octal"},
		{append(ok, "-symlink", "/a"), "-symlink"},
		{append(ok, "-label", "novalue"), "-label"},
		{append(ok, "-env", "=x"), "-env"},
		{append(ok, "-created", "yesterday"), "-created"},
		{append(ok, "stray"), "unexpected arguments"},
		{[]string{"-o", out, "-tag", "r.example.com/k"}, "no tag"},
		{append(ok, "-platform", "darwin/arm64"), "-platform"},
		{append(ok, "-platform", "linux"), "-platform"},
		{append(ok, "-file", "bin/{os}_{arch}/konnect:/k:0755"), "need -platform"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run %q: %v, want an error containing %q", tc.args, err, tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("run %q printed %q on a failure", tc.args, stdout.String())
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed run left %s: %v", out, err)
	}
}
