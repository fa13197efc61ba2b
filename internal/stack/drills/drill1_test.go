package drills

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Drill 1's witness judges a sample by its count of fallback decisions,
// not by their share: a killed master holding 1 of the 24 keys sends a
// twenty-fourth of the decisions to the fallback, and that is the kill
// reaching the request path all the same.
func TestDrill1WitnessCountsFallbackDecisions(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	before := decisions{at: at(0), redis: 1000, fallback: 0}
	quiet := decisions{at: at(3000), redis: 2080, fallback: 0}
	baseline := quiet.fallbackRate(before)
	require.Zero(t, baseline)

	// 90 decisions in 250 ms, the dead master's one key making 4 of them.
	oneKey := decisions{at: at(3250), redis: 2166, fallback: 4}
	require.Less(t, 4.0/90, 0.2, "the share alone would miss it")
	require.True(t, oneKey.inFallback(quiet, baseline))
	// Two stray decisions are a busy host, not a dead master.
	stray := decisions{at: at(3250), redis: 2168, fallback: 2}
	require.False(t, stray.inFallback(quiet, baseline))

	// A host whose fallback decides 20 a second anyway: a sample needs
	// more than twice that (10 in 250 ms).
	busy := decisions{at: at(3000), redis: 2020, fallback: 60}
	rate := busy.fallbackRate(before)
	require.InDelta(t, 20, rate, 1e-9)
	require.False(t, decisions{at: at(3250), redis: 2100, fallback: 70}.inFallback(busy, rate))
	require.True(t, decisions{at: at(3250), redis: 2100, fallback: 71}.inFallback(busy, rate))
	require.Equal(t, at(3250), later(at(3250), time.Time{}))
}
