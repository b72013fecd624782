// Package flagerr is the command side of the flag boundary: libraries name the Config fields behind a wrong
// input (pki/field, and the error types of sshdial), and each command spells them as its own flags here, so
// that a flag's spelling lives only in the command that defines it.
package flagerr

import (
	"net/http"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apiserver/pkg/server/healthz"
)

// namer is an error whose text names Config fields: *field.Error, and sshdial's error types.
type namer interface {
	Named(name func(field string) string) string
}

// Names maps Config fields to the flags that set them, for one command: {"Mode": "--mode", …}.
type Names map[string]string

// Error returns err with every Config field named in it spelled as the command's flag. The text of each
// wrapping error (fmt.Errorf's %w, errors.Join) is kept, with the named part replaced in it; errors.Is and
// errors.As still see everything err wraps. A field with no entry keeps its Config name, so that a missing
// mapping shows in a test rather than as a wrong flag.
func (n Names) Error(err error) error {
	if err == nil {
		return nil
	}
	text := n.render(err)
	if text == err.Error() {
		return err
	}
	return &named{text: text, err: err}
}

// RunE wraps a cobra RunE so that what it returns is named.
func (n Names) RunE(f func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error { return n.Error(f(cmd, args)) }
}

func (n Names) lookup(field string) string {
	if flag, ok := n[field]; ok {
		return flag
	}
	return field
}

// render is err's text with its own fields named, and then, in it, the text of each error it wraps replaced
// by that error's rendering.
func (n Names) render(err error) string {
	var text string
	if e, ok := err.(namer); ok {
		text = e.Named(n.lookup)
	} else {
		text = err.Error()
	}
	var children []error
	switch e := err.(type) {
	case interface{ Unwrap() error }:
		children = []error{e.Unwrap()}
	case interface{ Unwrap() []error }:
		children = e.Unwrap()
	}
	for _, c := range children {
		if c == nil {
			continue
		}
		if old, r := c.Error(), n.render(c); r != old {
			text = strings.Replace(text, old, r, 1)
		}
	}
	return text
}

// named is err with its fields spelled as flags.
type named struct {
	text string
	err  error
}

func (e *named) Error() string { return e.text }
func (e *named) Unwrap() error { return e.err }

// Checks returns checks whose failures are named, for a daemon's /readyz and /livez reasons.
func (n Names) Checks(checks []healthz.HealthChecker) []healthz.HealthChecker {
	out := make([]healthz.HealthChecker, len(checks))
	for i, c := range checks {
		out[i] = namedCheck{c, n}
	}
	return out
}

type namedCheck struct {
	healthz.HealthChecker
	names Names
}

func (c namedCheck) Check(r *http.Request) error { return c.names.Error(c.HealthChecker.Check(r)) }
