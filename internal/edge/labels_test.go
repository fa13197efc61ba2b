package edge

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

const oneRule = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 10
    window: 1m
    metrics: true
`

// region and pop are target labels by default (Prometheus attaches them
// from the Consul service meta); --metrics-region-labels puts them on every
// edgeguard series for a Prometheus that cannot.
func TestRegionLabelsOptIn(t *testing.T) {
	labelled := regexp.MustCompile(`(?m)^edgeguard_\w+\{[^}]*\b(region|pop)=`)
	edgeguard := regexp.MustCompile(`(?m)^edgeguard_\w+`)
	for _, tc := range []struct {
		name string
		on   bool
	}{{"default", false}, {"opted-in", true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := startEdge(t, oneRule, func(c *config.Config) {
				c.Region, c.PoP, c.MetricsRegionLabels = "eu-west", "ams", tc.on
			})
			require.Equal(t, 200, r.get(t, "/").StatusCode)
			m := scrape(t, r)
			series := edgeguard.FindAllString(m, -1)
			require.NotEmpty(t, series)
			if !tc.on {
				require.Empty(t, labelled.FindAllString(m, -1), "no series carries region or pop")
				return
			}
			require.Len(t, labelled.FindAllString(m, -1), len(series), "every edgeguard series carries region and pop")
			require.Contains(t, m, `edgeguard_edge_decisions_total{decision="allowed",pop="ams",reason="memory",region="eu-west",rule="per-ip"} 1`)
		})
	}
}

// Only rules with metrics: true have a rule label of their own; the others'
// decisions are counted under rule="_other", however many rules there are.
func TestRuleLabelOptIn(t *testing.T) {
	var doc strings.Builder
	doc.WriteString("version: 1\nrules:\n  - id: watched\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    window: 1h\n    metrics: true\n")
	for i := range 50 {
		fmt.Fprintf(&doc, "  - id: quiet-%d\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    window: 1h\n", i)
	}
	r := startEdge(t, doc.String(), nil)
	require.Equal(t, 200, r.get(t, "/").StatusCode)
	require.Equal(t, 429, r.get(t, "/").StatusCode)
	m := scrape(t, r)
	require.Contains(t, m, `edgeguard_edge_decisions_total{decision="allowed",reason="memory",rule="watched"} 1`+"\n")
	require.Contains(t, m, `edgeguard_edge_decisions_total{decision="allowed",reason="memory",rule="_other"} 50`+"\n")
	require.NotContains(t, m, `rule="quiet-`)
	series := regexp.MustCompile(`(?m)^edgeguard_edge_decisions_total\{`).FindAllString(m, -1)
	require.LessOrEqual(t, len(series), 4, "decisions of 51 rules: at most allowed and denied of watched and _other")
}
