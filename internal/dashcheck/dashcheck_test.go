package dashcheck

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQueryHelpers(t *testing.T) {
	for name, tc := range map[string]struct {
		expr    string
		groupBy []string
		metrics []string
	}{
		"quantile drops le": {`histogram_quantile(0.99, sum by (le, region, pop) (rate(edgeguard_edge_request_duration_seconds_bucket{x="y"}[5m])))`,
			[]string{"region", "pop"}, []string{"edgeguard_edge_request_duration_seconds"}},
		"outermost first": {`count by (region) (count by (region, version) (edgeguard_edge_rules_info))`,
			[]string{"region"}, []string{"edgeguard_edge_rules_info"}},
		"no aggregation": {`redis_up`, nil, []string{"redis_up"}},
		"recording rules are not metrics": {`edgeguard:requests:rate5m / on (region) redis_memory_used_bytes`,
			nil, []string{"redis_memory_used_bytes"}},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.groupBy, GroupBy(tc.expr))
			require.Equal(t, tc.metrics, MetricNames(tc.expr))
		})
	}

	got, err := Substitute(`x{region=~"$region", pop=~"${pop}"}[$__rate_interval]`, map[string]string{"region": "(a|b)", "pop": "p", "__rate_interval": "4s"})
	require.NoError(t, err)
	require.Equal(t, `x{region=~"(a|b)", pop=~"p"}[4s]`, got)
	_, err = Substitute(`x{a=~"$nope"}`, map[string]string{})
	require.ErrorContains(t, err, "unknown variable $nope")

	require.Equal(t, `(127\\.0\\.0\\.1:9090|b)`, MultiValue([]string{"127.0.0.1:9090", "b"}))
	require.Equal(t, []string{"region", "pop"}, LegendLabels("{{region}}/{{ pop }} x"))
}
