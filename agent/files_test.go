package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/konnect-dev/konnect/pki/field"
)

// A file the agent cannot load at start-up is named by its Config field, for the command to spell as a flag;
// the cause stays there for errors.Is.
func TestCredentialsNameTheField(t *testing.T) {
	garbage := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		cfg    Config
		fields []string
		text   string
	}{
		{Config{CAFile: garbage}, []string{"CAFile"}, "CA bundle (CAFile) ([" + garbage + "]): "},
		{Config{CAFile: missing}, []string{"CAFile"}, "CA bundle (CAFile): "},
		{Config{CertFile: garbage, KeyFile: garbage}, []string{"CertFile", "KeyFile"}, "client certificate (CertFile/KeyFile) ([" + garbage + " " + garbage + "]): "},
		{Config{TokenFile: os.DevNull}, []string{"TokenFile"}, "token (TokenFile) ([" + os.DevNull + "]): "},
	} {
		_, err := newCredentials(&tc.cfg)
		var fe *field.Error
		if !errors.As(err, &fe) || !slices.Equal(fe.Fields(), tc.fields) || len(err.Error()) < len(tc.text) || err.Error()[:len(tc.text)] != tc.text {
			t.Errorf("newCredentials(%+v) = %v, want a field error naming %v that starts %q", tc.cfg, err, tc.fields, tc.text)
		}
		if tc.cfg.CAFile == missing && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("missing CA: %v is not fs.ErrNotExist", err)
		}
	}
}
