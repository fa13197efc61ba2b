package logevery

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestGate(t *testing.T) {
	var g Gate
	t0 := time.Unix(1000, 0)
	ok, n := g.Allow(t0)
	require.True(t, ok)
	require.Zero(t, n)
	for i := 1; i <= 5; i++ {
		ok, _ = g.Allow(t0.Add(time.Duration(i) * time.Second))
		require.False(t, ok, "within 30 s of the last line")
	}
	ok, n = g.Allow(t0.Add(Every))
	require.True(t, ok)
	require.Equal(t, 5, n, "the held-back lines are counted")
}
