// Package oci builds a single-layer container image from files on the host, reproducibly and offline, and
// writes it as a docker-archive tarball that `ctr images import`, `docker load` and `podman load` accept; or
// builds one such image per platform and writes them as one OCI image index, in an OCI image layout tarball
// (BuildIndex, WriteLayout).
//
// It is for images with no base: a static binary and what it needs. It pulls nothing, talks to no daemon or
// registry, and does not run anything inside the image. The same Spec and the same input files give the same
// image digest (see WriteTarball): entries are sorted, owned by 0:0, stamped with Spec.Created, and gzipped
// without a name or time in the header. (The compressed bytes depend on Go's compress/flate as well; the image
// digest, which covers the uncompressed layer, does not.)
package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one regular file of the image.
type File struct {
	Src  string // path on the host to read
	Dst  string // absolute path inside the image
	Mode int64  // permission bits, e.g. 0o755; 0 means 0o644
}

// Spec is everything the image holds. Paths inside the image are absolute; their parent directories are
// added as 0755 directories.
type Spec struct {
	Files      []File
	Symlinks   map[string]string // absolute path in image -> link target (e.g. "/bin/sh": "busybox")
	Dirs       []string          // extra empty directories, e.g. "/tmp" (created 01777 if "/tmp", else 0755)
	Entrypoint []string
	Cmd        []string
	User       string // e.g. "65534:65534"
	Env        []string
	WorkingDir string
	Labels     map[string]string
	Created    time.Time // zero means Unix epoch 0
	// Arch is the image's architecture (GOARCH: amd64, arm64), which its files must be built for; empty means
	// the architecture of the machine that builds it.
	Arch string
}

// CreatedBy is the history entry of the one layer.
const CreatedBy = "konnect hack/image"

// entry is one tar entry of the layer; data is read from src for regular files.
type entry struct {
	name   string // relative, without a leading slash; directories end in "/"
	typ    byte
	mode   int64
	src    string
	target string
}

// Build returns the image of s: one layer, linux and s.Arch, with Docker's media types (as a docker-archive
// has them). It reads the files of s now, so that the image does not change if they change later.
func Build(s Spec) (v1.Image, error) { return build(s, false) }

// build builds the image of s, with OCI's media types when oci is set (for an OCI image index).
func build(s Spec, oci bool) (v1.Image, error) {
	created := s.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC().Truncate(time.Second)

	entries, err := s.entries()
	if err != nil {
		return nil, err
	}
	gz, err := layerBytes(entries, created)
	if err != nil {
		return nil, err
	}
	var layerOpts []tarball.LayerOption
	if oci {
		layerOpts = append(layerOpts, tarball.WithMediaType(types.OCILayer))
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, layerOpts...)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := empty.Image
	if oci {
		base = mutate.ConfigMediaType(mutate.MediaType(base, types.OCIManifestSchema1), types.OCIConfigJSON)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: created}, CreatedBy: CreatedBy},
	})
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = s.arch()
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: s.Entrypoint,
		Cmd:        s.Cmd,
		User:       s.User,
		Env:        s.Env,
		WorkingDir: s.WorkingDir,
		Labels:     s.Labels,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return img, nil
}

func (s Spec) arch() string {
	if s.Arch == "" {
		return runtime.GOARCH
	}
	return s.Arch
}

