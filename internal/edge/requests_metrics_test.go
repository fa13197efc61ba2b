package edge

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/promtext"
)

// Requests are counted by outcome and shedder tier, so a tier's success
// ratio can be computed.
func TestRequestsCountedByTier(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) {
		c.TrustedProxies = append(c.TrustedProxies, mustPrefix("127.0.0.1/32"))
	})
	// perIP admits 3 per client per minute; each tier comes from its own client.
	sent := []struct {
		client, priority string
		n                int
	}{
		{"203.0.113.1", "critical", 5},
		{"203.0.113.2", "", 4}, // GET: read
		{"203.0.113.3", "write", 1},
	}
	for _, s := range sent {
		h := []string{"X-Forwarded-For", s.client}
		if s.priority != "" {
			h = append(h, "X-Priority", s.priority)
		}
		codes(t, r, s.n, "/", h...)
	}

	mfs, err := promtext.Parse(strings.NewReader(scrape(t, r)))
	require.NoError(t, err)
	got := map[[2]string]float64{}
	for _, m := range mfs["edgeguard_edge_requests_total"].GetMetric() {
		var outcome, tier string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "outcome":
				outcome = l.GetValue()
			case "tier":
				tier = l.GetValue()
			}
		}
		got[[2]string{outcome, tier}] = m.GetCounter().GetValue()
	}
	require.Equal(t, map[[2]string]float64{
		{"proxied", "critical"}: 3, {"denied", "critical"}: 2,
		{"proxied", "read"}: 3, {"denied", "read"}: 1,
		{"proxied", "write"}: 1,
	}, nonZero(got))
	require.Contains(t, got, [2]string{"shed", "test"}, "every outcome and tier is exported from the start")
}

func nonZero[K comparable](m map[K]float64) map[K]float64 {
	out := map[K]float64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}
