package drills

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// switchBound is how long after a push every edge of the region may take to
// run a new enforcement switch, at p99.
const switchBound = time.Second

// switchCycle are the switches drill 5 pushes in turn: each differs from the
// one before, so every push is a change every edge must take.
var switchCycle = []struct {
	args []string
	en   region.Enforcement
}{
	{[]string{"shadow"}, region.Enforcement{Mode: region.ModeShadow, Percent: 100}},
	{[]string{"enforce", "--percent", "10"}, region.Enforcement{Mode: region.ModeEnforce, Percent: 10}},
	{[]string{"enforce", "--percent", "50"}, region.Enforcement{Mode: region.ModeEnforce, Percent: 50}},
	{[]string{"enforce"}, region.DefaultEnforcement()},
}

// Drill5 pushes the enforcement switch n times to each region (regionctl
// enforcement set, cycling shadow, 10 %, 50 %, enforce) and measures, for
// every edge of the region, the time from the start of the push (the
// regionctl process included) until the edge exports the new switch; the
// p99 over all of them must be within switchBound. It ends on enforce,
// which is what an absent switch means.
func (e *Env) Drill5(ctx context.Context, n int) *Result {
	r := newResult(fmt.Sprintf("5 enforcement switch pushed %d times per region", n))
	r.Err = e.drill5(ctx, n, r)
	return r
}

func (e *Env) drill5(ctx context.Context, n int, res *Result) error {
	names := sortedNames(e.Out.Regions)
	consul := e.Out.Regions[names[0]].Consul.HTTP
	var all, cmds []time.Duration
	var failures []string
	pushes := 0
	for i := range n {
		sw := switchCycle[i%len(switchCycle)]
		if i == n-1 {
			sw = switchCycle[len(switchCycle)-1] // end on enforce
		}
		for _, name := range names {
			want := sw.en.Version()
			args := append([]string{"enforcement", "set", "--region", name, "--message", fmt.Sprintf("drill 5 push %d", i+1)}, sw.args...)
			start := time.Now()
			out, code, err := e.regionctl(ctx, consul, args...)
			cmds = append(cmds, time.Since(start))
			if err != nil {
				return err
			}
			if code != 0 {
				return fmt.Errorf("push %d to %s exited %d:\n%s", i+1, name, code, out)
			}
			if strings.Contains(out, "unchanged") {
				continue // the region already ran it (the first push of a run may be)
			}
			pushes++
			var (
				mu sync.Mutex
				wg sync.WaitGroup
			)
			for _, ed := range e.Out.Regions[name].Edges() {
				wg.Go(func() {
					took, err := e.waitSwitch(ctx, ed.Admin, want, start)
					mu.Lock()
					defer mu.Unlock()
					all = append(all, took)
					if err != nil {
						failures = append(failures, fmt.Sprintf("push %d: %s: %v", i+1, ed.Name, err))
					}
				})
			}
			wg.Wait()
		}
	}
	if len(all) == 0 {
		return fmt.Errorf("no switch took effect")
	}
	slices.Sort(all)
	slices.Sort(cmds)
	p99 := all[max(0, int(math.Ceil(0.99*float64(len(all))))-1)]
	res.Counts["pushes"] = pushes
	res.Counts["edge_switches"] = len(all)
	res.Times["min"] = all[0]
	res.Times["p50"] = all[len(all)/2]
	res.Times["p90"] = all[len(all)*9/10]
	res.Times["p99"] = p99
	res.Times["max"] = all[len(all)-1]
	res.Times["regionctl_p50"] = cmds[len(cmds)/2]
	res.note("time from the start of regionctl enforcement set until an edge exports the new switch; regionctl_p50 is the command alone")
	if len(failures) > 0 {
		return fmt.Errorf("%d edges did not take the switch: %s", len(failures), strings.Join(failures, "; "))
	}
	if p99 > switchBound {
		return fmt.Errorf("p99 %s over %s (max %s)", p99.Round(time.Millisecond), switchBound, all[len(all)-1].Round(time.Millisecond))
	}
	return nil
}

// waitSwitch polls an edge's /metrics every 10 ms until it exports switch
// version want, and returns the time since start.
func (e *Env) waitSwitch(ctx context.Context, admin, want string, start time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := proc.PollEvery(ctx, 10*time.Millisecond, "switch "+want+" at "+admin, func(ctx context.Context) error {
		v, err := switchVersion(ctx, admin)
		if err == nil && v != want {
			err = fmt.Errorf("runs %s", v)
		}
		return err
	})
	return time.Since(start), err
}

// switchVersion is the enforcement switch an edge exports
// (edgeguard_edge_enforcement_info{version}).
func switchVersion(ctx context.Context, admin string) (string, error) {
	fams, err := metrics(ctx, admin+"/metrics")
	if err != nil {
		return "", err
	}
	for _, m := range fams["edgeguard_edge_enforcement_info"].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "version" && m.GetGauge().GetValue() == 1 {
				return lp.GetValue(), nil
			}
		}
	}
	return "", fmt.Errorf("%s/metrics: no edgeguard_edge_enforcement_info", admin)
}
