package peerbench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/proc"
)

// The three scenarios with both targets, scaled down to seconds: every
// request sent is counted once, in the phase it was sent in, and answered
// (no socket error, no timeout); b.example is counted in every phase, and
// a.example's clients, in processes of their own, report theirs;
// a.example's 503s from the edge (32 workers here) are counted as its own,
// with the host share's problem detail; the critical requests are counted
// apart; in the flood b.example is offered at a tenth of its rate alone, the
// same number of requests alone and beside the flood; in "join" c.example
// is offered at that rate from a quarter into the phase and its arrival
// timed; the tables and a verdict for every goal are printed. No figure
// is asserted.
func TestTenantsSmoke(t *testing.T) {
	var out strings.Builder
	cfg := SmokeTenantsConfig()
	cfg.EdgeBin, cfg.NginxBin, cfg.Out = edgeBin, nginxBin(t), &out
	cfg.Scenarios = []string{"slow", "flood", "join"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runs, err := Tenants(ctx, cfg)
	require.NoError(t, err, out.String())
	t.Log(out.String())
	require.Len(t, runs, 6)
	for i, r := range runs {
		name := r.Scenario + "/" + r.Target
		require.Equal(t, []string{"slow", "slow", "flood", "flood", "join", "join"}[i]+"/"+[]string{"edge", "nginx"}[i%2], name)
		for _, c := range []*count{r.BQuiet, r.BDuring, r.A, r.Crit, r.BQuietOpen, r.BDuringOpen, r.C} {
			require.Zero(t, c.errs, "%s: %v", name, c.firstErr)
			require.Equal(t, c.sent, c.ok+c.refused+c.other, name)
		}
		require.Empty(t, r.Pinned, "the smoke pins nothing")
		// b.example's latencies are kept (its p99); a.example's clients run
		// in their own processes, which report counts only.
		require.Len(t, r.BQuiet.lat, r.BQuiet.ok, name)
		require.Len(t, r.BDuring.lat, r.BDuring.ok, name)
		require.Greater(t, r.BQuiet.ok, 20, name)
		require.Greater(t, r.BDuring.sent, 20, name)
		require.Positive(t, r.A.sent, name)
		rate := 0.1 * float64(r.BQuiet.ok) // a tenth of it a second, in phases of 1 s
		if r.Scenario != "flood" {
			require.Positive(t, r.Crit.sent, name)
			require.Equal(t, 1, r.Rounds, name)
			require.Zero(t, r.BQuietOpen.sent+r.BDuringOpen.sent, name)
		} else {
			require.Zero(t, r.Crit.sent, name)
			require.Equal(t, 64, r.Conns, name)
			require.InDelta(t, rate, r.Rate, 0.01, name)
			// One request every 1/rate from the phase's start: as many
			// alone as beside the flood, the fixed rate's phase's worth.
			require.InDelta(t, rate, r.BQuietOpen.sent, 1, name)
			require.InDelta(t, rate, r.BDuringOpen.sent, 1, name)
			require.Len(t, r.BDuringOpen.lag, r.BDuringOpen.sent, name)
		}
		if r.Scenario == "join" {
			require.InDelta(t, 0.75*rate, r.C.sent, 1, "%s: c.example from a quarter into the phase", name)
			require.Positive(t, r.C.ok, name)
			require.GreaterOrEqual(t, r.CFirstOK, time.Duration(0), name)
		} else {
			require.Zero(t, r.C.sent, name)
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
	require.Zero(t, runs[4].C.refused, "c.example, joining within its share, is not refused")
	require.Positive(t, runs[4].ShareBefore, "the edge's host share, read as c.example joined")
	require.Contains(t, out.String(), "| set | scenario | target | b.example quiet |")
	require.Contains(t, out.String(), "| set | target | rate | alone: in time |")
	require.Contains(t, out.String(), "| set | target | rate | answered in time |")
	// slow: 5 goals; flood: 1, 2 figures beside; join: 6 and 1.
	require.Equal(t, 2*(5+1+6), strings.Count(out.String(), "PASS ")+strings.Count(out.String(), "FAIL "))
	require.Equal(t, 2*(2+1), strings.Count(out.String(), "INFO "))
	require.Contains(t, out.String(), "the goal's figure")
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
		return &TenantRun{Scenario: "slow", Phase: 10 * time.Second, Beside: 10 * time.Second, Share: 100, Rounds: 2,
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
	// The flood: b.example at a fixed rate, answered within the deadline
	// beside it ≥ 95 % of alone; the closed loop's figures are printed
	// beside, not held to (Info).
	flood := func(quietIn, duringIn, duringLate int) *TenantRun {
		r := run(100, 10, 100, 0, 0, time.Millisecond, time.Second)
		r.Scenario, r.Deadline, r.Beside = "flood", time.Second, 20*time.Second
		lat := func(in, late int) []time.Duration {
			s := make([]time.Duration, 0, in+late)
			for range in {
				s = append(s, time.Second) // at the deadline: in time
			}
			for range late {
				s = append(s, time.Second+time.Millisecond)
			}
			return s
		}
		r.BQuietOpen = &count{sent: 100, ok: quietIn, lat: lat(quietIn, 0)}
		r.BDuringOpen = &count{sent: 200, ok: duringIn + duringLate, lat: lat(duringIn, duringLate)}
		return r
	}
	require.Equal(t, []bool{true, false, false}, verdicts(flood(100, 190, 0)), "95 % of 100 %")
	require.Equal(t, []bool{false, false, false}, verdicts(flood(100, 189, 11)), "a 200 after the deadline is lost")
	require.Equal(t, []bool{true, false, false}, verdicts(flood(80, 153, 0)), "95 % of 80 %")
	info := []bool{}
	for _, g := range flood(100, 190, 0).Goals() {
		info = append(info, g.Info)
	}
	require.Equal(t, []bool{false, true, true}, info, "the closed loop's figures hold no goal in the flood")
}

// From three sets of a scenario and target on, b.example's rate and p99
// beside the slowdown are judged on their medians over the sets, each
// set's printed beside; fewer sets are judged one by one.
func TestTenantGoalsAcrossSets(t *testing.T) {
	run := func(set int, target string, rate float64, p99 time.Duration) *TenantRun {
		lat := func(n int, d time.Duration) []time.Duration {
			s := make([]time.Duration, n)
			for i := range s {
				s[i] = d
			}
			return s
		}
		ok := int(1000 * rate)
		return &TenantRun{Scenario: "slow", Target: target, Set: set, Phase: 10 * time.Second, Beside: 10 * time.Second, Share: 1, Rounds: 1,
			BQuiet:  &count{sent: 1000, ok: 1000, lat: lat(1000, 10*time.Millisecond)},
			BDuring: &count{sent: ok, ok: ok, lat: lat(ok, p99)},
			A:       &count{sent: 1, ok: 1}, Crit: &count{sent: 1, ok: 1},
			BQuietOpen: &count{}, BDuringOpen: &count{}, C: &count{}}
	}
	verdicts := func(gs []setsGoal) map[string]bool {
		v := map[string]bool{}
		for _, g := range gs {
			v[g.Target+": "+g.What] = g.Met
		}
		return v
	}
	rate, p99 := "b.example 200s a second ≥ 95 % of quiet", "b.example p99 ≤ 1.5× quiet"
	runs := []*TenantRun{
		run(1, "edge", 0.97, 12*time.Millisecond), run(1, "nginx", 0.94, 16*time.Millisecond),
		run(2, "edge", 1.02, 11*time.Millisecond), run(2, "nginx", 0.93, 14*time.Millisecond),
		run(3, "edge", 0.91, 16*time.Millisecond), run(3, "nginx", 1.10, 16*time.Millisecond),
	}
	require.False(t, runs[4].Goals()[1].Met, "one set alone misses it")
	require.Equal(t, map[string]bool{"edge: " + rate: true, "edge: " + p99: true, "nginx: " + rate: false, "nginx: " + p99: false},
		verdicts(acrossSets(runs)), "medians 97 % and 1.2× for the edge, 94 % and 1.6× for nginx")
	got := acrossSets(runs)
	require.Equal(t, "median 97.0 % over 3 sets (each: 97.0 %, 102.0 %, 91.0 %)", got[0].Figure)
	require.Empty(t, acrossSets(runs[:4]), "two sets: judged one by one")

	var out strings.Builder
	printTenants(&out, DefaultTenantsConfig(), nil, runs)
	require.Contains(t, out.String(), "INFO set 3, slow/edge: "+rate+": 91/s of 100/s (91.0 %) (one set: the median over the sets, below, is the verdict)")
	require.Contains(t, out.String(), "PASS slow/edge: "+rate+": median 97.0 %")
	require.Contains(t, out.String(), "FAIL slow/nginx: "+p99+": median 1.60×")
	require.Contains(t, out.String(), "PASS set 3, slow/edge: nothing critical refused", "the other goals stay per set")
}

// A joining host's arrival: its first 200 (scheduled time plus latency),
// and the first bin from which every bin has 95 % answered in time.
func TestJoined(t *testing.T) {
	start := time.Now()
	j := &joinTrace{start: start}
	// 10 requests a bin of 250 ms for 2 s: lost in the first bin, 9 of 10
	// in the second (under 95 %), all from the third.
	for i := range 80 {
		at := time.Duration(i) * 25 * time.Millisecond
		good := at >= 500*time.Millisecond || (at >= 250*time.Millisecond && i%10 != 0)
		j.add(start.Add(at), 40*time.Millisecond, good)
	}
	first, atRate := j.joined(250 * time.Millisecond)
	require.Equal(t, 275*time.Millisecond+40*time.Millisecond, first, "the second bin's second request, answered 40 ms later")
	require.Equal(t, 500*time.Millisecond, atRate)
	never := &joinTrace{start: start}
	never.add(start, time.Millisecond, false)
	first, atRate = never.joined(250 * time.Millisecond)
	require.Equal(t, time.Duration(-1), first)
	require.Equal(t, time.Duration(-1), atRate)
}

// Pinning moves every thread of a process and of its children to the
// CPU asked, read back from the kernel; the plan needs 2 CPUs.
func TestPinTasks(t *testing.T) {
	cpus, _, err := allowedCPUs()
	require.NoError(t, err)
	if len(cpus) < 2 {
		// Nothing to pin apart: the plan says so, and how to run anyway.
		_, err := planCPUs()
		require.ErrorContains(t, err, "needs 2 CPUs")
		require.ErrorContains(t, err, "-pin=false")
		return
	}
	// A shell with a child of its own, as nginx's master and workers.
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, proc.PollEvery(ctx, 10*time.Millisecond, "the child's child", func(context.Context) error {
		if len(tree(cmd.Process.Pid)) < 2 {
			return errors.New("not started yet")
		}
		return nil
	}))
	last := cpus[len(cpus)-1]
	only, all := threadsOn(cmd.Process.Pid, last)
	require.Equal(t, 2, all)
	require.Zero(t, only, "not pinned yet")
	plan := &cpuPlan{proxy: last}
	n, err := plan.pinProxy(cmd.Process.Pid)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	only, all = threadsOn(cmd.Process.Pid, last)
	require.Equal(t, 2, only)
	require.Equal(t, 2, all)
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

// The host table of -a-pool is valid, sends a.example to its own pool with
// the limit, and lists every other tenant on the default pool, so that each
// keeps a host share of its own (the hosts a table does not list share one).
func TestPoolLimitHostTable(t *testing.T) {
	p := PoolLimit{Limit: 512, Queue: 1200, QueueTimeout: 10 * time.Second}
	f, err := p.hostTable(t.TempDir(), "127.0.0.1:9")
	require.NoError(t, err)
	doc, err := os.ReadFile(f)
	require.NoError(t, err)
	table, err := hosts.Parse(doc)
	require.NoError(t, err)
	require.Equal(t, map[string]hosts.Host{
		slowHost: {Pool: "tenant_a"},
		fastHost: {Pool: hosts.DefaultPool},
		joinHost: {Pool: hosts.DefaultPool},
	}, table.Hosts)
	require.Equal(t, 512, table.Pools["tenant_a"].Concurrency.Limit)
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
		"open share":        {func(c *TenantsConfig) { c.OpenShare = 1.5 }, "the fixed rate's share (1.5)"},
		"no open conns":     {func(c *TenantsConfig) { c.OpenConns = 0 }, "its connections (0)"},
		"no deadline":       {func(c *TenantsConfig) { c.Deadline = 0 }, "its deadline (0s)"},
		"no sets":           {func(c *TenantsConfig) { c.Sets = 0 }, "sets (0)"},
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
