package peerbench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Both scenarios with both targets, scaled down to seconds: every request
// sent is counted once, in the phase it was sent in, and answered (no
// socket error, no timeout); b.example is counted in both phases, and
// a.example's clients, in processes of their own, report theirs;
// a.example's 503s from the edge (32 workers here) are counted as its own,
// with the host share's problem detail; the critical requests are counted
// apart; the table and a verdict for every goal are printed. No figure is
// asserted.
func TestTenantsSmoke(t *testing.T) {
	var out strings.Builder
	cfg := SmokeTenantsConfig()
	cfg.EdgeBin, cfg.NginxBin, cfg.Out = edgeBin, nginxBin(t), &out
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runs, err := Tenants(ctx, cfg)
	require.NoError(t, err, out.String())
	t.Log(out.String())
	require.Len(t, runs, 4)
	for i, r := range runs {
		name := r.Scenario + "/" + r.Target
		require.Equal(t, []string{"slow", "slow", "flood", "flood"}[i]+"/"+[]string{"edge", "nginx"}[i%2], name)
		for _, c := range []*count{r.BQuiet, r.BDuring, r.A, r.Crit} {
			require.Zero(t, c.errs, "%s: %v", name, c.firstErr)
			require.Equal(t, c.sent, c.ok+c.refused+c.other, name)
		}
		// b.example's latencies are kept (its p99); a.example's clients run
		// in their own processes, which report counts only.
		require.Len(t, r.BQuiet.lat, r.BQuiet.ok, name)
		require.Len(t, r.BDuring.lat, r.BDuring.ok, name)
		require.Greater(t, r.BQuiet.ok, 20, name)
		require.Greater(t, r.BDuring.sent, 20, name)
		require.Positive(t, r.A.sent, name)
		if r.Scenario == "slow" {
			require.Positive(t, r.Crit.sent, name)
			require.Equal(t, 1, r.Rounds, name)
		} else {
			require.Zero(t, r.Crit.sent, name)
			require.Equal(t, 64, r.Conns, name)
		}
	}
	edge := runs[0]
	require.Equal(t, 32, edge.Workers)
	require.Positive(t, edge.A.refused, "the edge held a.example's 40 clients to its share of 16 workers")
	require.Positive(t, edge.A.ok)
	require.Contains(t, edge.A.refusal, "this host is at its share of the edge's workers")
	require.Zero(t, edge.BQuiet.refused+edge.BDuring.refused, "b.example, within its share, is never refused: a.example's 503s are a.example's")
	require.Contains(t, edge.EdgeMetrics, `edgeguard_shedder_rejected_total{reason="host_share"`)
	require.Zero(t, runs[1].A.refused, "nginx refuses nothing")
	require.Contains(t, out.String(), "| scenario | target | b.example quiet |")
	require.Equal(t, 2*5+2*2, strings.Count(out.String(), "PASS ")+strings.Count(out.String(), "FAIL "))
}

// The goals are met at their bounds and missed just past them.
func TestTenantGoals(t *testing.T) {
	run := func(bQuietOK, bOK, bSent, aOK, critOK int, p99Quiet, p99 time.Duration) *TenantRun {
		lat := func(n int, d time.Duration) []time.Duration {
			s := make([]time.Duration, n)
			for i := range s {
				s[i] = d
			}
			return s
		}
		return &TenantRun{Scenario: "slow", Phase: 10 * time.Second, Share: 100, Rounds: 2,
			BQuiet:  &count{sent: 100, ok: bQuietOK, lat: lat(bQuietOK, p99Quiet)},
			BDuring: &count{sent: bSent, ok: bOK, lat: lat(bOK, p99)},
			A:       &count{sent: 1000, ok: aOK},
			Crit:    &count{sent: 4, ok: critOK}}
	}
	verdicts := func(r *TenantRun) []bool {
		var v []bool
		for _, g := range r.Goals() {
			v = append(v, g.Met)
		}
		return v
	}
	require.Equal(t, []bool{true, true, true, true, true}, verdicts(run(100, 95, 95, 180, 4, 10*time.Millisecond, 15*time.Millisecond)))
	require.Equal(t, []bool{false, false, false, false, false}, verdicts(run(100, 94, 100, 179, 3, 10*time.Millisecond, 16*time.Millisecond)))
	// Every request answered, at half the quiet rate: succeeded, not as many a second.
	require.Equal(t, []bool{true, false, true, true, true}, verdicts(run(100, 50, 50, 180, 4, 10*time.Millisecond, 15*time.Millisecond)))
	flood := run(100, 95, 100, 0, 0, time.Millisecond, time.Second)
	flood.Scenario = "flood"
	require.Equal(t, []bool{true, true}, verdicts(flood), "the flood holds b.example to its succeeded share and rate only")
}

// A pool limit is read whole or refused, naming what is wrong.
func TestParsePoolLimit(t *testing.T) {
	p, err := ParsePoolLimit("512,1200,10s")
	require.NoError(t, err)
	require.Equal(t, PoolLimit{Limit: 512, Queue: 1200, QueueTimeout: 10 * time.Second}, *p)
	for _, bad := range []string{"", "512", "512,1200", "0,1,1s", "1,-1,1s", "1,1,-1s", "1,1,10", "x,1,1s", "1,1,1s,1"} {
		_, err := ParsePoolLimit(bad)
		require.ErrorContains(t, err, "pool limit", bad)
	}
}

// A configuration that cannot run is refused whole, each problem named.
func TestTenantsConfigRefusesNonsense(t *testing.T) {
	ok := DefaultTenantsConfig()
	ok.EdgeBin, ok.NginxBin = "edge", "nginx"
	require.NoError(t, ok.validate())
	for name, tc := range map[string]struct {
		edit   func(*TenantsConfig)
		errMsg string
	}{
		"short phase":       {func(c *TenantsConfig) { c.Phase = time.Millisecond }, "phase 1ms must be at least 500ms"},
		"negative slowdown": {func(c *TenantsConfig) { c.Slow = -time.Second }, "slowdown -1s from 0 to 1m"},
		"no clients":        {func(c *TenantsConfig) { c.AClients = 0 }, "a.example's clients (0)"},
		"too many sources":  {func(c *TenantsConfig) { c.ASources = 300 }, "its addresses (300, at most 200)"},
		"no flood":          {func(c *TenantsConfig) { c.FloodFactor, c.FloodConns = 0, 0 }, "the flood needs"},
		"bad scenario":      {func(c *TenantsConfig) { c.Scenarios = []string{"slow", "storm"} }, `scenarios ["slow" "storm"]`},
		"no scenario":       {func(c *TenantsConfig) { c.Scenarios = nil }, "scenarios []"},
		"no binaries":       {func(c *TenantsConfig) { c.EdgeBin = "" }, "no edge or nginx binary"},
	} {
		t.Run(name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			require.ErrorContains(t, c.validate(), tc.errMsg)
		})
	}
	c := ok
	c.Phase, c.AClients = 0, 0
	err := c.validate()
	require.ErrorContains(t, err, "phase")
	require.ErrorContains(t, err, "a.example's clients (0)", "every problem at once")
}
