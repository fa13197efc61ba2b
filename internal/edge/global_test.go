package edge

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

const globalPlan = `
version: 1
rules:
  - id: plan
    key: [header:X-Api-Key]
    algorithm: fixed_window
    limit: 10
    window: 1h
    scope: global
    tolerance: 0.2
`

// Two regions, each with its own Consul datacenter, Redis and edge, and
// the region catalog in both datacenters: a client alternating between
// the regions gets one quota, not one per region; when a key's home
// Redis goes, the other region's edge decides from the static share and
// says so in its registration, which regions status shows.
func TestGlobalRuleAcrossRegions(t *testing.T) {
	eu, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer eu.Close()
	us, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "us-east"})
	require.NoError(t, err)
	defer us.Close()
	require.NoError(t, eu.JoinWAN(us))
	redisOf := map[string]*testenv.Standalone{}
	for _, name := range []string{"eu-west", "us-east"} {
		s, err := testenv.StartStandalone(testenv.StandaloneOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		redisOf[name] = s
	}
	rc := regionClient(t, eu)
	cat := region.Catalog{Regions: []region.CatalogRegion{{Name: "eu-west", Redis: redisOf["eu-west"].URL()}, {Name: "us-east", Redis: redisOf["us-east"].URL()}}}
	catFile := filepath.Join(t.TempDir(), "catalog.json")
	data, err := json.Marshal(cat)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(catFile, data, 0o600))
	out, code := regionctlRun(t, "--consul", eu.HTTPAddr(), "catalog", "push", catFile)
	require.Equal(t, 0, code, out)
	require.Equal(t, "eu-west: region catalog written (2 regions)\nus-east: region catalog written (2 regions)\n", out)
	for _, name := range cat.Names() {
		push(t, rc, name, rc.Layout().GlobalRules(), globalPlan)
	}
	cacheDir := t.TempDir()
	edges := map[string]*running{}
	for name, c := range map[string]*testenv.Consul{"eu-west": eu, "us-east": us} {
		edges[name] = startConsulEdge(t, name, "p1", c.HTTPAddr(), filepath.Join(cacheDir, name+".yaml"), func(cfg *config.Config) {
			cfg.Redis = redisOf[name].URL()
			cfg.KeySalt = "one-salt-for-every-region" // a global rule's key is the same everywhere
		})
	}
	want := effectiveVersion(t, globalPlan, "")
	for name, r := range edges {
		other := "us-east"
		if name == other {
			other = "eu-west"
		}
		waitVersion(t, r, want, time.Now())
		require.Eventually(t, func() bool {
			return strings.Contains(scrape(t, r), fmt.Sprintf(`edgeguard_limiter_global_fallback_share{home=%q} 0`, other))
		}, 10*time.Second, 20*time.Millisecond, "%s never loaded the region catalog", name)
	}

	// One client, alternating regions: one quota of 10 (carved from
	// 10 + ⌊10 × 0.1⌋, at most 12 with the overdraft), not 10 per region,
	// all in one hour's window.
	testenv.EarlyInWindow(time.Hour, 30*time.Second)
	ok := 0
	for range 15 {
		for _, name := range cat.Names() {
			if codes(t, edges[name], 1, "/", "X-Api-Key", "tenant-1")[0] == 200 {
				ok++
			}
		}
	}
	t.Logf("admitted %d of 30 across two regions (limit 10)", ok)
	require.LessOrEqual(t, ok, 12, "counted per region")
	require.GreaterOrEqual(t, ok, 8, "quota stranded")

	// The key's home: the region whose edge decided it as home.
	home := ""
	for name, r := range edges {
		if strings.Contains(scrape(t, r), fmt.Sprintf(`edgeguard_limiter_global_decisions_total{from="home",home=%q}`, name)) {
			home = name
		}
	}
	require.NotEmpty(t, home)
	away := "us-east"
	if home == away {
		away = "eu-west"
	}
	// The home's Redis freezes: the away edge's leases time out for the
	// keys homed there, it decides them from the share, and says so.
	redisOf[home].Freeze()
	defer redisOf[home].Thaw() // before the edges stop: nothing left dialing
	require.Eventually(t, func() bool {
		for i := range 8 {
			codes(t, edges[away], 1, "/", "X-Api-Key", fmt.Sprintf("tenant-%d", 100+i))
		}
		out, _ := regionctlRun(t, "--consul", eu.HTTPAddr(), "regions", "status", "--region", away)
		return strings.Contains(out, "global share for "+home) && strings.Contains(out, "1 edge deciding from the static share")
	}, 20*time.Second, 100*time.Millisecond, "regions status never showed the static share")
	require.Contains(t, scrape(t, edges[away]), fmt.Sprintf(`edgeguard_limiter_global_fallback_share{home=%q} 1`, home))
}
