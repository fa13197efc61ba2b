package edge

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// perUser: a sliding log, so that no count starts again on the hour
// while a test waits on Consul (as tightGlobal).
const perUser = `
version: 1
rules:
  - id: per-user
    key: ["header:X-User"]
    algorithm: sliding_log
    limit: 1
    window: 1h
`

// The region's enforcement switch, pushed through Consul, turns every edge
// of the region to shadow and back, and a percentage enforces the same keys
// on every edge: which ones follows region.Bucket of the limit key.
func TestEnforcementSwitchFromConsul(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	push(t, rc, "eu-west", rc.Layout().GlobalRules(), perUser)
	v := effectiveVersion(t, perUser, "")
	dir := t.TempDir()
	a := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(dir, "a.yaml"))
	b := startConsulEdge(t, "eu-west", "fra", c.HTTPAddr(), filepath.Join(dir, "b.yaml"))
	waitVersion(t, a, v, time.Now())
	waitVersion(t, b, v, time.Now())
	sw := &switchTest{rc: rc, edges: []*running{a, b}}

	// Each phase starts from the switch the one before left: a phase that
	// fails stops the test.
	for _, phase := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"no switch: every key enforced", func(t *testing.T) {
			require.Len(t, sw.denied(t, a, 5), 5)
		}},
		{"shadow: nothing denied, counted as shadow", func(t *testing.T) {
			sw.set(t, `{"mode":"shadow"}`)
			shadowBefore := metricSum(t, a, "edgeguard_edge_rule_checks_total", "mode", "shadow")
			require.Empty(t, sw.denied(t, a, 5))
			require.Empty(t, sw.denied(t, b, 5))
			require.Equal(t, shadowBefore+10, metricSum(t, a, "edgeguard_edge_rule_checks_total", "mode", "shadow"))
			require.Equal(t, 1.0, metricSum(t, a, "edgeguard_edge_enforcement_info", "mode", "shadow"))
			require.Equal(t, 0.0, metricValue(t, a, "edgeguard_edge_enforced_keys_ratio"))
			require.GreaterOrEqual(t, metricSum(t, a, "edgeguard_edge_decisions_total", "decision", "shadow_denied"), 5.0)
		}},
		{"half: the same keys on every edge, by bucket", func(t *testing.T) {
			sw.set(t, `{"mode":"enforce","percent":50}`)
			require.Equal(t, 0.5, metricValue(t, a, "edgeguard_edge_enforced_keys_ratio"))
			sw.halfEnforced(t, a, b)
		}},
		{"enforced again", func(t *testing.T) {
			sw.set(t, `{"mode":"enforce"}`)
			require.Len(t, sw.denied(t, b, 5), 5)
			require.Equal(t, 1.0, metricValue(t, b, "edgeguard_edge_enforced_keys_ratio"))
		}},
		{"a switch that does not parse is refused, the one in force stays", func(t *testing.T) {
			rejected := metricValue(t, a, "edgeguard_edge_rules_rejected_total")
			_, err := rc.API().KV().Put(&api.KVPair{Key: rc.Layout().Enforcement("eu-west"), Value: []byte(`{"mode":"off"}`)}, nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return metricValue(t, a, "edgeguard_edge_rules_rejected_total") > rejected },
				10*time.Second, 5*time.Millisecond)
			require.Equal(t, region.ModeEnforce, enforcementOf(t, a).Mode)
		}},
	} {
		if !t.Run(phase.name, phase.run) {
			return
		}
	}
}

// switchTest pushes enforcement switches to a region's edges and sends
// them users.
type switchTest struct {
	rc    *region.Client
	edges []*running
	round int // a round's users are new to every edge
}

