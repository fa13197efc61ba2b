package regionctl

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// pushJSON runs a push with --output json and returns its one result.
func pushJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	r := run(t, append(args, "--output", "json")...)
	require.Equal(t, ExitOK, r.code, r)
	return decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
}

// Pushes keep the newest N history entries of each document; rules history
// says how many are kept and what went; what went cannot be rolled back to.
func TestHistoryRetention(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	push := func(limit, keep int) map[string]any {
		return pushJSON(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--keep-history", fmt.Sprint(keep),
			file(t, customerRules(3, 0, limit)))
	}
	var seqs []string
	var versions []string
	for i, want := range []float64{0, 0, 1, 1} {
		res := push(i+1, 2)
		require.Equal(t, "ok", res["status"])
		require.Equal(t, want, num(res["history_pruned"]), "push %d", i+1)
		seqs = append(seqs, res["seq"].(string))
		versions = append(versions, res["document_version"].(string))
	}
	// Another document's entries are counted apart: the shedder's push
	// prunes no rules entry.
	r := run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "--keep-history", "2", "good=0.71")
	require.Equal(t, ExitOK, r.code, r)
	require.NotContains(t, r.stdout, "pruned")

	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "eu-west: 3 history entries stored; the last push (")
	require.Contains(t, r.stdout, "kept the newest 2 of each document (--keep-history); 2 entries pruned in all")
	require.Regexp(t, `most recently pruned:\n  `+seqs[1]+`\s.*rules/region\s+`+versions[1]+`\n  `+seqs[0]+`\s`, r.stdout)

	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	h := decodeJSON(t, r.stdout)
	require.Equal(t, float64(3), h["stored"])
	ret := h["retention"].(map[string]any)
	require.Equal(t, float64(2), ret["keep"])
	require.Equal(t, float64(2), ret["pruned_total"])
	var pruned []string
	for _, e := range ret["recently_pruned"].([]any) {
		pruned = append(pruned, e.(map[string]any)["seq"].(string))
	}
	require.Equal(t, []string{seqs[1], seqs[0]}, pruned)
	var kept []string
	for _, e := range h["entries"].([]any) {
		if e.(map[string]any)["kind"] == region.KindRegionRules {
			kept = append(kept, e.(map[string]any)["seq"].(string))
		}
	}
	require.Equal(t, []string{seqs[3], seqs[2]}, kept)

	// A pruned version is gone from rollback; a kept one is there.
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "eu-west", "--to", versions[0])
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, "no region document of eu-west with version")
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "eu-west", "--keep-history", "0")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "rolled the region document back to "+seqs[2])

	// --keep-history 0 keeps everything; a negative one is refused.
	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--kind", "region", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	require.Len(t, decodeJSON(t, r.stdout)["entries"], 3)
	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--keep-history", "-1", file(t, customerRules(3, 0, 9)))
	require.Equal(t, ExitUsage, r.code, r)
	require.Contains(t, r.stderr, "--keep-history must be >= 0")
}

// Parts whose last manifest went with a pruned history entry are deleted
// only once the region's edges have converged on what the push replaced;
// until then they stay, and the push says how many.
func TestPrunedPartsCollectedAfterConvergence(t *testing.T) {
	// Not parallel: it registers edges, which are not namespaced.
	p := prefix(t)
	big := func(limit int) string { return customerRules(3500, 42, limit) }
	require.Greater(t, len(big(1)), region.InlineMax)
	manifest := func() *region.Manifest {
		m, err := region.ParseManifest(kv(t, euWest, p+"rules/global").Value)
		require.NoError(t, err)
		require.NotNil(t, m)
		return m
	}
	keys := func(ms ...*region.Manifest) []string {
		var out []string
		for _, m := range ms {
			for _, part := range m.Parts {
				if !slices.Contains(out, part.Key) {
					out = append(out, part.Key)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	pushBig := func(limit int) map[string]any {
		return pushJSON(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", "--keep-history", "1", file(t, big(limit)))
	}

	// An edge still runs something else.
	fakeEdge(t, euWest, "edge-retention-1", "ams", "0123456789ab", api.HealthPassing)
	pushBig(1)
	m1 := manifest()
	require.GreaterOrEqual(t, len(m1.Parts), 2)
	res := pushBig(2)
	m2 := manifest()
	require.Equal(t, float64(1), res["history_pruned"])
	require.Nil(t, res["parts_collected"], res)
	onlyV1 := len(keys(m1, m2)) - len(keys(m2))
	require.Positive(t, onlyV1, "v1 and v2 differ in a part")
	require.Equal(t, float64(onlyV1), res["parts_pending"], res)
	require.Equal(t, keys(m1, m2), partKeys(t, p), "v1's parts stay while the edges have not converged")

	// Once every edge runs v2, the next push deletes what no manifest names.
	v2 := res["version"].(string)
	fakeEdge(t, euWest, "edge-retention-1", "ams", v2, api.HealthPassing)
	waitStatus(t, p, func(r result) bool { return r.code == ExitOK }, "--region", "eu-west")
	res = pushBig(3)
	m3 := manifest()
	require.Equal(t, float64(len(keys(m1, m2, m3))-len(keys(m3))), res["parts_collected"], res)
	require.Nil(t, res["parts_pending"], res)
	require.Equal(t, keys(m3), partKeys(t, p), "only the parts of the one version history keeps")

	// And the document still reads whole.
	r := run(t, "rules", "get", "--prefix", p, "--region", "eu-west", "--global")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "shop-003499.example.net")
}

// num is a JSON number that omitempty may have left out.
func num(v any) float64 {
	f, _ := v.(float64)
	return f
}
