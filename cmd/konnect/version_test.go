package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/konnect-dev/konnect/cmd/internal/buildinfo"
)

// konnect version prints the version the Makefile stamps into buildinfo, the one init names its image after.
func TestVersionIsBuildinfo(t *testing.T) {
	old := buildinfo.Version
	t.Cleanup(func() { buildinfo.Version = old })
	buildinfo.Version = "v9.8.7"

	cmd := newVersionCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--output", "json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatalf("%v\n%s", err, out.Bytes())
	}
	if v.Version != "v9.8.7" {
		t.Errorf("version %q, want v9.8.7", v.Version)
	}
}
