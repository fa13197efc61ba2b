package rules_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// metrics: true survives parsing, marshalling and compilation, and changes
// the version (edges must pick the change up).
func TestRuleMetricsField(t *testing.T) {
	const plain = `
version: 1
rules:
  - id: login
    key: [ip]
    algorithm: fixed_window
    limit: 10
    window: 1m
`
	labelled := plain + "    metrics: true\n"
	off, err := rules.Parse([]byte(plain))
	require.NoError(t, err)
	on, err := rules.Parse([]byte(labelled))
	require.NoError(t, err)
	require.False(t, off.Rules[0].Metrics)
	require.True(t, on.Rules[0].Metrics)
	require.NotEqual(t, rules.Version(off), rules.Version(on))

	out, err := rules.Marshal(on)
	require.NoError(t, err)
	again, err := rules.Parse(out)
	require.NoError(t, err)
	require.True(t, again.Rules[0].Metrics, "marshalled: %s", out)

	snap, err := rules.Compile(on)
	require.NoError(t, err)
	require.True(t, snap.Rules()[0].Metrics)

	_, err = rules.Parse([]byte(plain + "    metrics: yes please\n"))
	require.Error(t, err, "metrics is a boolean")
}
