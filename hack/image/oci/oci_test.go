package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var created = time.Unix(1700000000, 0)

// testSpec returns a spec over two files written into a fresh directory.
func testSpec(t *testing.T) Spec {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "konnect")
	conf := filepath.Join(dir, "conf")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("key: value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Files: []File{
			{Src: bin, Dst: "/usr/local/bin/konnect", Mode: 0o755},
			{Src: conf, Dst: "/etc/konnect/conf.yaml"},
		},
		Symlinks:   map[string]string{"/bin/konnect": "../usr/local/bin/konnect"},
		Dirs:       []string{"/tmp", "/var/run/konnect"},
		Entrypoint: []string{"/usr/local/bin/konnect"},
		Cmd:        []string{"version"},
		User:       "65534:65534",
		Env:        []string{"PATH=/usr/local/bin"},
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.version":  "v1.2.3",
			"org.opencontainers.image.revision": "0123abc",
			"org.opencontainers.image.source":   "https://github.com/konnect-dev/konnect",
		},
		Created: created,
	}
}

func digests(t *testing.T, img v1.Image) (config, manifest string) {
	t.Helper()
	c, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return c.String(), m.String()
}

func mustBuild(t *testing.T, s Spec) v1.Image {
	t.Helper()
	img, err := Build(s)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return img
}

func TestBuildIsReproducible(t *testing.T) {
	s := testSpec(t)
	c1, m1 := digests(t, mustBuild(t, s))
	// Reading the files again, with other mtimes and owners on the host, changes nothing.
	later := time.Now().Add(time.Hour)
	for _, f := range s.Files {
		if err := os.Chtimes(f.Src, later, later); err != nil {
			t.Fatal(err)
		}
	}
	c2, m2 := digests(t, mustBuild(t, s))
	if c1 != c2 || m1 != m2 {
		t.Errorf("two builds of one spec: config %s vs %s, manifest %s vs %s", c1, c2, m1, m2)
	}

	// The tarballs are byte for byte the same too.
	dir := t.TempDir()
	var tars [2][]byte
	for i := range tars {
		p := filepath.Join(dir, "img.tar")
		if _, err := WriteTarball(p, "registry.example.com/konnect:v1", mustBuild(t, s)); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		tars[i] = b
	}
	if !bytes.Equal(tars[0], tars[1]) {
		t.Error("two tarballs of one spec differ")
	}
}

