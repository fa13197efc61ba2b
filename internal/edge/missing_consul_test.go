package edge

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// missingGauge is edgeguard_edge_consul_documents_missing for doc.
func missingGauge(t *testing.T, r *running, doc string) float64 {
	return metricSum(t, r, "edgeguard_edge_consul_documents_missing", "document", doc)
}

// waitMissing waits until the edge says doc is missing (want 1) or not (0).
func waitMissing(t *testing.T, r *running, doc string, want float64) {
	t.Helper()
	what := fmt.Sprintf("edgeguard_edge_consul_documents_missing{document=%q} to be %v", doc, want)
	require.NoError(t, proc.PollEvery(testenv.Within(t, 30*time.Second), 20*time.Millisecond, what, func(context.Context) error {
		if got := missingGauge(t, r, doc); got != want {
			return fmt.Errorf("it is %v", got)
		}
		return nil
	}))
}

// Issue 42, item 5: an edge enforcing rules from Consul, pointed at a Consul
// rebuilt empty (here: the same agent restarted, a dev agent keeps nothing),
// keeps enforcing its last good rules, shedder settings and enforcement
// switch; says so in a gauge and in /readyz's body, still ready; an edge
// restarted then runs its cache the same way. Only explicit documents
// clear them: rules: [] (pushed with --allow-empty), shedder set --reset,
// enforcement set enforce.
func TestAbsentConsulDocumentsKeepTheLastGood(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	cacheDir := t.TempDir()
	a := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(cacheDir, "a.yaml"))

	rulesFile := filepath.Join(t.TempDir(), "global.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(tightGlobal), 0o600))
	ctl := func(args ...string) {
		t.Helper()
		out, code := regionctlRun(t, append([]string{"--consul", c.HTTPAddr()}, args...)...)
		require.Equal(t, 0, code, out)
	}
	ctl("rules", "push", "--region", "eu-west", "--global", rulesFile)
	ctl("shedder", "set", "--region", "eu-west", "good=0.65")
	ctl("enforcement", "set", "--region", "eu-west", "enforce", "--percent", "99.99")
	v1 := effectiveVersion(t, tightGlobal, "")
	waitVersion(t, a, v1, time.Now())
	require.Eventually(t, func() bool { return a.shed.Config().Good == 0.65 }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return metricValue(t, a, "edgeguard_edge_enforced_keys_ratio") == 0.9999 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []int{200, 200, 429}, codes(t, a, 3, "/"))
	for _, doc := range []string{"rules", "shedder", "enforcement"} {
		require.Zero(t, missingGauge(t, a, doc), doc)
	}

	// Consul rebuilt empty.
	require.NoError(t, c.Stop())
	require.NoError(t, c.Start())
	for _, doc := range []string{"rules", "shedder", "enforcement"} {
		waitMissing(t, a, doc, 1)
	}
	require.Equal(t, v1, a.rules.Load().Version(), "the rules in force stay")
	resp := a.get(t, "/")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "still enforced")
	require.NotEmpty(t, resp.Header.Get("RateLimit"))
	require.NotEmpty(t, resp.Header.Get("RateLimit-Policy"))
	require.Equal(t, 0.65, a.shed.Config().Good, "the shedder settings in force stay")
	require.Equal(t, 0.9999, metricValue(t, a, "edgeguard_edge_enforced_keys_ratio"), "the switch in force stays")
	rz := getReadyz(t, a)
	require.Equal(t, http.StatusOK, rz.code, rz.body)
	require.Regexp(t, `^ready; documents missing in consul, the last good ones kept: enforcement \(since [^)]+\), rules \(since [^)]+\), shedder \(since [^)]+\)\n$`, rz.body)

	// The shedder's defaults, explicitly: shedder set --reset.
	ctl("shedder", "set", "--region", "eu-west", "--reset")
	waitMissing(t, a, "shedder", 0)
	require.Equal(t, 0.7, a.shed.Config().Good)

	// An edge restarted while Consul is still empty runs its cache.
	a.stop()
	require.NoError(t, a.stopErr)
	b := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(cacheDir, "a.yaml"))
	require.Equal(t, v1, b.rules.Load().Version())
	require.Equal(t, 1.0, missingGauge(t, b, "rules"))
	require.Equal(t, 1.0, missingGauge(t, b, "enforcement"))
	require.Equal(t, 0.9999, metricValue(t, b, "edgeguard_edge_enforced_keys_ratio"))
	require.Equal(t, []int{200, 200, 429}, codes(t, b, 3, "/"))
	rz = getReadyz(t, b)
	require.Equal(t, http.StatusOK, rz.code, rz.body)
	require.Contains(t, rz.body, "rules (since ")

	// Explicit documents clear: every rule, with --allow-empty.
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("version: 1\nrules: []\n"), 0o600))
	out, exit := regionctlRun(t, "--consul", c.HTTPAddr(), "rules", "push", "--region", "eu-west", "--global", empty)
	require.Equal(t, 4, exit, out)
	require.Contains(t, out, "--allow-empty")
	ctl("rules", "push", "--region", "eu-west", "--global", "--allow-empty", empty)
	waitMissing(t, b, "rules", 0)
	require.Empty(t, b.rules.Load().Rules())
	for range 3 {
		resp := b.get(t, "/")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Empty(t, resp.Header.Get("RateLimit"), "no rule applies")
		require.Empty(t, resp.Header.Get("RateLimit-Policy"))
	}
	ctl("enforcement", "set", "--region", "eu-west", "enforce")
	waitMissing(t, b, "enforcement", 0)
	require.Equal(t, 1.0, metricValue(t, b, "edgeguard_edge_enforced_keys_ratio"))
	require.Equal(t, readyz{http.StatusOK, "ready\n"}, getReadyz(t, b))
}

