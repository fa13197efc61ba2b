package drills

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// convergeBound is how long an edge may take to run a pushed document.
const convergeBound = 2 * time.Second

// Drill4 pushes a changed rules document to every region n times and
// measures, for every edge, how long after the push returned it runs the
// new version.
func (e *Env) Drill4(ctx context.Context, n int) *Result {
	r := newResult(fmt.Sprintf("4 rules pushed %d times", n))
	r.Err = e.drill4(ctx, n, r)
	return r
}

func (e *Env) drill4(ctx context.Context, n int, res *Result) error {
	names := sortedNames(e.Out.Regions)
	consul := e.Out.Regions[names[0]].Consul.HTTP
	var all []time.Duration
	var failures []string
	for i := range n {
		variant, err := e.rulesVariant(fmt.Sprintf("drill4-%d-%d", time.Now().UnixNano(), i))
		if err != nil {
			return err
		}
		out, code, err := e.regionctl(ctx, consul, "rules", "push", "--all", variant)
		pushed := time.Now()
		removeQuiet(variant)
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("push %d exited %d:\n%s", i+1, code, out)
		}
		// The version every edge must reach: the region's effective one.
		for _, name := range names {
			want, err := e.effectiveVersion(ctx, consul, name)
			if err != nil {
				return err
			}
			var (
				mu sync.Mutex
				wg sync.WaitGroup
			)
			for _, ed := range e.Out.Regions[name].Edges() {
				wg.Go(func() {
					_, err := waitFor(ctx, 10*time.Second, "edge "+ed.Name+" to run "+want, func(ctx context.Context) error {
						v, err := rulesVersion(ctx, ed.Admin)
						if err != nil {
							return err
						}
						if v != want {
							return fmt.Errorf("runs %s", v)
						}
						return nil
					})
					took := time.Since(pushed)
					mu.Lock()
					defer mu.Unlock()
					all = append(all, took)
					if err != nil || took > convergeBound {
						failures = append(failures, fmt.Sprintf("push %d: %s took %s (%v)", i+1, ed.Name, took.Round(time.Millisecond), err))
					}
				})
			}
			wg.Wait()
		}
	}
	slices.Sort(all)
	res.Counts["pushes"] = n
	res.Counts["edge_convergences"] = len(all)
	res.Times["min"] = all[0]
	res.Times["p50"] = all[len(all)/2]
	res.Times["p90"] = all[len(all)*9/10]
	res.Times["max"] = all[len(all)-1]
	t0 := time.Now()
	if err := e.reconcile(ctx); err != nil {
		return fmt.Errorf("restoring the stack: %w", err)
	}
	res.Times["restore"] = time.Since(t0)
	if len(failures) > 0 {
		return fmt.Errorf("%d convergences over %s: %s", len(failures), convergeBound, strings.Join(failures, "; "))
	}
	return nil
}

// effectiveVersion asks regionctl for a region's effective rules version.
func (e *Env) effectiveVersion(ctx context.Context, consul, region string) (string, error) {
	out, code, err := e.regionctl(ctx, consul, "--output", "json", "rules", "get", "--region", region, "--effective")
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", fmt.Errorf("rules get --region %s exited %d: %s", region, code, out)
	}
	var v struct {
		Version string `json:"version"`
	}
	if err := jsonFrom(out, &v); err != nil || v.Version == "" {
		return "", fmt.Errorf("rules get --region %s: no version in %q (%v)", region, out, err)
	}
	return v.Version, nil
}
