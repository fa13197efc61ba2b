package rules_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// accuracy: leased (with its tolerance) survives parsing, marshalling and
// compilation, takes its default tolerance, changes the version, and is
// refused where it cannot hold its bound.
func TestRuleAccuracyField(t *testing.T) {
	const plain = `
version: 1
rules:
  - id: login
    key: [ip]
    algorithm: fixed_window
    limit: 10
    window: 1m
`
	exact, err := rules.Parse([]byte(plain))
	require.NoError(t, err)
	spelled, err := rules.Parse([]byte(plain + "    accuracy: exact\n"))
	require.NoError(t, err)
	require.Equal(t, rules.Version(exact), rules.Version(spelled), "exact is the default, one spelling")

	leased, err := rules.Parse([]byte(plain + "    accuracy: leased\n"))
	require.NoError(t, err)
	require.Equal(t, rules.AccuracyLeased, leased.Rules[0].Accuracy)
	require.InDelta(t, rules.DefaultTolerance, leased.Rules[0].Tolerance, 0)
	require.NotEqual(t, rules.Version(exact), rules.Version(leased))
	wider, err := rules.Parse([]byte(plain + "    accuracy: leased\n    tolerance: 0.1\n"))
	require.NoError(t, err)
	require.NotEqual(t, rules.Version(leased), rules.Version(wider))

	out, err := rules.Marshal(wider)
	require.NoError(t, err)
	again, err := rules.Parse(out)
	require.NoError(t, err)
	require.Equal(t, rules.Version(wider), rules.Version(again), "marshalled: %s", out)

	snap, err := rules.Compile(wider)
	require.NoError(t, err)
	require.InDelta(t, 0.1, snap.Rules()[0].Tolerance, 0)
	snap, err = rules.Compile(exact)
	require.NoError(t, err)
	require.Zero(t, snap.Rules()[0].Tolerance)

	for name, tail := range map[string]string{
		"unknown accuracy":     "    accuracy: roughly\n",
		"tolerance when exact": "    tolerance: 0.1\n",
		"tolerance too large":  "    accuracy: leased\n    tolerance: 0.6\n",
		"tolerance too small":  "    accuracy: leased\n    tolerance: 0.0001\n",
		"negative tolerance":   "    accuracy: leased\n    tolerance: -0.1\n",
		"tolerance not number": "    accuracy: leased\n    tolerance: lots\n",
	} {
		_, err := rules.Parse([]byte(plain + tail))
		require.Error(t, err, name)
	}
	_, err = rules.Parse([]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 5, window: 1m, accuracy: leased}\n"))
	require.ErrorContains(t, err, "sliding_log cannot be leased")
	_, err = rules.Parse([]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: token_bucket, limit: 5, window: 1m, accuracy: leased, tolerance: 0.2}\n"))
	require.NoError(t, err)
}
