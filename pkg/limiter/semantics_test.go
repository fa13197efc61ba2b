package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// t0 is aligned to every window used below (a multiple of 10 s).
var t0 = time.UnixMilli(1_800_000_000_000)

type step struct {
	at         time.Duration // after t0
	cost, need int64
	refund     int // refund the lease of this earlier step (1-based), instead of taking
	admitted   int64
	remaining  int64
	reset      time.Duration
	retry      time.Duration
}

const s = time.Second
const ms = time.Millisecond

func TestAlgorithmSemantics(t *testing.T) {
	cases := []struct {
		name  string
		limit limiter.Limit
		steps []step
	}{
		{"sliding log exact and partial", limiter.Limit{Algorithm: limit.SlidingLog, Limit: 3, Window: 10 * s}, []step{
			{at: 0, cost: 1, admitted: 1, remaining: 2, reset: 10 * s},
			{at: 1 * s, cost: 2, admitted: 2, remaining: 0, reset: 10 * s},
			{at: 2 * s, cost: 1, admitted: 0, remaining: 0, reset: 9 * s, retry: 8 * s},
			// at t0+10s the first unit has left the window: one of two fits.
			{at: 10 * s, cost: 2, need: 1, admitted: 1, remaining: 0, reset: 10 * s, retry: 1 * s},
			// one request of 2 is all-or-nothing: nothing is taken.
			{at: 10 * s, cost: 2, admitted: 0, remaining: 0, reset: 10 * s, retry: 1 * s},
		}},
		{"sliding log min interval", limiter.Limit{Algorithm: limit.SlidingLog, Limit: 10, Window: 10 * s, MinInterval: 2 * s}, []step{
			{at: 0, cost: 1, admitted: 1, remaining: 9, reset: 10 * s},
			{at: 1 * s, cost: 1, admitted: 0, remaining: 9, reset: 9 * s, retry: 1 * s},
			// a coalesced call of 3 units with one request's need admits one request.
			{at: 2 * s, cost: 3, need: 1, admitted: 1, remaining: 8, reset: 10 * s, retry: 2 * s},
		}},
		{"fixed window admits 2x across a boundary", limiter.Limit{Algorithm: limit.FixedWindow, Limit: 3, Window: 10 * s}, []step{
			{at: 9 * s, cost: 3, admitted: 3, remaining: 0, reset: 1 * s},
			{at: 9500 * ms, cost: 1, admitted: 0, remaining: 0, reset: 500 * ms, retry: 500 * ms},
			{at: 10 * s, cost: 3, admitted: 3, remaining: 0, reset: 10 * s},
			{at: 10 * s, refund: 3},
			{at: 10500 * ms, cost: 1, admitted: 1, remaining: 2, reset: 9500 * ms},
		}},
		{"sliding window weights the previous window", limiter.Limit{Algorithm: limit.SlidingWindow, Limit: 10, Window: 10 * s}, []step{
			{at: 5 * s, cost: 10, admitted: 10, remaining: 0, reset: 15 * s},
			// 2 s into the next window, prev counts 10·8/10 = 8: two fit.
			{at: 12 * s, cost: 5, admitted: 0, remaining: 2, reset: 8 * s, retry: 3 * s},
			{at: 12 * s, cost: 5, need: 1, admitted: 2, remaining: 0, reset: 18 * s, retry: 1 * s},
			{at: 17 * s, cost: 5, admitted: 5, remaining: 0, reset: 13 * s},
			{at: 17 * s, cost: 1, admitted: 0, remaining: 0, reset: 13 * s, retry: 1 * s},
			{at: 17 * s, refund: 4},
			{at: 17 * s, cost: 5, admitted: 5, remaining: 0, reset: 13 * s},
		}},
		{"token bucket burst and rate", limiter.Limit{Algorithm: limit.TokenBucket, Limit: 10, Window: 10 * s, Burst: 5}, []step{
			{at: 0, cost: 5, admitted: 5, remaining: 0, reset: 5 * s},
			{at: 500 * ms, cost: 1, admitted: 0, remaining: 0, reset: 4500 * ms, retry: 500 * ms},
			{at: 2 * s, cost: 3, admitted: 0, remaining: 2, reset: 3 * s, retry: 1 * s},
			{at: 2 * s, cost: 3, need: 1, admitted: 2, remaining: 0, reset: 5 * s, retry: 1 * s},
			{at: 2 * s, refund: 4},
			{at: 2 * s, cost: 2, admitted: 2, remaining: 0, reset: 5 * s},
			// six one-unit requests coalesced: the burst of 5 admits five.
			{at: 100 * s, cost: 6, need: 1, admitted: 5, remaining: 0, reset: 5 * s, retry: 1 * s},
		}},
		{"leaky bucket capacity and leak", limiter.Limit{Algorithm: limit.LeakyBucket, Limit: 10, Window: 10 * s, Burst: 5}, []step{
			{at: 0, cost: 5, admitted: 5, remaining: 0, reset: 5 * s},
			// 0.5 of 5 units leaked: a whole unit does not fit for another 0.5 s.
			{at: 500 * ms, cost: 1, admitted: 0, remaining: 0, reset: 4500 * ms, retry: 500 * ms},
			{at: 2 * s, cost: 3, admitted: 0, remaining: 2, reset: 3 * s, retry: 1 * s},
			{at: 2 * s, cost: 3, need: 1, admitted: 2, remaining: 0, reset: 5 * s, retry: 1 * s},
			{at: 2 * s, refund: 4},
			{at: 2 * s, cost: 2, admitted: 2, remaining: 0, reset: 5 * s},
			// six one-unit requests coalesced into an empty bucket: five fit.
			{at: 100 * s, cost: 6, need: 1, admitted: 5, remaining: 0, reset: 5 * s, retry: 1 * s},
			// the level drains at limit/window: 2.5 units after 2.5 s.
			{at: 102500 * ms, cost: 3, need: 1, admitted: 2, remaining: 0, reset: 4500 * ms, retry: 500 * ms},
		}},
		{"concurrency slots", limiter.Limit{Algorithm: limit.Concurrency, Limit: 2, Window: 30 * s}, []step{
			{at: 0, cost: 1, admitted: 1, remaining: 1, reset: 30 * s},
			{at: 1 * s, cost: 2, need: 1, admitted: 1, remaining: 0, reset: 29 * s, retry: 1 * s},
			{at: 1 * s, refund: 1},
			{at: 2 * s, cost: 1, admitted: 1, remaining: 0, reset: 29 * s, retry: 0},
			// stale slots expire after the window.
			{at: 40 * s, cost: 2, admitted: 2, remaining: 0, reset: 30 * s},
		}},
	}
	for _, st := range allStores(t) {
		for _, c := range cases {
			t.Run(st.name+"/"+c.name, func(t *testing.T) {
				l := c.limit
				l.Key = testenv.KeyPrefix(t)
				leases := make([]limiter.Lease, len(c.steps))
				for i, sp := range c.steps {
					if sp.refund > 0 {
						require.NoError(t, st.store.Refund(ctx(t), []limiter.Lease{leases[sp.refund-1]}))
						continue
					}
					ds, err := st.store.Take(ctx(t), []limiter.Request{{Limit: l, Cost: sp.cost, Need: sp.need, At: t0.Add(sp.at)}})
					require.NoError(t, err, "step %d", i+1)
					d := ds[0]
					leases[i] = d.Lease
					got := step{at: sp.at, cost: sp.cost, need: sp.need, admitted: d.Admitted, remaining: d.Remaining, reset: d.ResetAfter, retry: d.RetryAfter}
					require.Equal(t, sp, got, "step %d", i+1)
					require.Equal(t, d.Admitted == sp.cost, d.Allowed)
					require.Equal(t, l.Limit, d.Limit)
				}
			})
		}
	}
}
