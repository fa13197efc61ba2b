package drills

import (
	"context"
	"errors"
	"time"
)

// OverWAN runs fn while the regions reach each other's Redis over the
// WAN-like links drill 6 uses (57 ± 17 ms each way, both directions), then
// pushes the stack's catalog again and takes the links down. It returns
// how long joining the links took.
func (e *Env) OverWAN(ctx context.Context, fn func(context.Context) error) (time.Duration, error) {
	g, err := e.newGlobalDrill()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err = g.joinWAN(ctx, newResult("wan")); err != nil { // joinWAN closes the links when it fails
		return 0, errors.Join(err, e.pushStackCatalog(context.WithoutCancel(ctx)))
	}
	defer g.close() // after the catalogs no longer name the links
	joined := time.Since(start)
	err = fn(ctx)
	return joined, errors.Join(err, e.pushStackCatalog(context.WithoutCancel(ctx)))
}
