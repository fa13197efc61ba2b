package edge

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// updateReference rewrites docs/reference instead of comparing with it:
// go test ./internal/edge -run TestReferenceDocs -update-reference
var updateReference = flag.Bool("update-reference", false, "rewrite docs/reference/*.md")

// The reference tables are generated from the edge itself — every flag of
// its flag set, every metric its registry exports (with Redis, so the
// store's series are there too) — and the committed copies must match.
func TestReferenceDocs(t *testing.T) {
	r, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer r.Close()
	e := startEdge(t, referenceRules, func(c *config.Config) {
		c.Redis, c.KeySalt = r.URL(), "reference-docs-salt"
		c.AccessLog = filepath.Join(t.TempDir(), "access.log")
		c.RLS.Listen, c.RLS.ConfigDir = "127.0.0.1:0", t.TempDir() // the rate limit service's series too
		require.NoError(t, os.WriteFile(filepath.Join(c.RLS.ConfigDir, "rls.yaml"), []byte(rlsDoc), 0o600))
	})
	// Every series family appears once a request has been through.
	codes(t, e, 4, "/x")
	globalSeries(t, e, r.URL())

	docs := map[string]string{
		"flags.md":     config.Reference(),
		"metrics.md":   metricsReference(t, e),
		"rules.md":     rulesReference(t),
		"shedder.md":   shedderReference(t),
		"regionctl.md": regionctlReference(t),
	}
	dir := filepath.Join("..", "..", "docs", "reference")
	for name, want := range docs {
		path := filepath.Join(dir, name)
		if *updateReference {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
			continue
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err, "docs/reference/%s missing: go test ./internal/edge -run TestReferenceDocs -update-reference", name)
		require.Equal(t, want, string(got), "docs/reference/%s is stale: go test ./internal/edge -run TestReferenceDocs -update-reference", name)
	}
}

// referenceRules is perIP on /x, and a global rule on /g.
const referenceRules = `
version: 1
rules:
  - id: per-ip
    match:
      path_prefix: ["/x"]
    key: [ip]
    algorithm: sliding_log
    limit: 3
    window: 1m
    metrics: true
  - id: global
    match:
      path_prefix: ["/g"]
    key: ["header:X-Client"]
    algorithm: fixed_window
    limit: 100
    window: 2s
    scope: global
`

// globalSeries makes the global rules' series appear: they exist once the
// region catalog names another region (here on the same Redis) — the
// home's unit counters at 0 from then on — and the others once a key homed
// there is leased (with an overdraft the lease pays).
func globalSeries(t *testing.T, e *running, redisURL string) {
	cat := fmt.Sprintf(`{"regions": [{"name": %q, "redis": %q}, {"name": "reference-away", "redis": %q}]}`, e.cfg.Region, redisURL, redisURL)
	require.NoError(t, e.global.Apply([]byte(cat)))
	want := []string{"decisions_total", "lease_calls_total", "leased_units_total", "returned_units_total",
		"settled_units_total", "outstanding_units", "debt_units", "fallback_share"}
	client := 0
	var missing []string
	require.Eventually(t, func() bool {
		client++
		codes(t, e, 3, "/g", "X-Client", fmt.Sprintf("client-%d", client))
		fams, err := e.reg.Gather()
		require.NoError(t, err)
		have := map[string]bool{}
		for _, f := range fams {
			have[f.GetName()] = len(f.GetMetric()) > 0
		}
		missing = missing[:0]
		for _, w := range want {
			if !have["edgeguard_limiter_global_"+w] {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0
	}, 20*time.Second, 100*time.Millisecond, "every global rule series: missing %v", &missing)
}

func metricsReference(t *testing.T, e *running) string {
	fams, err := e.reg.Gather()
	require.NoError(t, err)
	sort.Slice(fams, func(i, j int) bool { return fams[i].GetName() < fams[j].GetName() })
	var b strings.Builder
	b.WriteString("# Metrics\n\nGenerated from an edge's registry (`go test ./internal/edge -run TestReferenceDocs -update-reference`).\n" +
		"`region` and `pop` are target labels: Prometheus attaches them to every series from the edge's Consul service meta " +
		"(`--metrics-region-labels` makes the edge add them itself). Go runtime (`go_*`) and process (`process_*`) metrics are the client library's.\n\n" +
		"| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, f := range fams {
		name := f.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "region" && l.GetName() != "pop" {
					labels[l.GetName()] = true
				}
			}
		}
		var ls []string
		for l := range labels {
			ls = append(ls, "`"+l+"`")
		}
		sort.Strings(ls)
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, strings.ToLower(f.GetType().String()), strings.Join(ls, ", "), strings.ReplaceAll(f.GetHelp(), "|", "\\|"))
	}
	return b.String()
}
