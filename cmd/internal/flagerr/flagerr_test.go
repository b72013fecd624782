package flagerr

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/apiserver/pkg/server/healthz"

	"github.com/konnect-dev/konnect/pki/field"
)

var names = Names{"Mode": "--mode", "Transport": "--transport", "Force": "--force"}

// typed stands for sshdial's error types: a Named method of its own, and an error it wraps.
type typed struct{ err error }

func (e *typed) Named(name func(string) string) string {
	return "cannot connect: " + e.err.Error() + "; or pass " + name("Force")
}
func (e *typed) Error() string { return e.Named(func(f string) string { return f }) }
func (e *typed) Unwrap() error { return e.err }

func TestError(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"field error", field.Errorf("{Mode} %q: must be %q or %q", "x", "grpc", "http-connect"),
			`--mode "x": must be "grpc" or "http-connect"`},
		{"inside fmt.Errorf", fmt.Errorf("phase certs: %w", field.Errorf("a.crt: expired (run with {Force} to renew it)")),
			"phase certs: a.crt: expired (run with --force to renew it)"},
		{"inside errors.Join", fmt.Errorf("pki: nothing written: %w", errors.Join(
			field.Errorf("a.crt: expired (run with {Force} to renew it)"),
			errors.New("b.key: unreadable"),
			field.Errorf("c.crt: expired (run with {Force} to renew it)"))),
			"pki: nothing written: a.crt: expired (run with --force to renew it)\n" +
				"b.key: unreadable\n" +
				"c.crt: expired (run with --force to renew it)"},
		{"field error in a field error", field.Errorf("{Transport}: %w", field.Errorf("{Mode} grpc")),
			"--transport: --mode grpc"},
		{"a type with Named", fmt.Errorf("ssh: %w", &typed{fs.ErrNotExist}),
			"ssh: cannot connect: file does not exist; or pass --force"},
		{"a field with no flag keeps its name", field.Errorf("{Dir} %q", "/x"), `Dir "/x"`},
		{"nothing named", fmt.Errorf("plain: %w", fs.ErrNotExist), "plain: file does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := names.Error(tc.err)
			if got.Error() != tc.want {
				t.Errorf("Error() = %q, want %q", got.Error(), tc.want)
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("errors.Is(named, err) = false")
			}
		})
	}
}

func TestErrorKeepsWhatItWraps(t *testing.T) {
	err := names.Error(fmt.Errorf("init: %w", field.Errorf("{Mode}: %w", fs.ErrPermission)))
	if !errors.Is(err, fs.ErrPermission) {
		t.Errorf("errors.Is(%v, fs.ErrPermission) = false", err)
	}
	var fe *field.Error
	if !errors.As(err, &fe) || fe.Fields()[0] != "Mode" {
		t.Errorf("errors.As(%v, *field.Error) did not find the field error", err)
	}
	plain := errors.New("plain")
	if names.Error(plain) != plain {
		t.Errorf("an error that names no field came back wrapped")
	}
	if names.Error(nil) != nil {
		t.Errorf("Error(nil) != nil")
	}
}

func TestRunE(t *testing.T) {
	run := names.RunE(func(*cobra.Command, []string) error { return field.Errorf("{Mode} bad") })
	if err := run(nil, nil); err == nil || err.Error() != "--mode bad" {
		t.Errorf("RunE returned %v, want --mode bad", err)
	}
	if err := names.RunE(func(*cobra.Command, []string) error { return nil })(nil, nil); err != nil {
		t.Errorf("RunE returned %v for nil", err)
	}
}

func TestChecks(t *testing.T) {
	checks := names.Checks([]healthz.HealthChecker{
		healthz.NamedCheck("tokenreview", func(*http.Request) error { return field.Errorf("through {Mode}: %w", fs.ErrClosed) }),
		healthz.PingHealthz,
	})
	err := checks[0].Check(nil)
	if checks[0].Name() != "tokenreview" || err == nil || err.Error() != "through --mode: "+fs.ErrClosed.Error() || !errors.Is(err, fs.ErrClosed) {
		t.Errorf("check %q: %v", checks[0].Name(), err)
	}
	if err := checks[1].Check(nil); checks[1].Name() != "ping" || err != nil {
		t.Errorf("check %q: %v", checks[1].Name(), err)
	}
}
