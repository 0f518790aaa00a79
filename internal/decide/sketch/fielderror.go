package sketch

import (
	"fmt"
	"strings"
)

// FieldError is a configuration value out of its range. Its message names
// each value it is about by a neutral name ("window", "limit", "established
// level 2 limit", "IPv4 prefixes"); a caller that presents the configuration
// under other names (the Caddy module's JSON fields, its Caddyfile options)
// renders the same error with its own names through Render.
type FieldError struct {
	// Values are the values the error is about.
	Values []FieldValue
	// Format places them: one %s per value, in order.
	Format string
}

// FieldValue is one value of a FieldError: its neutral name and the value as
// printed.
type FieldValue struct {
	Name, Value string
}

// fieldError builds a FieldError: format has one %s per value, values are
// name and value pairs.
func fieldError(format string, values ...FieldValue) *FieldError {
	return &FieldError{Values: values, Format: format}
}

// value names a value of a FieldError.
func value(name string, v any) FieldValue { return FieldValue{Name: name, Value: fmt.Sprint(v)} }

// Error renders the message with the neutral names.
func (e *FieldError) Error() string { return e.Render(nil) }

// Render renders the message, each value as show renders it; a nil show
// writes "name value".
func (e *FieldError) Render(show func(FieldValue) string) string {
	if show == nil {
		show = func(v FieldValue) string { return strings.TrimSpace(v.Name + " " + v.Value) }
	}
	args := make([]any, len(e.Values))
	for i, v := range e.Values {
		args[i] = show(v)
	}
	return fmt.Sprintf(e.Format, args...)
}
