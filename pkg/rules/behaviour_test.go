package rules

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/behavior"
)

// The behaviour section is checked with the rest of the document: every bad
// value named by its field, unknown fields refused.
func TestBehaviourSectionValidation(t *testing.T) {
	_, err := Parse([]byte(`version: 1
behaviour:
  mode: loud
  weights: {scan: -2}
  levels: {elevated: {limit_factor: 3}}
rules:
  - {id: a, key: [ip], algorithm: sliding_log, limit: 0, window: 1m, behaviour: true}
`))
	require.Error(t, err)
	var fields []string
	var walk func(error)
	walk = func(e error) {
		if f, ok := e.(*FieldError); ok {
			fields = append(fields, f.RuleID+"/"+f.Field)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	require.ElementsMatch(t, []string{"/behaviour.mode", "/behaviour.weights.scan", "/behaviour.levels.elevated.limit_factor", "a/limit"}, fields, err.Error())

	_, err = Parse([]byte("version: 1\nbehaviour: {mode: shadow, horizon: 60}\nrules: []\n"))
	require.ErrorContains(t, err, `invalid duration "60"`)
	_, err = Parse([]byte("version: 1\nbehaviour: {mode: shadow, wieghts: {}}\nrules: []\n"))
	require.ErrorContains(t, err, "behaviour.wieghts: unknown field (did you mean weights?)")
	_, err = Parse([]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 1, window: 1m, behaviour: maybe}\n"))
	require.Error(t, err)
}

func TestBehaviourSectionCompileMergeVersion(t *testing.T) {
	plain := "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 5, window: 1m}\n"
	opted := "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 5, window: 1m, behaviour: true}\n"
	shadow := "version: 1\nbehaviour: {mode: shadow}\nrules: []\n"
	enforce := "version: 1\nbehaviour: {mode: enforce, cooldown: 2m}\nrules: []\n"
	parse := func(s string) *Document {
		d, err := Parse([]byte(s))
		require.NoError(t, err)
		return d
	}
	// The section and the opt-in are part of what a version identifies.
	vs := map[string]bool{}
	for _, s := range []string{plain, opted, shadow, enforce} {
		vs[Version(parse(s))] = true
	}
	require.Len(t, vs, 4)

	// A region's section replaces the global one; a region without one
	// keeps the global's.
	m, err := Merge(parse(shadow), parse(opted))
	require.NoError(t, err)
	require.Equal(t, behavior.ModeShadow, m.Behaviour.Mode)
	m, err = Merge(parse(shadow), parse(enforce))
	require.NoError(t, err)
	require.Equal(t, behavior.ModeEnforce, m.Behaviour.Mode)

	s, err := Compile(m)
	require.NoError(t, err)
	require.Equal(t, behavior.ModeEnforce, s.Behaviour().Mode)
	require.Equal(t, float64(1), *s.Behaviour().Weights.Scan, "defaults filled in")
	s, err = Compile(parse(opted))
	require.NoError(t, err)
	require.Nil(t, s.Behaviour())
	require.True(t, s.Rules()[0].Behaviour)
}

// The behaviour example starts in shadow mode and opts rules in.
func TestBehaviourExample(t *testing.T) {
	data, err := os.ReadFile("../../examples/rules-behaviour.yaml")
	require.NoError(t, err)
	doc, err := Parse(data)
	require.NoError(t, err)
	require.Equal(t, behavior.ModeShadow, doc.Behaviour.Mode)
	opted := 0
	for _, r := range doc.Rules {
		if r.Behaviour {
			opted++
		}
	}
	require.Equal(t, 2, opted)
	mustCompile(t, doc)
}
