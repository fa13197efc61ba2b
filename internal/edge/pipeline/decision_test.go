package pipeline

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// TestDecisionOfFollowsWhatItCounts: the decisions counter a scratch
// remembers is used again only for the same rule, decision, source and
// pipeline; a change of any of them counts under its own labels, in its own
// pipeline's registry.
func TestDecisionOfFollowsWhatItCounts(t *testing.T) {
	pipe := func(store string) *Pipeline {
		m, err := newMetrics(prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		return &Pipeline{metrics: m, limits: limits{storeName: store}}
	}
	a, b := pipe("redis"), pipe("memory")
	login := &rules.CompiledRule{ID: "login", Metrics: true}
	search := &rules.CompiledRule{ID: "search"} // no metrics: counted as _other
	var seen decisionMemo
	for _, s := range []struct {
		e        *Pipeline
		r        *rules.CompiledRule
		decision string
		source   limiter.Source
	}{
		{a, login, "denied", limiter.SourcePrefilter},
		{a, login, "denied", limiter.SourcePrefilter},
		{a, login, "denied", limiter.SourceFallback},
		{a, login, "allowed", limiter.SourceFallback},
		{a, search, "allowed", limiter.SourceFallback},
		{b, search, "allowed", limiter.SourceFallback},
		{b, search, "allowed", limiter.SourceStore},
		{a, search, "allowed", limiter.SourceStore},
	} {
		s.e.decisionOf(&seen, s.r, s.decision, s.source).Inc()
	}
	count := func(e *Pipeline, rule, decision, reason string) float64 {
		return testutil.ToFloat64(e.metrics.decisions.WithLabelValues(rule, decision, reason))
	}
	require.Equal(t, 2.0, count(a, "login", "denied", "prefilter"))
	require.Equal(t, 1.0, count(a, "login", "denied", "fallback"))
	require.Equal(t, 1.0, count(a, "login", "allowed", "fallback"))
	require.Equal(t, 1.0, count(a, otherRules, "allowed", "fallback"))
	require.Equal(t, 1.0, count(b, otherRules, "allowed", "fallback"))
	require.Equal(t, 1.0, count(b, otherRules, "allowed", "memory"), "the store's name is its pipeline's")
	require.Equal(t, 1.0, count(a, otherRules, "allowed", "redis"))
	require.Equal(t, 5, testutil.CollectAndCount(a.metrics.decisions), "no series of a's counted in b's, or the other way")
	require.Equal(t, 2, testutil.CollectAndCount(b.metrics.decisions))
}
