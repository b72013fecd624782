package oci

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Annotations of the image index in index.json, by which loaders name the image they import.
const (
	// AnnotationImageName is containerd's (and Docker's, which loads through containerd's importer): the
	// whole reference.
	AnnotationImageName = "io.containerd.image.name"
	// AnnotationRefName is the OCI image layout's: the tag.
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// WriteLayout writes idx to path as an OCI image layout in a tar archive (what `ctr images import`, `docker
// load` and `skopeo copy oci-archive:` read), naming it ref, which must name a tag. Every entry is owned by
// 0:0 and stamped with mtime, and entries are sorted, so that one index gives the same bytes. It writes a
// temporary file next to path and renames it. It returns the digest of the image index.
func WriteLayout(path, ref string, idx v1.ImageIndex, mtime time.Time) (digest string, err error) {
	tag, err := name.NewTag(ref, name.WithDefaultTag(""))
	if err != nil {
		return "", fmt.Errorf("tag %q: %w", ref, err)
	}
	if tag.TagStr() == "" {
		return "", fmt.Errorf("tag %q: no tag; name one, e.g. %s:v1", ref, ref)
	}
	blobs := map[v1.Hash][]byte{}
	if err := addIndexBlobs(blobs, idx); err != nil {
		return "", err
	}
	d, err := idx.Digest()
	if err != nil {
		return "", err
	}
	mt, err := idx.MediaType()
	if err != nil {
		return "", err
	}
	raw := blobs[d]
	top, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     mt,
		Manifests: []v1.Descriptor{{
			MediaType:   mt,
			Digest:      d,
			Size:        int64(len(raw)),
			Annotations: map[string]string{AnnotationImageName: tag.Name(), AnnotationRefName: tag.TagStr()},
		}},
	})
	if err != nil {
		return "", err
	}
	files := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": top,
	}
	for h, b := range blobs {
		files["blobs/"+h.Algorithm+"/"+h.Hex] = b
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
	if err = writeTar(tmp, files, mtime); err != nil {
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

// addIndexBlobs adds the index's manifest, and each image's manifest, config and layers, to blobs.
func addIndexBlobs(blobs map[v1.Hash][]byte, idx v1.ImageIndex) error {
	raw, err := idx.RawManifest()
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	blobs[d] = raw
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return fmt.Errorf("image %s: %w", desc.Digest, err)
		}
		if blobs[desc.Digest], err = img.RawManifest(); err != nil {
			return err
		}
		cd, err := img.ConfigName()
		if err != nil {
			return err
		}
		if blobs[cd], err = img.RawConfigFile(); err != nil {
			return err
		}
		layers, err := img.Layers()
		if err != nil {
			return err
		}
		for _, l := range layers {
			ld, err := l.Digest()
			if err != nil {
				return err
			}
			rc, err := l.Compressed()
			if err != nil {
				return err
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return err
			}
			blobs[ld] = b
		}
	}
	return nil
}

// writeTar writes files, with their parent directories, as a tar sorted by name.
func writeTar(w io.Writer, files map[string][]byte, mtime time.Time) error {
	names := []string{"blobs/", "blobs/sha256/"}
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		hdr := &tar.Header{Name: n, ModTime: mtime.UTC().Truncate(time.Second), Format: tar.FormatPAX}
		data, isFile := files[n]
		if isFile {
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, int64(len(data))
		} else {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}
