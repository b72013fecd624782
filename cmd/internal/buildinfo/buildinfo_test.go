package buildinfo

import (
	"runtime/debug"
	"testing"
)

// A binary built without the Makefile's ldflags names its image after what the toolchain recorded, never
// ":devel", which no registry holds.
func TestFromBuildInfo(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "ffb02d9bfcfb4c537237489ba00972c2802fbdc8"
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"go install ...@v1.2.3", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{"go build in a clean checkout", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261126135322-ffb02d9bfcfb"}, Settings: vcs(rev, "false")},
			"v0.0.0-20261126135322-ffb02d9bfcfb"},
		{"go build with local changes", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261126135322-ffb02d9bfcfb+dirty"}, Settings: vcs(rev, "true")},
			"v0.0.0-20261126135322-ffb02d9bfcfb-dirty"},
		{"revision only", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, "ffb02d9bfcfb"},
		{"revision only, modified", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, "ffb02d9bfcfb-dirty"},
		{"-buildvcs=false", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Devel},
		{"no build info", nil, Devel},
	} {
		if got := FromBuildInfo(tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
