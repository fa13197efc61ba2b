package shedder

import (
	rtmetrics "runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDeltaQuantile(t *testing.T) {
	buckets := []float64{0, 0.001, 0.01, 0.1, 1}
	prev := &rtmetrics.Float64Histogram{Buckets: buckets, Counts: []uint64{100, 0, 5, 0}}
	cur := &rtmetrics.Float64Histogram{Buckets: buckets, Counts: []uint64{197, 2, 5, 1}}
	// New since prev: 97 under 1ms, 2 in [1ms, 10ms), 1 in [100ms, 1s).
	require.Equal(t, 0.1, deltaQuantile(prev, cur, 1))
	require.Equal(t, 0.001, deltaQuantile(prev, cur, 0.98))
	require.Equal(t, 0.0, deltaQuantile(prev, cur, 0.5))
	require.Equal(t, 0.0, deltaQuantile(cur, cur, 1), "nothing new")
	require.Equal(t, 0.01, deltaQuantile(nil, prev, 1), "no previous read: everything counts")
}

func TestLagProbeMeasuresLateTicks(t *testing.T) {
	p := NewLagProbe()
	now := time.Now()
	require.GreaterOrEqual(t, p.Measure(now.Add(-300*time.Millisecond), now), 300*time.Millisecond)
}

// TestRuntimeLagDrivesTheRamp: with idle workers but a lag of twice
// runtime_lag_bad, the ramp sheds as if the node were saturated; without
// runtime_lag_bad it ignores the lag.
func TestRuntimeLagDrivesTheRamp(t *testing.T) {
	for _, tc := range []struct {
		bad  time.Duration
		shed bool
	}{{100 * time.Millisecond, true}, {0, false}} {
		cfg := rawConfig()
		cfg.RuntimeLagBad = tc.bad
		s := newShedder(t, cfg)
		now := time.Unix(0, 0)
		s.ObserveLag(200 * time.Millisecond)
		for range 200 {
			s.ObserveUtilization(now, 0.1)
			now = now.Add(time.Second)
		}
		if tc.shed {
			require.Equal(t, 1.0, s.Level())
			require.False(t, s.Admit(now, TierWrite))
		} else {
			require.Less(t, s.Level(), 0.0)
			require.True(t, s.Admit(now, TierWrite))
		}
	}
}
