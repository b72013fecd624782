// Package buildinfo holds konnect's version: the one `konnect version` prints and that `konnect init` names its
// default image after. The Makefile's ldflags set it; a binary built without them (`go build`, `go install
// ...@v1.2.3`) takes it from the module's build information instead.
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Version is konnect's version, set at build time:
//
//	go build -ldflags "-X github.com/konnect-dev/konnect/cmd/internal/buildinfo.Version=v0.1.0"
//
// Left at "devel", it is replaced when the program starts by what the Go toolchain recorded (FromBuildInfo).
var Version = Devel

// Devel is the version of a binary that carries no version at all.
const Devel = "devel"

func init() {
	if Version == Devel {
		bi, _ := debug.ReadBuildInfo()
		Version = FromBuildInfo(bi)
	}
}

// FromBuildInfo is the version the Go toolchain recorded in bi: the module version (`go install
// ...@v1.2.3` records v1.2.3; since Go 1.24 a `go build` in a git checkout records a pseudo-version of the
// commit, with "+dirty" for uncommitted changes), else the commit (vcs.revision, shortened to 12 digits as in
// a pseudo-version, "-dirty" when vcs.modified), else Devel. The result is a valid image tag, since init names
// the image after it: "+" becomes "-".
func FromBuildInfo(bi *debug.BuildInfo) string {
	if bi == nil {
		return Devel
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return strings.ReplaceAll(v, "+", "-")
	}
	var revision string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision == "" {
		return Devel
	}
	if len(revision) > 12 {
		revision = revision[:12]
	}
	if modified {
		revision += "-dirty"
	}
	return revision
}
