package drills

import (
	"context"
	"fmt"
	"strings"
)

// Run runs the drills named in which ("1".."5"), in that order.
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
		default:
			return nil, fmt.Errorf("unknown drill %q (1, 2, 3, 4 or 5)", w)
		}
	}
	return out, nil
}
