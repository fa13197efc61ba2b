package region

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffSteps(t *testing.T) {
	var steps []time.Duration
	for b := backoffMin; len(steps) < 10; b = nextBackoff(b) {
		steps = append(steps, b)
	}
	require.Equal(t, []time.Duration{
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond,
		10 * time.Second, 10 * time.Second, 10 * time.Second,
	}, steps)
}

func TestJittered(t *testing.T) {
	for _, tc := range []struct {
		name string
		base time.Duration
		r    float64
		want time.Duration
	}{
		{"lowest draw waits half the step", time.Second, 0, 500 * time.Millisecond},
		{"middle draw", time.Second, 0.5, 750 * time.Millisecond},
		{"highest draw stays under the step", time.Second, 0.999, 999500 * time.Microsecond},
		{"out-of-range draws are clamped", time.Second, 7, time.Second},
		{"negative draw", time.Second, -1, 500 * time.Millisecond},
		{"largest step", backoffMax, 0.25, 6250 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, jittered(tc.base, tc.r))
		})
	}
}

// A fleet that lost Consul at the same moment does not retry in
// lock-step: after a few steps the edges' retries are spread over
// seconds, not stacked on one instant.
func TestBackoffSpreadsAFleet(t *testing.T) {
	const edges = 200
	rng := rand.New(rand.NewPCG(1, 2))
	at := make([]time.Duration, edges) // when each edge sends its 6th retry
	for e := range at {
		base := backoffMin
		for range 6 {
			at[e] += jittered(base, rng.Float64())
			base = nextBackoff(base)
		}
	}
	slices.Sort(at)
	// Without jitter every edge would retry at exactly 6.3s.
	spread := at[edges-1] - at[0]
	require.Greater(t, spread, time.Second, "retries spread over more than a second")
	require.GreaterOrEqual(t, at[0], 3150*time.Millisecond, "never sooner than half the steps")
	require.LessOrEqual(t, at[edges-1], 6300*time.Millisecond, "never later than the steps")
	// No instant (100ms bucket) carries more than a fifth of the fleet.
	buckets := map[time.Duration]int{}
	for _, a := range at {
		buckets[a/(100*time.Millisecond)]++
	}
	for b, n := range buckets {
		require.LessOrEqual(t, n, edges/5, "bucket %v", b*100*time.Millisecond)
	}
}
