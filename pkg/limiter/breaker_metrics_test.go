package limiter

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// breakerStates reads edgeguard_limiter_breaker_state by shard.
func breakerStates(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	out, err := gatherBreakerStates(reg)
	require.NoError(t, err)
	return out
}

// gatherBreakerStates is breakerStates for a condition polled off the
// test's goroutine: it reports problems instead of failing the test.
func gatherBreakerStates(reg prometheus.Gatherer) (map[string]float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "edgeguard_limiter_breaker_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "shard" {
				return nil, fmt.Errorf("breaker state labels %v, want shard only", m.GetLabel())
			}
			out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}

// The breaker state is exported per shard: a dead shard shows open, a
// healthy one closed (not only the worst of them).
func TestBreakerStateMetricPerShard(t *testing.T) {
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &shardedStore{MemoryStore: NewMemoryStore(WithClock(clock.now)), down: map[string]bool{"a": true}, calls: map[string]int{}}
	reg := prometheus.NewPedanticRegistry()
	l, err := New(st, Config{Timeout: time.Second, BreakerFailures: 3, BreakerCooldown: time.Second}, reg, nil)
	require.NoError(t, err)
	l.now = clock.now
	require.Empty(t, breakerStates(t, reg), "no shard seen yet")

	decide := func() {
		_, err := l.Decide(context.Background(), []Check{
			{Limit: lim("a-key", limit.FixedWindow, 100, time.Minute), Cost: 1},
			{Limit: lim("b-key", limit.FixedWindow, 100, time.Minute), Cost: 1},
		})
		require.NoError(t, err)
	}
	decide()
	require.Equal(t, map[string]float64{"a": 0, "b": 0}, breakerStates(t, reg), "a shard appears closed when first used")
	for range 3 {
		decide()
	}
	require.Equal(t, map[string]float64{"a": float64(breakerOpen), "b": 0}, breakerStates(t, reg))

	// After the cooldown a probe goes through (in the background); the
	// shard is back.
	st.mu.Lock()
	st.down["a"] = false
	st.mu.Unlock()
	clock.add(time.Second)
	decide()
	want := map[string]float64{"a": 0, "b": 0}
	require.Eventually(t, func() bool {
		got, err := gatherBreakerStates(reg)
		return err == nil && maps.Equal(got, want)
	}, 5*time.Second, time.Millisecond)
	require.Equal(t, want, breakerStates(t, reg))
}

// A store that is not sharded has one breaker, labelled "store".
func TestBreakerStateMetricUnsharded(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	l, err := New(NewMemoryStore(), Config{Timeout: time.Second}, reg, nil)
	require.NoError(t, err)
	_, err = l.Decide(context.Background(), []Check{{Limit: lim("k", limit.FixedWindow, 1, time.Minute), Cost: 1}})
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"store": 0}, breakerStates(t, reg))
}