func TestBuildChangesWithInputs(t *testing.T) {
	base := testSpec(t)
	c0, _ := digests(t, mustBuild(t, base))
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, s *Spec)
	}{
		{"file content", func(t *testing.T, s *Spec) {
			p := filepath.Join(t.TempDir(), "konnect")
			if err := os.WriteFile(p, []byte("\x7fELF not really!"), 0o600); err != nil {
				t.Fatal(err)
			}
			s.Files = append([]File{{Src: p, Dst: "/usr/local/bin/konnect", Mode: 0o755}}, s.Files[1:]...)
		}},
		{"file mode", func(t *testing.T, s *Spec) {
			s.Files = append([]File{{Src: s.Files[0].Src, Dst: s.Files[0].Dst, Mode: 0o750}}, s.Files[1:]...)
		}},
		{"created", func(t *testing.T, s *Spec) { s.Created = created.Add(time.Second) }},
		{"label", func(t *testing.T, s *Spec) {
			s.Labels = map[string]string{"org.opencontainers.image.version": "v1.2.4"}
		}},
		{"user", func(t *testing.T, s *Spec) { s.User = "0:0" }},
		{"symlink", func(t *testing.T, s *Spec) { s.Symlinks = map[string]string{"/bin/konnect": "/usr/local/bin/konnect"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec(t)
			s.Files[0].Src, s.Files[1].Src = base.Files[0].Src, base.Files[1].Src
			tc.change(t, &s)
			if c, _ := digests(t, mustBuild(t, s)); c == c0 {
				t.Errorf("changed %s, same digest %s", tc.name, c)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	s := testSpec(t)
	cf, err := mustBuild(t, s).ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !cf.Created.Time.Equal(created) {
		t.Errorf("created %v, want %v", cf.Created.Time, created)
	}
	want := v1.Config{
		Entrypoint: s.Entrypoint, Cmd: s.Cmd, User: "65534:65534", Env: s.Env, WorkingDir: "/", Labels: s.Labels,
	}
	if !reflect.DeepEqual(cf.Config, want) {
		t.Errorf("config %+v\nwant %+v", cf.Config, want)
	}
	if len(cf.RootFS.DiffIDs) != 1 || len(cf.History) != 1 || !cf.History[0].Created.Time.Equal(created) {
		t.Errorf("rootfs %+v, history %+v: want one layer created %v", cf.RootFS, cf.History, created)
	}

	// Zero Created is the Unix epoch, not the zero time.Time (year 1).
	s.Created = time.Time{}
	if cf, err = mustBuild(t, s).ConfigFile(); err != nil {
		t.Fatal(err)
	}
	if cf.Created.Unix() != 0 {
		t.Errorf("zero Created gave %v, want the Unix epoch", cf.Created.Time)
	}
}

func TestLayer(t *testing.T) {
	s := testSpec(t)
	layers, err := mustBuild(t, s).Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v: want one", len(layers), err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || zr.Comment != "" || !zr.ModTime.IsZero() || len(zr.Extra) != 0 {
		t.Errorf("gzip header carries name %q, comment %q, mtime %v, extra %q", zr.Name, zr.Comment, zr.ModTime, zr.Extra)
	}
	type ent struct {
		name   string
		typ    byte
		mode   int64
		link   string
		data   string
		header string
	}
	var got []ent
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(created) {
			t.Errorf("%s: owner %d:%d (%q:%q), mtime %v; want 0:0 and %v", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime, created)
		}
		b, _ := io.ReadAll(tr)
		got = append(got, ent{name: h.Name, typ: h.Typeflag, mode: h.Mode, link: h.Linkname, data: string(b)})
	}
	want := []ent{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/konnect", typ: tar.TypeSymlink, mode: 0o777, link: "../usr/local/bin/konnect"},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/konnect/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/konnect/conf.yaml", typ: tar.TypeReg, mode: 0o644, data: "key: value\n"},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		{name: "usr/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/local/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/local/bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/local/bin/konnect", typ: tar.TypeReg, mode: 0o755, data: "\x7fELF not really"},
		{name: "var/", typ: tar.TypeDir, mode: 0o755},
		{name: "var/run/", typ: tar.TypeDir, mode: 0o755},
		{name: "var/run/konnect/", typ: tar.TypeDir, mode: 0o755},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer entries:\n got %+v\nwant %+v", got, want)
	}
}

func TestBuildRejects(t *testing.T) {
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"relative path", Spec{Files: []File{{Src: src, Dst: "usr/bin/x"}}}, "absolute"},
		{"root", Spec{Dirs: []string{"/"}}, "root directory"},
		{"no source", Spec{Files: []File{{Dst: "/x"}}}, "no source"},
		{"missing source", Spec{Files: []File{{Src: src + ".gone", Dst: "/x"}}}, "no such file"},
		{"mode", Spec{Files: []File{{Src: src, Dst: "/x", Mode: 0o10755}}}, "mode"},
		{"twice", Spec{Files: []File{{Src: src, Dst: "/x"}, {Src: src, Dst: "/x/"}}}, "given twice"},
		{"file and symlink", Spec{Files: []File{{Src: src, Dst: "/x"}}, Symlinks: map[string]string{"/x": "y"}}, "given twice"},
		{"file under a file", Spec{Files: []File{{Src: src, Dst: "/x"}, {Src: src, Dst: "/x/y"}}}, "not a directory"},
		{"dir over a file", Spec{Files: []File{{Src: src, Dst: "/x"}}, Dirs: []string{"/x"}}, "not a directory"},
		{"empty symlink", Spec{Symlinks: map[string]string{"/x": ""}}, "no target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Build: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestWriteTarball(t *testing.T) {
	img := mustBuild(t, testSpec(t))
	dir := t.TempDir()
	p := filepath.Join(dir, "konnect-image.tar")
	const ref = "registry.example.com/konnect:v1"
	digest, err := WriteTarball(p, ref, img)
	if err != nil {
		t.Fatal(err)
	}
	cfgDigest, manifestDigest := digests(t, img)
	if digest != cfgDigest || !strings.HasPrefix(digest, "sha256:") {
		t.Errorf("WriteTarball returned %q, want the config digest %s", digest, cfgDigest)
	}

	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("read back with tag %s: %v", ref, err)
	}
	if c, m := digests(t, back); c != cfgDigest || m != manifestDigest {
		t.Errorf("read back config %s manifest %s, want %s and %s", c, m, cfgDigest, manifestDigest)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !reflect.DeepEqual(m[0].RepoTags, []string{ref}) {
		t.Errorf("manifest.json %+v, want one image tagged %s", m, ref)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("tarball mode %v, %v; want 0644", fi.Mode(), err)
	}

	// A rejected write leaves the old tarball and no temporary file behind.
	old, _ := os.ReadFile(p)
	for _, bad := range []string{"registry.example.com/konnect", "Registry.example.com/UPPER:v1", "x:"} {
		if _, err := WriteTarball(p, bad, img); err == nil {
			t.Errorf("WriteTarball with ref %q: no error", bad)
		}
	}
	if _, err := WriteTarball(filepath.Join(dir, "missing", "x.tar"), ref, img); err == nil {
		t.Error("WriteTarball into a missing directory: no error")
	}
	if now, _ := os.ReadFile(p); !bytes.Equal(now, old) {
		t.Error("a rejected write changed the tarball")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %q, want only the tarball", names)
	}
}

// The docker-archive's manifest.json is what docker, podman and containerd read; pin its shape.
func TestDockerArchiveManifest(t *testing.T) {
	img := mustBuild(t, testSpec(t))
	p := filepath.Join(t.TempDir(), "img.tar")
	digest, err := WriteTarball(p, "ghcr.io/konnect-dev/konnect:v1", img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var files []string
	var mf []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, h.Name)
		if h.Name == "manifest.json" {
			if err := json.NewDecoder(tr).Decode(&mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(mf) != 1 || mf[0].Config != digest || len(mf[0].Layers) != 1 || len(files) != 3 {
		t.Errorf("archive files %q, manifest.json %+v; want config %s, one layer", files, mf, digest)
	}
}
