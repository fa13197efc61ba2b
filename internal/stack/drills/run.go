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
			out = append(out, e.Drill2(ctx, "eu-west", "us-east"))
		case "3":
			out = append(out, e.Drill3(ctx, "eu-west"))
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
