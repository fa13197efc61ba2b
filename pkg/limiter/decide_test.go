package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// A request denied by one of its limits must leave its other limits as they
// were: the same history with and without the denied request ends in the same
// answers.
func TestDecideRefundsOtherLimitsOnDenial(t *testing.T) {
	others := []limiter.Limit{
		{Algorithm: limiter.SlidingLog, Limit: 10, Window: 10 * s},
		{Algorithm: limiter.SlidingWindow, Limit: 10, Window: 10 * s},
		{Algorithm: limiter.TokenBucket, Limit: 10, Window: 10 * s, Burst: 8},
		{Algorithm: limiter.FixedWindow, Limit: 10, Window: 10 * s},
		{Algorithm: limiter.Concurrency, Limit: 10, Window: 10 * s},
	}
	for _, st := range allStores(t) {
		for _, other := range others {
			t.Run(st.name+"/"+other.Algorithm.String(), func(t *testing.T) {
				p := testenv.KeyPrefix(t)
				withDenied, without := other, other
				withDenied.Key, without.Key = p+"a1", p+"a2"
				tight := limiter.Limit{Key: p + "b", Algorithm: limiter.FixedWindow, Limit: 1, Window: 10 * s}
				at := t0.Add(2 * s)
				take := func(l limiter.Limit, cost int64, at time.Time) limiter.Decision {
					ds, err := st.store.Take(ctx(t), []limiter.Request{{Limit: l, Cost: cost, At: at}})
					require.NoError(t, err)
					return ds[0]
				}
				take(withDenied, 3, at)
				take(without, 3, at)
				take(tight, 1, at)

				res, err := limiter.Decide(ctx(t), st.store, []limiter.Request{
					{Limit: withDenied, Cost: 2, At: at.Add(ms)},
					{Limit: tight, Cost: 1, At: at.Add(ms)},
				})
				require.NoError(t, err)
				require.False(t, res.Allowed)
				require.True(t, res.Decisions[0].Allowed, "the other limit admitted before the refund")
				require.False(t, res.Decisions[1].Allowed)

				probe := at.Add(time.Second)
				require.Equal(t, view(take(without, 10, probe)), view(take(withDenied, 10, probe)))
			})
		}
	}
}

func TestDecideAllowsWhenAllAdmit(t *testing.T) {
	for _, st := range allStores(t) {
		t.Run(st.name, func(t *testing.T) {
			p := testenv.KeyPrefix(t)
			reqs := []limiter.Request{
				{Limit: limiter.Limit{Key: p + "a", Algorithm: limiter.SlidingLog, Limit: 2, Window: 10 * s}, Cost: 1},
				{Limit: limiter.Limit{Key: p + "b", Algorithm: limiter.TokenBucket, Limit: 2, Window: 10 * s}, Cost: 1},
			}
			for i := range 2 {
				res, err := limiter.Decide(ctx(t), st.store, reqs)
				require.NoError(t, err)
				require.True(t, res.Allowed)
				require.EqualValues(t, 1-i, res.Decisions[0].Remaining)
			}
			res, err := limiter.Decide(ctx(t), st.store, reqs)
			require.NoError(t, err)
			require.False(t, res.Allowed)
		})
	}
}

// A coalesced call's lease splits per request, and each share refunds alone.
func TestLeaseSplitRefundsShares(t *testing.T) {
	for _, st := range allStores(t) {
		t.Run(st.name, func(t *testing.T) {
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limiter.SlidingLog, Limit: 10, Window: 10 * s}
			ds, err := st.store.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 6, At: t0}})
			require.NoError(t, err)
			first, rest := ds[0].Lease.Split(2)
			require.EqualValues(t, 2, first.Units)
			require.EqualValues(t, 4, rest.Units)
			require.NoError(t, st.store.Refund(ctx(t), []limiter.Lease{rest}))
			ds, err = st.store.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1, At: t0.Add(ms)}})
			require.NoError(t, err)
			require.EqualValues(t, 7, ds[0].Remaining, "2 kept + 1 new of 10")
			require.NoError(t, st.store.Refund(ctx(t), []limiter.Lease{first}))
			ds, err = st.store.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1, At: t0.Add(2 * ms)}})
			require.NoError(t, err)
			require.EqualValues(t, 8, ds[0].Remaining)
		})
	}
}
