package edge

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// The region document of the global canary tests: it overrides per-ip, so
// it applies on top of every global document they push.
const canaryRegionDoc = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 3000000
    window: 1h
`

// A global document a slip could produce: a rule of one request per hour
// per path, so nearly every request is denied (the region document keeps
// its per-ip on top).
const canaryGlobalBad = canaryGlobal + `
  - id: slip
    key: [path]
    algorithm: sliding_window
    limit: 1
    window: 1h
`

// Global documents that keep the edges' behaviour: a loose rule more.
func canaryGlobalGood(limit int) string {
	return canaryGlobal + `
  - id: per-host
    key: [host]
    algorithm: fixed_window
    limit: ` + strings.Repeat("9", limit) + `
    window: 1h
`
}

func rulesVersion(e *running) string { return e.rules.Load().Version() }

// TestGlobalCanaryPush runs regionctl rules push --global --canary and
// --all --canary REGION/POP on real Consul (eu-west with two in-process
// edges, PoPs ams and fra, under steady traffic and a real Prometheus;
// us-east federated, without edges), with a region document in eu-west
// that applies on top of the global one: a global document that denies
// nearly everything is rolled back (fra never runs it, the canary key is
// gone, rules/global is unchanged, in every region for --all); a good one
// is promoted by the global push (check-and-set, a history entry of kind
// global), in eu-west alone with --region and in every region with --all.
func TestGlobalCanaryPush(t *testing.T) {
	// The four canary tests wait most of their time (a canary's 4 s, Prometheus's
	// scrapes), each on a region of its own: they run side by side.
	heavyWaiting(t)
	v0 := effectiveVersion(t, canaryGlobal, canaryRegionDoc)
	cr := startCanaryRegion(t, "", "/", func(e region.Edge) bool { return e.RulesVersion == v0 }, func(rc *region.Client) {
		_, err := rc.Push(context.Background(), "eu-west", rc.Layout().RegionRules("eu-west"), []byte(canaryRegionDoc), 0,
			region.Entry{Kind: region.KindRegionRules, Author: "test", Message: "region document"})
		require.NoError(t, err)
	})
	rc, layout, ams, fra, ctx := cr.rc, cr.rc.Layout(), cr.ams, cr.fra, cr.ctx
	us, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "us-east"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = us.Close() })
	require.NoError(t, cr.eu.JoinWAN(us))
	push(t, rc, "us-east", layout.GlobalRules(), canaryGlobal)

	canary := func(t *testing.T, doc string, args ...string) (string, int) {
		file := filepath.Join(t.TempDir(), "global.yaml")
		require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))
		return cr.run(t, []string{"rules", "push"}, append(args, "--yes", file)...)
	}
	globalOf := func(t *testing.T, r string) string {
		t.Helper()
		v, _, err := rc.Get(ctx, r, layout.GlobalRules())
		require.NoError(t, err)
		return string(v)
	}
	noKey := func(t *testing.T) {
		t.Helper()
		running, err := rc.Canaries(ctx, "eu-west")
		require.NoError(t, err)
		require.Empty(t, running, "the canary key was left behind")
	}
	// rolledBack runs a bad global canary with args: ams ran it, fra
	// never did, and nothing of it is left.
	rolledBack := func(t *testing.T, args ...string) {
		bad := effectiveVersion(t, canaryGlobalBad, canaryRegionDoc)
		before := map[string]string{"eu-west": globalOf(t, "eu-west"), "us-east": globalOf(t, "us-east")}
		fraRan := never(fra, rulesVersion, bad)
		out, code := canary(t, canaryGlobalBad, args...)
		fraRanBad := fraRan()
		require.Equal(t, regionctl.ExitRolledBack, code, out)
		require.Contains(t, out, "runs rules version "+bad, "ams loaded the candidate under the region document before it was judged")
		require.Contains(t, out, "canary rolled back: deny rate")
		require.False(t, fraRanBad, "fra ran the canary's document")
		noKey(t)
		runsVersion(t, ams, rulesVersion, effectiveVersion(t, before["eu-west"], canaryRegionDoc))
		for r, doc := range before {
			require.Equal(t, doc, globalOf(t, r), "%s's global document was written", r)
		}
	}
	// promoted runs a good global canary with args: both PoPs run it
	// under the region document, each region in written gets it with a
	// history entry of kind global, and the others keep theirs.
	promoted := func(t *testing.T, doc string, written, kept []string, args ...string) {
		good := effectiveVersion(t, doc, canaryRegionDoc)
		keptDocs := map[string]string{}
		for _, r := range kept {
			keptDocs[r] = globalOf(t, r)
		}
		out, code := canary(t, doc, args...)
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "runs rules version "+good)
		require.Contains(t, out, "eu-west: canary promoted\neu-west: ok: wrote ")
		noKey(t)
		runsVersion(t, fra, rulesVersion, good)
		runsVersion(t, ams, rulesVersion, good)
		for _, r := range written {
			require.Equal(t, doc, globalOf(t, r), "%s's global document", r)
			hist, err := rc.History(ctx, r, region.KindGlobalRules)
			require.NoError(t, err)
			require.NotEmpty(t, hist)
			require.Equal(t, strings.TrimSpace(doc), strings.TrimSpace(hist[0].Document), "%s: the promotion is the newest global history entry", r)
		}
		for r, doc := range keptDocs {
			require.Equal(t, doc, globalOf(t, r), "%s's global document was written", r)
		}
	}

	t.Run("region: bad global rolled back", func(t *testing.T) {
		rolledBack(t, "--region", "eu-west", "--global", "--canary", "ams")
	})
	t.Run("region: good global promoted", func(t *testing.T) {
		promoted(t, canaryGlobalGood(8), []string{"eu-west"}, []string{"us-east"}, "--region", "eu-west", "--global", "--canary", "ams")
	})
	t.Run("every region: bad global rolled back", func(t *testing.T) {
		rolledBack(t, "--all", "--canary", "eu-west/ams")
	})
	t.Run("every region: good global promoted", func(t *testing.T) {
		promoted(t, canaryGlobalGood(9), []string{"eu-west", "us-east"}, nil, "--all", "--canary", "eu-west/ams")
	})
	require.Positive(t, cr.sent.Load())
}