// BuildIndex returns an OCI image index of one image per spec (see Build), each listed under its platform,
// linux and its Arch, in the order given. Two specs of one architecture are refused.
func BuildIndex(specs []Spec) (v1.ImageIndex, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("index: no image")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, s := range specs {
		arch := s.arch()
		if seen[arch] {
			return nil, fmt.Errorf("index: linux/%s given twice", arch)
		}
		seen[arch] = true
		img, err := build(s, true)
		if err != nil {
			return nil, fmt.Errorf("linux/%s: %w", arch, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	return idx, nil
}

// entries checks s and returns the sorted tar entries, parent directories included.
func (s Spec) entries() ([]entry, error) {
	byName := map[string]entry{}
	clean := func(what, p string) (string, error) {
		if !path.IsAbs(p) {
			return "", fmt.Errorf("%s %q: must be an absolute path in the image", what, p)
		}
		c := path.Clean(p)
		if c == "/" {
			return "", fmt.Errorf("%s %q: must not be the root directory", what, p)
		}
		return strings.TrimPrefix(c, "/"), nil
	}
	add := func(e entry) error {
		key := strings.TrimSuffix(e.name, "/")
		if old, ok := byName[key]; ok {
			if old.typ == tar.TypeDir && e.typ == tar.TypeDir {
				if e.mode != 0o755 {
					byName[key] = e // an explicit /tmp beats the 0755 it got as a parent
				}
				return nil
			}
			if old.typ == tar.TypeDir || e.typ == tar.TypeDir {
				return fmt.Errorf("/%s: both a directory (or the parent of another path) and not a directory", key)
			}
			return fmt.Errorf("/%s: given twice", key)
		}
		byName[key] = e
		return nil
	}
	addParents := func(rel string) error {
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			if err := add(entry{name: d + "/", typ: tar.TypeDir, mode: 0o755}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range s.Files {
		rel, err := clean("file", f.Dst)
		if err != nil {
			return nil, err
		}
		if f.Src == "" {
			return nil, fmt.Errorf("file %s: no source path", f.Dst)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if mode&^0o7777 != 0 {
			return nil, fmt.Errorf("file %s: mode %#o has bits beyond 07777", f.Dst, f.Mode)
		}
		if err := addParents(rel); err != nil {
			return nil, err
		}
		if err := add(entry{name: rel, typ: tar.TypeReg, mode: mode, src: f.Src}); err != nil {
			return nil, err
		}
	}
	links := make([]string, 0, len(s.Symlinks))
	for dst := range s.Symlinks {
		links = append(links, dst)
	}
	sort.Strings(links) // the same error for the same spec
	for _, dst := range links {
		target := s.Symlinks[dst]
		rel, err := clean("symlink", dst)
		if err != nil {
			return nil, err
		}
		if target == "" {
			return nil, fmt.Errorf("symlink %s: no target", dst)
		}
		if err := addParents(rel); err != nil {
			return nil, err
		}
		if err := add(entry{name: rel, typ: tar.TypeSymlink, mode: 0o777, target: target}); err != nil {
			return nil, err
		}
	}
	for _, d := range s.Dirs {
		rel, err := clean("dir", d)
		if err != nil {
			return nil, err
		}
		mode := int64(0o755)
		if rel == "tmp" {
			mode = 0o1777
		}
		if err := addParents(rel); err != nil {
			return nil, err
		}
		if err := add(entry{name: rel + "/", typ: tar.TypeDir, mode: mode}); err != nil {
			return nil, err
		}
	}
	out := make([]entry, 0, len(byName))
	for _, e := range byName {
		out = append(out, e)
	}
	// Sorted by path without the trailing slash, so that a directory comes right before its contents.
	sort.Slice(out, func(i, j int) bool {
		return strings.TrimSuffix(out[i].name, "/") < strings.TrimSuffix(out[j].name, "/")
	})
	return out, nil
}

// layerBytes writes entries as a gzipped tar, every entry owned by 0:0 and stamped with mtime.
func layerBytes(entries []entry, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	// The zero gzip.Header: no file name, no modification time, OS "unknown".
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		hdr := &tar.Header{
			Typeflag: e.typ,
			Name:     e.name,
			Linkname: e.target,
			Mode:     e.mode,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		var data []byte
		if e.typ == tar.TypeReg {
			if data, err = os.ReadFile(e.src); err != nil {
				return nil, fmt.Errorf("file /%s: %w", e.name, err)
			}
			hdr.Size = int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer /%s: %w", e.name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("layer /%s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteTarball writes img to path as a docker-archive tagged ref, which must name a tag explicitly (no
// silent ":latest"). It writes a temporary file next to path and renames it, so that path is either the old
// tarball or the whole new one.
//
// It returns the image digest, "sha256:...", as the loaders see it: the digest of the image's config, which
// covers the uncompressed layers, the config and the creation time. podman and Docker's classic image store
// show it as the image ID, and containerd stores the config blob under it. A docker-archive carries no
// manifest, so each loader writes its own and the manifest digest is theirs: `ctr images import` shows a
// different one than `crane push` of the same tarball gives.
func WriteTarball(path, ref string, img v1.Image) (digest string, err error) {
	tag, err := name.NewTag(ref, name.WithDefaultTag(""))
	if err != nil {
		return "", fmt.Errorf("tag %q: %w", ref, err)
	}
	if tag.TagStr() == "" {
		return "", fmt.Errorf("tag %q: no tag; name one, e.g. %s:v1", ref, ref)
	}
	d, err := img.ConfigName()
	if err != nil {
		return "", fmt.Errorf("image digest: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = tarball.Write(tag, img, tmp); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Chmod(0o644); err != nil {
		return "", err
	}
	if err = tmp.Sync(); err != nil {
		return "", err
	}
	if err = tmp.Close(); err != nil {
		return "", err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	return d.String(), nil
}
