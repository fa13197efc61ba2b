package drills

import (
	"context"
	"errors"
)

// Drill2 drains every edge of from and follows DNS to to.
func (e *Env) Drill2(ctx context.Context, from, to string) *Result {
	r := newResult("2 every " + from + " edge drained")
	r.Err = errors.New("not implemented yet")
	return r
}