// The rate limit service's documents likewise: a Consul rebuilt empty
// leaves the configuration in force, the document counted missing, the
// service still answering from it.
func TestAbsentRLSDocumentsKeepTheConfiguration(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	f := newRLSFixture(t, c)
	out, code := f.push(t, rlsDoc) // user: 2 per hour
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool { return f.limitOf(t, "probe") == 2 }, 15*time.Second, 10*time.Millisecond)
	require.Zero(t, missingGauge(t, f.r, consullink.DocRLS))

	require.NoError(t, c.Stop())
	require.NoError(t, c.Start())
	waitMissing(t, f.r, consullink.DocRLS, 1)
	require.Equal(t, uint32(2), f.limitOf(t, "probe"), "the configuration in force stays")
	require.Contains(t, getReadyz(t, f.r).body, "rls (since ")

	out, code = f.push(t, strings.Replace(rlsDoc, "requests_per_unit: 2", "requests_per_unit: 9", 1))
	require.Equal(t, 0, code, out)
	waitMissing(t, f.r, consullink.DocRLS, 0)
	require.Equal(t, uint32(9), f.limitOf(t, "probe"))
}

// Missing is per document: the region document the rules in force came
// from, deleted by hand while the global one stays, keeps the rules (its
// overrides are not dropped), and so does a later push of the global
// document alone; an explicit region document applies both.
func TestAbsentRegionDocumentKeepsTheRules(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	layout := rc.Layout()
	off := "version: 1\nrules:\n  - id: per-ip\n    disabled: true\n"
	push(t, rc, "eu-west", layout.GlobalRules(), tightGlobal)
	push(t, rc, "eu-west", layout.RegionRules("eu-west"), off)
	a := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), "")
	v1 := effectiveVersion(t, tightGlobal, off)
	waitVersion(t, a, v1, time.Now())
	require.Equal(t, []int{200, 200, 200}, codes(t, a, 3, "/"), "the region switches per-ip off")

	// The region document deleted by hand and a new global document, in
	// one transaction: the edge's first read of either sees both, so the
	// missing gauge is the witness that it read the new global and kept
	// its rules.
	looser := strings.Replace(tightGlobal, "limit: 2", "limit: 3", 1)
	ok, resp, _, err := rc.API().Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: layout.RegionRules("eu-west")}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: layout.GlobalRules(), Value: []byte(looser)}},
	}, nil)
	require.NoError(t, err)
	require.True(t, ok, "%+v", resp)
	waitMissing(t, a, "rules", 1)
	require.Equal(t, v1, a.rules.Load().Version(), "the global document alone does not apply while the region's is missing")
	require.Equal(t, []int{200}, codes(t, a, 1, "/"), "per-ip stays off")

	empty := "version: 1\nrules: []\n"
	push(t, rc, "eu-west", layout.RegionRules("eu-west"), empty)
	waitVersion(t, a, effectiveVersion(t, looser, empty), time.Now())
	// The link swaps the rules in before it clears the gauge: a reader
	// between the two sees the new version with the gauge still at 1.
	waitMissing(t, a, "rules", 0)
}

// The region catalog likewise: deleted from Consul, the edge keeps the
// regions it had (its global rules still lease from their home regions)
// instead of falling back to its own region alone.
func TestAbsentCatalogKeepsTheRegions(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	rc := regionClient(t, c)
	cat := fmt.Sprintf(`{"regions":[{"name":"eu-west","redis":%q},{"name":"us-east","redis":%q}]}`, rd.URL(), rd.URL())
	_, err = rc.API().KV().Put(&api.KVPair{Key: rc.Layout().Catalog(), Value: []byte(cat)}, nil)
	require.NoError(t, err)
	a := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), "", func(cfg *config.Config) {
		cfg.Redis, cfg.KeySalt = rd.URL(), testenv.KeyPrefix(t)
	})
	away := `edgeguard_limiter_global_fallback_share{home="us-east"}`
	require.Eventually(t, func() bool { return strings.Contains(scrape(t, a), away) }, 10*time.Second, 20*time.Millisecond, "the catalog loaded")
	require.Zero(t, missingGauge(t, a, consullink.DocCatalog))

	_, err = rc.API().KV().Delete(rc.Layout().Catalog(), nil)
	require.NoError(t, err)
	waitMissing(t, a, consullink.DocCatalog, 1)
	require.Contains(t, scrape(t, a), away, "us-east is still a region")
	require.Contains(t, getReadyz(t, a).body, "catalog (since ")

	_, err = rc.API().KV().Put(&api.KVPair{Key: rc.Layout().Catalog(), Value: []byte(cat)}, nil)
	require.NoError(t, err)
	waitMissing(t, a, consullink.DocCatalog, 0)
}
