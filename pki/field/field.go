// Package field is how a library says which of its inputs was wrong without knowing how its caller spells
// them: an error whose text names Config fields as {Field}. Error shows the field names; a command shows its
// own flags through Named (cmd/internal/flagerr does that for every konnect command).
//
// It is a leaf: it imports only the standard library, so every package can use it.
package field

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Error is an error whose text names Config fields. Build it with Errorf.
type Error struct {
	format string
	args   []any
	fields []string
	err    error // what %w wrapped, if anything
}

// placeholder is {Name} or {Name.Sub}: exported Go identifiers, so that no literal brace in a format (there
// is none in konnect's texts, but a JSON example could have one) is taken for a field.
var placeholder = regexp.MustCompile(`\{([A-Z][A-Za-z0-9]*(?:\.[A-Z][A-Za-z0-9]*)*)\}`)

// Errorf is fmt.Errorf whose format may name Config fields as {Name} or {Name.Sub}; one %w wraps as usual.
// Placeholders are replaced in the format, before the arguments are formatted, so a value that holds braces
// (a path) is never taken for one.
func Errorf(format string, args ...any) *Error {
	e := &Error{format: format, args: args}
	for _, m := range placeholder.FindAllStringSubmatch(format, -1) {
		e.fields = append(e.fields, m[1])
	}
	e.err = errors.Unwrap(fmt.Errorf(format, args...))
	return e
}

// Wrap is Errorf("{name}: %w", err), for a loop over several fields: the error err met with the field name.
func Wrap(name string, err error) *Error {
	return &Error{format: "{" + name + "}: %w", args: []any{err}, fields: []string{name}, err: err}
}

// Error spells each field by its Config name: "{Mode} %q: …" reads "Mode "x": …".
func (e *Error) Error() string { return e.Named(func(f string) string { return f }) }

// Named spells each field as name returns it, e.g. as the flag of a command that sets it.
func (e *Error) Named(name func(field string) string) string {
	format := placeholder.ReplaceAllStringFunc(e.format, func(p string) string {
		return strings.ReplaceAll(name(p[1:len(p)-1]), "%", "%%")
	})
	return fmt.Errorf(format, e.args...).Error()
}

// Fields returns the fields the text names, in the order it names them.
func (e *Error) Fields() []string { return e.fields }

// Unwrap returns what %w wrapped, or nil.
func (e *Error) Unwrap() error { return e.err }
