package rlsconfig

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseErrors: every problem names the file and line, the descriptor's
// path and the field, and all of a document's problems come at once.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"empty", "", []string{"f.yaml: empty document"}},
		{"syntax", "domain: [", []string{"f.yaml:1: "}},
		{"no domain", "descriptors: []\n", []string{"f.yaml:1: domain: required and not empty"}},
		{"unknown top key", "domain: d\ndescriptor: []\n", []string{"f.yaml:2: descriptor: unknown key (want domain, descriptors)"}},
		{"two documents", "domain: d\n---\ndomain: e\n", []string{"f.yaml:2: more than one YAML document"}},
		{"repeated key", "domain: d\ndomain: e\n", []string{"f.yaml:2: domain: repeated key"}},
		{"descriptors not a list", "domain: d\ndescriptors: {key: a}\n", []string{"f.yaml:2: descriptor d: descriptors: want a list of descriptors, got a mapping"}},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", []string{"f.yaml:3: descriptor d: descriptors[0].key: required and not empty"}},
		{"unknown descriptor key", `domain: d
descriptors:
  - key: a
    rate_limits: {unit: second}
`, []string{"f.yaml:4: descriptor d: descriptors[0].rate_limits: unknown key"}},
		{"metadata not a mapping", `domain: d
descriptors:
  - key: a
    metadata: [x]
`, []string{"f.yaml:4: descriptor d: descriptors[0].metadata: want a mapping, got a list"}},
		{"bad unit, nested path", `domain: api
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: path
        value: /login
        rate_limit:
          unit: hours
          requests_per_unit: 5
`, []string{`f.yaml:9: descriptor api.tenant_acme.path_/login: rate_limit.unit: invalid unit "hours" (want second, minute, hour, day, week, month or year)`}},
		{"missing unit", `domain: d
descriptors:
  - key: a
    rate_limit:
      requests_per_unit: 5
`, []string{"f.yaml:5: descriptor d.a: rate_limit.unit: required"}},
		{"missing requests_per_unit", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second}
`, []string{"f.yaml:4: descriptor d.a: rate_limit.requests_per_unit: required"}},
		{"negative requests_per_unit", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: -1}
`, []string{`f.yaml:4: descriptor d.a: rate_limit.requests_per_unit: want a whole number from 0 to 4294967295, got "-1"`}},
		{"unit with unlimited", `domain: d
descriptors:
  - key: a
    rate_limit:
      unlimited: true
      unit: second
`, []string{"f.yaml:6: descriptor d.a: rate_limit.unit: must not be set when unlimited"}},
		{"bool as a string", `domain: d
descriptors:
  - key: a
    shadow_mode: "yes"
    rate_limit: {unit: second, requests_per_unit: 1}
`, []string{`f.yaml:4: descriptor d: descriptors[0].shadow_mode: want true or false, got "yes"`}},
		{"replaces itself and empty", `domain: d
descriptors:
  - key: a
    rate_limit:
      name: n
      replaces: [{name: n}, {name: ""}]
      unit: second
      requests_per_unit: 1
`, []string{`descriptor d.a: rate_limit.replaces: must not name this limit itself ("n")`, "f.yaml:6: descriptor d.a: rate_limit.replaces[1].name: required and not empty"}},
		{"duplicate", `domain: d
descriptors:
  - key: a
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: v
    rate_limit: {unit: second, requests_per_unit: 2}
`, []string{"f.yaml:6: descriptor d.a_v: duplicate descriptor (key and value already used on line 3)"}},
		{"share_threshold without wildcard", `domain: d
descriptors:
  - key: a
    value: v
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
`, []string{"f.yaml:3: descriptor d.a_v: share_threshold: only with a wildcard value"}},
		{"wildcard in key", `domain: d
descriptors:
  - key: a*
    rate_limit: {unit: second, requests_per_unit: 1}
`, []string{"f.yaml:3: descriptor d.a*: key: a wildcard '*' belongs in value"}},
		{"extension: unknown algorithm", `domain: d
descriptors:
  - key: a
    rate_limit: {algorithm: gcra2, unit: second, requests_per_unit: 1}
`, []string{`f.yaml:4: descriptor d.a: rate_limit.algorithm: unknown "gcra2" (want one of`}},
		{"extension: window and unit", `domain: d
descriptors:
  - key: a
    rate_limit: {window: 90s, unit: second, requests_per_unit: 1}
`, []string{"f.yaml:4: descriptor d.a: rate_limit.window: either unit or window"}},
		{"extension: bad window", `domain: d
descriptors:
  - key: a
    rate_limit: {window: 90, requests_per_unit: 1}
`, []string{`f.yaml:4: descriptor d.a: rate_limit.window: want a duration such as "90s" or "15m", got "90"`}},
		{"extension: a week is too long for a sliding window", `domain: d
descriptors:
  - key: a
    rate_limit: {algorithm: sliding_window, unit: week, requests_per_unit: 1}
`, []string{"f.yaml:4: descriptor d.a: rate_limit.unit: must be <= 24h0m0s"}},
		{"extension: burst on a fixed window", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}
`, []string{"f.yaml:4: descriptor d.a: rate_limit.burst: only valid for"}},
		{"requests_per_unit beyond the limiter's bound", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 4000000000}
`, []string{"f.yaml:4: descriptor d.a: rate_limit.requests_per_unit: must be <= 1000000000"}},
		{"every problem at once", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    bogus: 1
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: x}
`, []string{`f.yaml:4: descriptor d.a: rate_limit.unit: invalid unit "fortnight"`, "f.yaml:6: descriptor d: descriptors[1].bogus: unknown key", `f.yaml:9: descriptor d.b.c: rate_limit.requests_per_unit: want a whole number`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("f.yaml", []byte(tt.doc))
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalid)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
			var n int
			for _, e := range unjoin(err) {
				var fe *Error
				require.True(t, errors.As(e, &fe), "%T %v", e, e)
				n++
			}
			require.GreaterOrEqual(t, n, len(tt.want), err.Error())
		})
	}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestParseAcceptsTheReferencesKeys(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: a
    value: v*
    shadow_mode: false
    quota_mode: true
    detailed_metric: true
    value_to_metric: true
    share_threshold: true
    metadata:
      hint: {nested: [1, 2]}
    rate_limit:
      name: n
      replaces:
        - name: m
      unit: Hour
      requests_per_unit: 0
    descriptors: []
  - key: b
    descriptors:
`
	d, err := Parse("ok.yaml", []byte(doc))
	require.NoError(t, err)
	require.Equal(t, "d", d.Domain)
	require.Len(t, d.Descriptors, 2)
	a := d.Descriptors[0]
	require.True(t, a.QuotaMode && a.DetailedMetric && a.ValueToMetric && a.ShareThreshold)
	require.Equal(t, Hour, a.RateLimit.Unit)
	require.Equal(t, []string{"m"}, a.RateLimit.Replaces)
	require.Zero(t, a.RateLimit.RequestsPerUnit)
	require.Equal(t, 3, a.Line)
	require.False(t, strings.Contains(d.File, "/"))
}
