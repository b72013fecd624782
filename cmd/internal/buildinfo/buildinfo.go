// Package buildinfo holds what the build stamps into the konnect binary: the version `konnect version` prints
// and that `konnect init` names its default image after. It is set by the Makefile's ldflags and nothing else.
package buildinfo

// Version is konnect's version, set at build time:
//
//	go build -ldflags "-X github.com/konnect-dev/konnect/cmd/internal/buildinfo.Version=v0.1.0"
//
// A plain `go build` leaves it "devel".
var Version = "devel"
