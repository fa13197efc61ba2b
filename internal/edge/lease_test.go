package edge

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// A leased rule reaches the limiter as a leased check: the edge admits at
// most limit × (1 + tolerance) (here, alone, exactly that), most decisions
// come from its allowance (reason lease), and clients see the rule's own
// limit in RateLimit-Policy.
func TestLeasedRule(t *testing.T) {
	r := startEdge(t, `
version: 1
rules:
  - id: tenant
    key: [host]
    algorithm: fixed_window
    limit: 10
    window: 1h
    accuracy: leased
    tolerance: 0.2
    metrics: true
`, nil)
	testenv.EarlyInWindow(time.Hour, 20*time.Second) // every count in one window
	got := codes(t, r, 14, "/")
	require.Equal(t, []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429}, got)
	resp := r.get(t, "/")
	require.Equal(t, `"tenant";q=10;w=3600`, resp.Header.Get("RateLimit-Policy"))
	m := scrape(t, r)
	require.Contains(t, m, `edgeguard_edge_decisions_total{decision="allowed",reason="lease",rule="tenant"}`)
	require.Contains(t, m, `edgeguard_limiter_lease_carved_units_total 12`)
}