// set pushes the switch doc and waits until every edge runs it.
func (sw *switchTest) set(t *testing.T, doc string) {
	t.Helper()
	en, err := region.ParseEnforcement([]byte(doc))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := sw.rc.Layout().Enforcement("eu-west")
	_, idx, err := sw.rc.Get(ctx, "eu-west", key)
	require.NoError(t, err)
	_, err = sw.rc.Push(ctx, "eu-west", key, []byte(doc), idx, region.Entry{Kind: region.KindEnforcement, Author: "test"})
	require.NoError(t, err)
	for _, r := range sw.edges {
		require.Eventually(t, func() bool {
			got, ok := r.pipe.Enforcement()
			return ok && got.Version() == en.Version()
		}, 10*time.Second, 5*time.Millisecond, "%s runs switch %s", r.cfg.PoP, en)
	}
}

// denied sends each of users new users twice to r and returns those whose
// second request was refused.
func (sw *switchTest) denied(t *testing.T, r *running, users int) map[int]bool {
	t.Helper()
	sw.round++
	out := map[int]bool{}
	for u := range users {
		got := codes(t, r, 2, "/", "X-User", fmt.Sprintf("round%d-user%d", sw.round, u))
		require.Equal(t, 200, got[0])
		if got[1] == 429 {
			out[u] = true
		}
	}
	return out
}

// halfEnforced sends the same 60 users twice to a and to b, and requires
// that both deny the second request of exactly the users whose key's
// bucket is in the enforced half, about half of them.
func (sw *switchTest) halfEnforced(t *testing.T, a, b *running) {
	const users = 60
	sw.round++
	onA, onB := map[int]bool{}, map[int]bool{}
	want := map[int]bool{}
	snap := a.rules.Load()
	for u := range users {
		user := fmt.Sprintf("round%d-user%d", sw.round, u)
		for r, set := range map[*running]map[int]bool{a: onA, b: onB} {
			if got := codes(t, r, 2, "/", "X-User", user); got[1] == 429 {
				set[u] = true
			}
		}
		req := rules.Request{Host: "x", Method: "GET", Path: "/", Header: func(name string) (string, bool) {
			if name == "X-User" {
				return user, true
			}
			return "", false
		}}
		ms := snap.Match(&req, nil)
		require.Len(t, ms, 1)
		if region.Bucket(ms[0].Key) < region.Buckets/2 {
			want[u] = true
		}
	}
	require.Equal(t, want, onA, "the enforced keys are those whose bucket is under the threshold")
	require.Equal(t, onA, onB, "every edge enforces the same keys")
	require.InDelta(t, users/2, len(onA), users/4, "about half")
}

// The switch is kept beside the rules cache: an edge restarted while Consul
// is unreachable runs its region in shadow as before, instead of enforcing
// every key.
func TestEnforcementSwitchSurvivesARestartWithoutConsul(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	push(t, rc, "eu-west", rc.Layout().GlobalRules(), perUser)
	key := rc.Layout().Enforcement("eu-west")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = rc.Push(ctx, "eu-west", key, []byte(`{"mode":"shadow"}`), 0, region.Entry{Kind: region.KindEnforcement, Author: "test"})
	require.NoError(t, err)
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	first := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), cache)
	waitVersion(t, first, effectiveVersion(t, perUser, ""), time.Now())
	require.Eventually(t, func() bool {
		en, ok := first.pipe.Enforcement()
		return ok && en.Mode == region.ModeShadow
	}, 10*time.Second, 5*time.Millisecond)
	first.stop()
	require.NoError(t, c.Stop())

	again := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), cache)
	require.Eventually(t, func() bool { return again.rules.Load() != nil && again.rules.Load().Version() != "" }, 10*time.Second, 5*time.Millisecond)
	en, ok := again.pipe.Enforcement()
	require.True(t, ok, "the cached switch applies before the first request")
	require.Equal(t, region.ModeShadow, en.Mode)
	require.Equal(t, 200, codes(t, again, 2, "/", "X-User", "someone")[1], "shadow: counted, not denied")
}

// enforcementOf is the switch r runs; it fails the test while r runs none.
func enforcementOf(t *testing.T, r *running) region.Enforcement {
	en, ok := r.pipe.Enforcement()
	require.True(t, ok, "no enforcement switch in force")
	return en
}
