package rules_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// scope: global makes a rule leased (default tolerance), survives
// marshalling and compilation, and is refused where a global quota makes
// no sense.
func TestRuleScopeGlobal(t *testing.T) {
	const plain = `
version: 1
rules:
  - id: plan
    key: [header:X-Api-Key]
    algorithm: fixed_window
    limit: 1000
    window: 1m
`
	doc, err := rules.Parse([]byte(plain + "    scope: global\n"))
	require.NoError(t, err)
	r := doc.Rules[0]
	require.Equal(t, rules.ScopeGlobal, r.Scope)
	require.Equal(t, rules.AccuracyLeased, r.Accuracy, "a global rule is leased")
	require.InDelta(t, rules.DefaultTolerance, r.Tolerance, 0)

	region, err := rules.Parse([]byte(plain))
	require.NoError(t, err)
	require.NotEqual(t, rules.Version(region), rules.Version(doc))

	out, err := rules.Marshal(doc)
	require.NoError(t, err)
	again, err := rules.Parse(out)
	require.NoError(t, err)
	require.Equal(t, rules.Version(doc), rules.Version(again), "marshalled: %s", out)

	snap, err := rules.Compile(doc)
	require.NoError(t, err)
	require.Equal(t, rules.ScopeGlobal, snap.Rules()[0].Scope)
	require.InDelta(t, rules.DefaultTolerance, snap.Rules()[0].Tolerance, 0)

	wider, err := rules.Parse([]byte(plain + "    scope: global\n    tolerance: 0.1\n"))
	require.NoError(t, err)
	require.InDelta(t, 0.1, wider.Rules[0].Tolerance, 0)

	for name, c := range map[string]struct{ doc, want string }{
		"exact": {plain + "    scope: global\n    accuracy: exact\n", "would wait on another region"},
		"token bucket": {"version: 1\nrules:\n  - {id: a, key: [ip], algorithm: token_bucket, limit: 5, window: 1m, scope: global}\n",
			"global is only for fixed_window rules (got token_bucket)"},
		"sliding log": {"version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 5, window: 1m, scope: global}\n",
			"global is only for fixed_window rules"},
		"count_if":    {plain + "    scope: global\n    count_if: {status: [\"401\"]}\n", "cannot count after the response"},
		"cost_header": {plain + "    scope: global\n    cost_header: X-Cost\n", "cannot count after the response"},
	} {
		_, err := rules.Parse([]byte(c.doc))
		require.ErrorContains(t, err, c.want, name)
	}
}
