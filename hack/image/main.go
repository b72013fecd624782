// Command image builds konnect's container image offline (see package oci) and writes it as a docker-archive
// tarball; `make image` runs it. It prints the image digest on stdout.
//
//	go run ./hack/image -o bin/konnect-image.tar -tag ghcr.io/konnect-dev/konnect:v1 \
//	  -file bin/image/konnect:/usr/local/bin/konnect:0755 -entrypoint /usr/local/bin/konnect \
//	  -user 65534:65534 -label org.opencontainers.image.version=v1 -created 1700000000
//
// With -platform it builds one image per platform, each from the files its {os} and {arch} name, and writes
// them as one OCI image index in an OCI image layout tarball (`make image-multiarch`); it prints the index's
// digest:
//
//	go run ./hack/image -o bin/konnect-image.oci.tar -tag ghcr.io/konnect-dev/konnect:v1 \
//	  -platform linux/amd64,linux/arm64 -file 'bin/image/{os}_{arch}/konnect:/usr/local/bin/konnect:0755' ...
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/hack/image/oci"
)

// list is a flag that may be repeated; split, when set, also splits each value on commas.
type list struct {
	vals  []string
	split bool
}

func (l *list) String() string { return strings.Join(l.vals, ",") }

func (l *list) Set(v string) error {
	if l.split {
		l.vals = append(l.vals, strings.Split(v, ",")...)
	} else {
		l.vals = append(l.vals, v)
	}
	return nil
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		out, tag, user, workdir, created string
		files, symlinks, dirs, labels    list
		env                              list
		entrypoint                       = list{split: true}
		cmd                              = list{split: true}
		platforms                        = list{split: true}
	)
	fs.StringVar(&out, "o", "", "output tarball (docker-archive, or with -platform an OCI image layout), e.g. bin/konnect-image.tar")
	fs.StringVar(&tag, "tag", "", "image reference with a tag, e.g. ghcr.io/konnect-dev/konnect:v1")
	fs.Var(&files, "file", "SRC:DST[:MODE], a host file and its absolute path in the image, mode octal (default 0644); repeatable")
	fs.Var(&symlinks, "symlink", "DST:TARGET, a symbolic link in the image; repeatable")
	fs.Var(&dirs, "dir", "an empty directory in the image (/tmp gets 01777); repeatable")
	fs.Var(&entrypoint, "entrypoint", "entrypoint, comma separated or repeated")
	fs.Var(&cmd, "cmd", "default arguments, comma separated or repeated")
	fs.StringVar(&user, "user", "", "default user, e.g. 65534:65534")
	fs.Var(&labels, "label", "KEY=VALUE image label; repeatable")
	fs.Var(&env, "env", "KEY=VALUE environment variable; repeatable")
	fs.StringVar(&workdir, "workdir", "", "working directory")
	fs.StringVar(&created, "created", "0", "creation time and file mtimes, Unix seconds (use the commit time)")
	fs.Var(&platforms, "platform", "OS/ARCH, e.g. linux/arm64, comma separated or repeated: one image each, written as an OCI image index; {os} and {arch} in a -file SRC name each platform's file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if out == "" {
		return fmt.Errorf("-o: an output path is required")
	}
	if tag == "" {
		return fmt.Errorf("-tag: an image reference is required")
	}

	s := oci.Spec{
		Entrypoint: entrypoint.vals,
		Cmd:        cmd.vals,
		User:       user,
		Env:        env.vals,
		WorkingDir: workdir,
		Dirs:       dirs.vals,
	}
	secs, err := strconv.ParseInt(created, 10, 64)
	if err != nil || secs < 0 {
		return fmt.Errorf("-created %q: want Unix seconds", created)
	}
	s.Created = time.Unix(secs, 0)
	for _, f := range files.vals {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return fmt.Errorf("-file %q: want SRC:DST[:MODE]", f)
		}
		file := oci.File{Src: parts[0], Dst: parts[1]}
		if len(parts) == 3 {
			m, err := strconv.ParseInt(parts[2], 8, 64)
			if err != nil {
				return fmt.Errorf("-file %q: mode %q is not octal", f, parts[2])
			}
			file.Mode = m
		}
		s.Files = append(s.Files, file)
	}
	for _, l := range symlinks.vals {
		dst, target, ok := strings.Cut(l, ":")
		if !ok || dst == "" || target == "" {
			return fmt.Errorf("-symlink %q: want DST:TARGET", l)
		}
		if s.Symlinks == nil {
			s.Symlinks = map[string]string{}
		}
		if _, dup := s.Symlinks[dst]; dup {
			return fmt.Errorf("-symlink %q: %s given twice", l, dst)
		}
		s.Symlinks[dst] = target
	}
	for _, l := range labels.vals {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
	for _, e := range env.vals {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("-env %q: want KEY=VALUE", e)
		}
	}

	if len(platforms.vals) == 0 {
		for _, f := range s.Files {
			if strings.Contains(f.Src, "{arch}") || strings.Contains(f.Src, "{os}") {
				return fmt.Errorf("-file %s: {os} and {arch} name a platform's file, and need -platform", f.Src)
			}
		}
	}
	specs, err := perPlatform(s, platforms.vals)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	var digest string
	if specs == nil {
		img, err := oci.Build(s)
		if err != nil {
			return err
		}
		if digest, err = oci.WriteTarball(out, tag, img); err != nil {
			return err
		}
	} else {
		idx, err := oci.BuildIndex(specs)
		if err != nil {
			return err
		}
		if digest, err = oci.WriteLayout(out, tag, idx, s.Created); err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, digest)
	return nil
}

// perPlatform returns a copy of s for each platform ("linux/ARCH"), with {os} and {arch} in its files'
// sources replaced; nil for none.
func perPlatform(s oci.Spec, platforms []string) ([]oci.Spec, error) {
	var specs []oci.Spec
	for _, p := range platforms {
		goos, arch, ok := strings.Cut(p, "/")
		if !ok || goos != "linux" || arch == "" || strings.Contains(arch, "/") {
			return nil, fmt.Errorf("-platform %q: want linux/ARCH, e.g. linux/arm64", p)
		}
		ps := s
		ps.Arch = arch
		ps.Files = make([]oci.File, len(s.Files))
		for i, f := range s.Files {
			f.Src = strings.NewReplacer("{os}", goos, "{arch}", arch).Replace(f.Src)
			ps.Files[i] = f
		}
		specs = append(specs, ps)
	}
	return specs, nil
}
