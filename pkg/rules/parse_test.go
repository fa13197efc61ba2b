package rules

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const fullRule = `
version: 1
rules:
  - id: per-ip
    match: {hosts: ["API.example.com"], path_prefix: ["/"], methods: ["get", "POST"]}
    key: [ip]
    algorithm: sliding_log
    limit: 100
    window: 1m
    burst: 0
    cost: 2
    min_interval: 250ms
    shadow: true
    scope: pop
    disabled: false
`

func TestParseFullRule(t *testing.T) {
	doc := mustParse(t, fullRule)
	require.Equal(t, 1, doc.Version)
	require.Len(t, doc.Rules, 1)
	r := doc.Rules[0]
	require.Equal(t, Rule{
		ID: "per-ip",
		Match: MatchSpec{
			Hosts:      []string{"api.example.com"},
			PathPrefix: []string{"/"},
			Methods:    []string{"GET", "POST"},
		},
		Key:         []string{"ip"},
		Algorithm:   "sliding_log",
		Limit:       100,
		Window:      Duration(time.Minute),
		Cost:        2,
		MinInterval: Duration(250 * time.Millisecond),
		Shadow:      true,
		Scope:       ScopePoP,
	}, r)
}

func TestParseDefaults(t *testing.T) {
	doc := mustParse(t, `
version: 1
rules:
  - {id: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s}
`)
	r := doc.Rules[0]
	require.Equal(t, int64(1), r.Cost, "omitted cost defaults to 1")
	require.Equal(t, ScopeRegion, r.Scope, "omitted scope defaults to region")
	require.Zero(t, r.Burst)
	require.False(t, r.Shadow)

	s := mustCompile(t, doc)
	require.Equal(t, int64(10), s.Rules()[0].Burst, "burst 0 compiles to capacity = limit")
}

