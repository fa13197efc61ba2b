package drills

import (
	"context"
	"fmt"
	"strings"
)

// Run runs the drills named in which ("1".."6"), in that order.
func (e *Env) Run(ctx context.Context, which []string) ([]*Result, error) {
	var out []*Result
	for _, w := range which {
		switch strings.TrimSpace(w) {
		case "1":
			out = append(out, e.Drill1(ctx)...)
		case "2":
			from, to, err := e.FailoverPair()
			if err != nil {
				return nil, err
			}
			out = append(out, e.Drill2(ctx, from, to))
		case "3":
			names := sortedNames(e.Out.Regions)
			out = append(out, e.Drill3(ctx, names[0]))
		case "4":
			out = append(out, e.Drill4(ctx, 5))
		case "5":
			out = append(out, e.Drill5(ctx, 20))
		case "6":
			out = append(out, e.Drill6(ctx))
		default:
			return nil, fmt.Errorf("unknown drill %q (1 to 6)", w)
		}
	}
	return out, nil
}

// FailoverPair is the first region (by name) whose DNS fails over to
// another, and that other region: drill 2 drains the first.
func (e *Env) FailoverPair() (from, to string, err error) {
	for _, name := range sortedNames(e.Out.Regions) {
		if f := e.Out.Regions[name].Failover; len(f) > 0 && f[0] != name {
			return name, f[0], nil
		}
	}
	return "", "", fmt.Errorf("no region of the stack fails over to another")
}
