package oci

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// indexSpecs returns a spec per architecture, each with a file of its own.
func indexSpecs(t *testing.T, arches ...string) []Spec {
	t.Helper()
	var specs []Spec
	for _, arch := range arches {
		s := testSpec(t)
		if err := os.WriteFile(s.Files[0].Src, []byte("\x7fELF for "+arch), 0o600); err != nil {
			t.Fatal(err)
		}
		s.Arch = arch
		specs = append(specs, s)
	}
	return specs
}

// untar extracts an OCI layout tarball into a fresh directory, checking that every entry is owned by 0:0 and
// stamped with created.
func untar(t *testing.T, archive string) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(created) {
			t.Errorf("%s: owner %d:%d, mtime %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWriteLayout(t *testing.T) {
	specs := indexSpecs(t, "amd64", "arm64")
	const ref = "registry.example.com/konnect:v1"
	dir := t.TempDir()
	var tars [2][]byte
	var digest string
	for i := range tars {
		idx, err := BuildIndex(specs)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "img.oci.tar")
		if digest, err = WriteLayout(p, ref, idx, created); err != nil {
			t.Fatal(err)
		}
		if tars[i], err = os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(tars[0], tars[1]) {
		t.Error("two layouts of one set of specs differ")
	}

	root := untar(t, filepath.Join(dir, "img.oci.tar"))
	var top v1.IndexManifest
	b, err := os.ReadFile(filepath.Join(root, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Digest.String() != digest || top.Manifests[0].MediaType != types.OCIImageIndex ||
		top.Manifests[0].Annotations[AnnotationImageName] != ref || top.Manifests[0].Annotations[AnnotationRefName] != "v1" {
		t.Fatalf("index.json %s, want the image index %s named %s", b, digest, ref)
	}
	lp, err := layout.FromPath(root)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := outer.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 2 {
		t.Fatalf("%d manifests, want amd64 and arm64", len(im.Manifests))
	}
	for i, arch := range []string{"amd64", "arm64"} {
		desc := im.Manifests[i]
		if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != arch || desc.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %d: %+v, want an OCI manifest for linux/%s", i, desc, arch)
			continue
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		// Reading every blob back checks each digest.
		if err := validateImage(img); err != nil {
			t.Errorf("linux/%s: %v", arch, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != arch || m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
			t.Errorf("linux/%s: config %s/%s, manifest %+v", arch, cf.OS, cf.Architecture, m)
		}
		files := layerFiles(t, img)
		if got := string(files["usr/local/bin/konnect"]); got != "\x7fELF for "+arch {
			t.Errorf("linux/%s ships %q", arch, got)
		}
	}

	if _, err := BuildIndex(indexSpecs(t, "arm64", "arm64")); err == nil || !strings.Contains(err.Error(), "linux/arm64 given twice") {
		t.Errorf("two arm64 images: %v", err)
	}
	idx2, err := BuildIndex(specs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteLayout(filepath.Join(dir, "x.tar"), "registry.example.com/konnect", idx2, created); err == nil {
		t.Error("a reference without a tag is accepted")
	}
}

// validateImage reads every blob of img, which checks its digest against the manifest's.
func validateImage(img v1.Image) error {
	if _, err := img.RawConfigFile(); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// layerFiles returns the regular files of img's one layer by name.
func layerFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[h.Name] = b
		}
	}
}
