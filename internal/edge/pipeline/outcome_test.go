package pipeline

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// TestOutcomeSeries: each outcome and tier counts under its own labels, and
// each outcome's duration series appears with its first request, not
// before; a string outside the outcomes (or a tier outside the tiers)
// still counts under its labels.
func TestOutcomeSeries(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	tiers := []shedder.Tier{shedder.TierNone, shedder.TierTest, shedder.TierRead, shedder.TierWrite, shedder.TierCritical, shedder.TierCritical + 1}
	outs := append(outcomes[:], "not_an_outcome")
	n := 0
	for _, o := range outs {
		// A copy, not the constant: the outcome is found by its text.
		o = strings.Clone(o)
		require.Equal(t, n, testutil.CollectAndCount(m.duration), "%s's duration series before its first request", o)
		for i, tier := range tiers {
			for range i + 1 {
				m.request(o, tier).Inc()
			}
			m.durationOf(o).Observe(0.001)
		}
		n++
		require.Equal(t, n, testutil.CollectAndCount(m.duration), "a duration series per outcome asked for")
	}
	for _, o := range outs {
		for i, tier := range tiers {
			require.Equal(t, float64(i+1), testutil.ToFloat64(m.requests.WithLabelValues(o, tier.String())), "%s, tier %s", o, tier)
		}
		require.Equal(t, uint64(len(tiers)), histogramCount(t, m.duration.WithLabelValues(o)), o)
	}
}

func histogramCount(t *testing.T, o prometheus.Observer) uint64 {
	pb := &dto.Metric{}
	require.NoError(t, o.(prometheus.Metric).Write(pb))
	return pb.GetHistogram().GetSampleCount()
}
