package sshdial

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestStrictHostKeyCheckingValues(t *testing.T) {
	for value, want := range map[string]bool{"yes": false, "ask": false, "accept-new": true, "no": true, "off": true} {
		cfg := writeSSHConfig(t, "Host *\n  StrictHostKeyChecking "+value+"\n")
		p, err := resolve(Config{Destination: "h", ConfigFile: cfg, KnownHostsFile: filepath.Join(t.TempDir(), "kh")})
		if err != nil {
			t.Fatalf("%s: %v", value, err)
		}
		if p.hops[0].acceptNew != want {
			t.Errorf("StrictHostKeyChecking %s: acceptNew %v, want %v", value, p.hops[0].acceptNew, want)
		}
	}
	cfg := writeSSHConfig(t, "Host *\n  StrictHostKeyChecking maybe\n")
	_, err := resolve(Config{Destination: "h", ConfigFile: cfg})
	if err == nil || !strings.Contains(err.Error(), cfg) || !strings.Contains(err.Error(), "StrictHostKeyChecking") {
		t.Fatalf("StrictHostKeyChecking maybe: %v, want an error naming the file and keyword", err)
	}
}
