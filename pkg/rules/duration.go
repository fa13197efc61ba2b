package rules

import (
	"fmt"
	"strconv"
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
// the document's other problems.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	const want = `want a duration such as "1m" or "250ms"`
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s, got %s", n.Line, want, describeNode(n))}}
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		hint := ""
		if _, numErr := strconv.ParseFloat(n.Value, 64); numErr == nil {
			hint = " (a number needs a unit: s, ms, m, h)"
		}
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s, got %q%s", n.Line, want, n.Value, hint)}}
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
