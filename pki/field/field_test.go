package field

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
)

func TestErrorf(t *testing.T) {
	flags := func(f string) string { return "--" + strings.ToLower(strings.ReplaceAll(f, ".", "-")) }
	for _, tc := range []struct {
		name        string
		err         *Error
		text, named string
		fields      []string
	}{
		{
			name:   "field first",
			err:    Errorf("{Mode} %q: must be %q or %q", "tcp", "grpc", "http-connect"),
			text:   `Mode "tcp": must be "grpc" or "http-connect"`,
			named:  `--mode "tcp": must be "grpc" or "http-connect"`,
			fields: []string{"Mode"},
		},
		{
			name:   "field in a hint",
			err:    Errorf("%s: expired (run with {Force} to renew it)", "/etc/ca.crt"),
			text:   "/etc/ca.crt: expired (run with Force to renew it)",
			named:  "/etc/ca.crt: expired (run with --force to renew it)",
			fields: []string{"Force"},
		},
		{
			name:   "two fields and a nested one",
			err:    Errorf("{Mode} grpc with {Transport} tcp is not supported; {TokenAuth.Client} is"),
			text:   "Mode grpc with Transport tcp is not supported; TokenAuth.Client is",
			named:  "--mode grpc with --transport tcp is not supported; --tokenauth-client is",
			fields: []string{"Mode", "Transport", "TokenAuth.Client"},
		},
		{
			// A value is formatted after the placeholders are gone: its braces and verbs stay as they are.
			name:   "braces and verbs in a value",
			err:    Errorf("{Dir} %s: %d", "/tmp/{Force}/%d", 3),
			text:   "Dir /tmp/{Force}/%d: 3",
			named:  "--dir /tmp/{Force}/%d: 3",
			fields: []string{"Dir"},
		},
		{
			name:  "no field",
			err:   Errorf("plain %s", "text"),
			text:  "plain text",
			named: "plain text",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.text {
				t.Errorf("Error() = %q, want %q", got, tc.text)
			}
			if got := tc.err.Named(flags); got != tc.named {
				t.Errorf("Named() = %q, want %q", got, tc.named)
			}
			if !slices.Equal(tc.err.Fields(), tc.fields) {
				t.Errorf("Fields() = %q, want %q", tc.err.Fields(), tc.fields)
			}
		})
	}
}

// A name with a % in it is text, not a verb.
func TestNamedPercent(t *testing.T) {
	err := Errorf("{A}: %d", 1)
	if got, want := err.Named(func(string) string { return "100%" }), "100%: 1"; got != want {
		t.Errorf("Named() = %q, want %q", got, want)
	}
}

func TestWrap(t *testing.T) {
	err := Errorf("{CAFile}: %w", fs.ErrNotExist)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false", err)
	}
	if got, want := err.Error(), "CAFile: "+fs.ErrNotExist.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var fe *Error
	if !errors.As(fmt.Errorf("agent: %w", err), &fe) || !slices.Equal(fe.Fields(), []string{"CAFile"}) {
		t.Errorf("errors.As did not find the field.Error under a wrapping error")
	}
	if Errorf("{A}: %v", fs.ErrNotExist).Unwrap() != nil {
		t.Errorf("%%v wrapped its argument")
	}
}

func TestWrapField(t *testing.T) {
	err := Wrap("AcceptPaths", fs.ErrInvalid)
	if got, want := err.Named(func(f string) string { return "--accept-paths" }), "--accept-paths: "+fs.ErrInvalid.Error(); got != want {
		t.Errorf("Named() = %q, want %q", got, want)
	}
	if err.Error() != Errorf("{AcceptPaths}: %w", fs.ErrInvalid).Error() || !slices.Equal(err.Fields(), []string{"AcceptPaths"}) || !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Wrap differs from Errorf: %q %q", err, err.Fields())
	}
}
