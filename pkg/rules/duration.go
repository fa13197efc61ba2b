package rules

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML as a Go duration string
// ("1m", "250ms"). Bare numbers are rejected: "60" could mean seconds or
// nanoseconds, and guessing wrong silently changes a limit by 10^9.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML accepts a scalar Go duration string. Errors are returned as
// *yaml.TypeError so the decoder keeps going and reports them together with
// unknown fields and other type errors.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration must be a string like \"1m\" or \"250ms\"", n.Line)}}
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: invalid duration %q (want e.g. \"1m\", \"250ms\"): %v", n.Line, n.Value, err)}}
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration string so documents round-trip.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// MarshalText makes JSON output readable too.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText is the JSON counterpart of UnmarshalYAML.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: %w", b, err)
	}
	*d = Duration(v)
	return nil
}
