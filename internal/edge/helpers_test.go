package edge

import (
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limiter"
)

func limiterFailMode(t *testing.T, s string) limiter.FailMode {
	m, err := limiter.ParseFailMode(s)
	require.NoError(t, err)
	return m
}

// metricValue is the value of an unlabelled (but for region/pop) metric.
func metricValue(t *testing.T, r *running, name string) float64 {
	return metricSum(t, r, name)
}

// metricSum adds up the series of a metric whose labels match the given
// name/value pairs, parsed with Prometheus's own text parser.
func metricSum(t *testing.T, r *running, name string, match ...string) float64 {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(scrape(t, r)))
	require.NoError(t, err)
	mf, ok := mfs[name]
	require.True(t, ok, "metric %s not exported", name)
	var sum float64
series:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(match); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == match[i] && l.GetValue() == match[i+1]
			}
			if !found {
				continue series
			}
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}