func TestParseCostThroughMergeKey(t *testing.T) {
	doc := mustParse(t, `
version: 1
rules:
  - &a {id: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, cost: 3}
  - {<<: *a, id: b}
`)
	require.Equal(t, int64(3), doc.Rules[0].Cost)
	require.Equal(t, int64(3), doc.Rules[1].Cost, "cost inherited via a merge key is not overwritten by the default")
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // substrings of the error
		is   error
	}{
		{name: "empty", src: "", is: ErrEmpty},
		{name: "only comments", src: "# nothing\n", is: ErrEmpty},
		{name: "null document", src: "---\n", is: ErrEmpty},
		{name: "multiple documents", src: "version: 1\nrules: []\n---\nversion: 1\nrules: []\n", is: ErrMultipleDocuments},
		{name: "not a mapping", src: "- a\n- b\n", want: []string{"top level must be a mapping"}},
		{name: "missing version", src: "rules: []\n", is: ErrUnsupportedVersion, want: []string{"line 1: version: required (want 1)"}},
		{name: "version 2", src: "version: 2\nrules: []\n", is: ErrUnsupportedVersion, want: []string{`version "2" (want 1)`}},
		{name: "version string", src: "version: one\nrules: []\n", is: ErrUnsupportedVersion},
		{name: "syntax error", src: "version: 1\nrules: [\n", want: []string{"line 2: YAML syntax: "}},
		{
			name: "unknown top-level field",
			src:  "version: 1\nrulez: []\n",
			want: []string{"line 2: rulez: unknown field (did you mean rules?)"},
		},
		{
			name: "unknown rule field",
			src:  "version: 1\nrules:\n  - id: a\n    key: [ip]\n    algorithm: sliding_log\n    limit: 1\n    window: 1s\n    windw: 2s\n",
			want: []string{`line 8: rule "a": windw: unknown field (did you mean window?)`},
		},
		{
			name: "unknown match field",
			src:  "version: 1\nrules:\n  - id: a\n    match: {host: [x]}\n",
			want: []string{`line 4: rule "a": match.host: unknown field (did you mean hosts?)`},
		},
		{
			name: "unknown fields and bad duration reported together",
			src:  "version: 1\nrules:\n  - id: a\n    foo: 1\n    window: 10\n    bar: 2\n",
			want: []string{`line 4: rule "a": foo: unknown field`, `line 5: rule "a": window: want a duration such as "1m" or "250ms", got "10" (a number needs a unit`, `line 6: rule "a": bar: unknown field`},
		},
		{
			name: "duplicate key",
			src:  "version: 1\nrules:\n  - id: a\n    id: b\n",
			want: []string{`line 4: rule "a": id: repeated (first at line 3)`},
		},
		{
			name: "wrong type",
			src:  "version: 1\nrules:\n  - id: a\n    limit: lots\n",
			want: []string{"line 4", "lots"},
		},
		{
			name: "validation errors are all reported",
			src:  "version: 1\nrules:\n  - id: a\n    key: [ip]\n    algorithm: sliding_log\n    limit: 0\n    window: 1m\n  - id: b\n    key: [ip]\n    algorithm: leaky\n    limit: 1\n    window: 1m\n",
			want: []string{"invalid document", `rule "a": limit: must be > 0 (got 0)`, `rule "b": algorithm: unknown "leaky"`},
		},
		{
			name: "explicit cost 0",
			src:  "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 1, window: 1s, cost: 0}\n",
			want: []string{`rule "a": cost: must be >= 1 (got 0)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := Parse([]byte(tc.src))
			require.Error(t, err)
			require.Nil(t, doc)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestParseDurations(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: "1m", want: time.Minute},
		{in: "250ms", want: 250 * time.Millisecond},
		{in: "1h30m", want: 90 * time.Minute},
		{in: `"2s"`, want: 2 * time.Second},
		{in: "60", err: `got "60" (a number needs a unit`},
		{in: "1 minute", err: `got "1 minute"`},
		{in: "abc", err: `got "abc"`},
		{in: "[1m]", err: `want a duration such as "1m" or "250ms", got a list`},
		{in: "{a: 1}", err: `want a duration such as "1m" or "250ms", got a mapping`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			src := "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 1, window: " + tc.in + "}\n"
			doc, err := Parse([]byte(src))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, err, "line 3")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, doc.Rules[0].Window.D())
		})
	}
}

func TestDurationText(t *testing.T) {
	var d Duration
	require.NoError(t, d.UnmarshalText([]byte("1m30s")))
	require.Equal(t, 90*time.Second, d.D())
	b, err := d.MarshalText()
	require.NoError(t, err)
	require.Equal(t, "1m30s", string(b))
	require.Error(t, d.UnmarshalText([]byte("soon")))
}

func TestExampleRulesFile(t *testing.T) {
	data, err := os.ReadFile("../../examples/rules.yaml")
	require.NoError(t, err)
	doc, err := Parse(data)
	require.NoError(t, err)

	algos := map[Algorithm]bool{}
	for _, r := range doc.Rules {
		algos[r.Algorithm] = true
	}
	require.True(t, algos["sliding_log"] && algos["token_bucket"] && algos["concurrency"], "example covers the main algorithms")

	s := mustCompile(t, doc)
	require.Len(t, s.Rules(), len(doc.Rules))
}

func TestParseErrorsAreFieldErrors(t *testing.T) {
	_, err := Parse([]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 0, window: 0s}\n"))
	var fe *FieldError
	require.True(t, errors.As(err, &fe))
	require.Equal(t, "a", fe.RuleID)
}

// A YAML syntax error names the line with the mistake, not the line (often
// one too low) that yaml.v3 names.
func TestSyntaxErrorLines(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"unclosed flow list", "version: 1\nrules:\n  - id: a\n    key: [ip\n    algorithm: x\n", "line 4: YAML syntax: did not find expected ',' or ']'"},
		{"unclosed flow mapping", "version: 1\nrules:\n  - id: a\n    key: {ip\n", "line 4: YAML syntax: did not find expected ',' or '}'"},
		{"key indented too little", "version: 1\nrules:\n  - id: a\n    key: [ip]\n   algorithm: x\n", "line 5: YAML syntax: did not find expected '-' indicator"},
		{"tab", "version: 1\nrules:\n  - id: a\n\tkey: [ip]\n", "line 4: YAML syntax: found a tab character that violates indentation"},
		{"unclosed quote", "version: 1\nrules:\n  - id: \"a\n", "line 3: YAML syntax: found unexpected end of stream"},
		{"colon in a plain value", "version: 1\nrules:\n  - id: a\n    key: [ip]\n  - id: b: c\n", "line 5: YAML syntax: mapping values are not allowed in this context"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.src))
			require.EqualError(t, err, "rules: invalid document:\n"+tc.want)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
		})
	}
}
