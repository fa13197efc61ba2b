package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// decider is a Limiter over st that always asks it (no fallback within the
// tests' generous deadline).
func decider(t *testing.T, st limiter.Store) *limiter.Limiter {
	l, err := limiter.New(st, limiter.Config{Timeout: 20 * time.Second, FailMode: limiter.FailClosed}, nil, nil)
	require.NoError(t, err)
	return l
}

func checks(reqs ...limiter.Request) []limiter.Check {
	out := make([]limiter.Check, len(reqs))
	for i, r := range reqs {
		out[i] = limiter.Check{Limit: r.Limit, Cost: r.Cost}
	}
	return out
}

// A request denied by one of its limits must leave its other limits as they
// were: the same history with and without the denied request ends in the same
// answers. (The Limiter decides at the store's clock, so the probes compare
// counts, not times.)
func TestDecideRefundsOtherLimitsOnDenial(t *testing.T) {
	// Hour-long windows: the Limiter decides at the store's real clock, and
	// a window boundary or a refill between the two histories' calls would
	// make them differ for another reason than a missing refund. The test
	// takes about a second: it starts with room left in the hour.
	testenv.EarlyInWindow(time.Hour, 10*time.Second)
	others := []limiter.Limit{
		{Algorithm: limit.SlidingLog, Limit: 10, Window: time.Hour},
		{Algorithm: limit.SlidingWindow, Limit: 10, Window: time.Hour},
		{Algorithm: limit.TokenBucket, Limit: 10, Window: time.Hour, Burst: 8},
		{Algorithm: limit.FixedWindow, Limit: 10, Window: time.Hour},
		{Algorithm: limit.Concurrency, Limit: 10, Window: time.Hour},
		{Algorithm: limit.LeakyBucket, Limit: 10, Window: time.Hour, Burst: 8},
	}
	for _, st := range allStores(t) {
		for _, other := range others {
			t.Run(st.name+"/"+other.Algorithm.String(), func(t *testing.T) {
				p := testenv.KeyPrefix(t)
				withDenied, without := other, other
				withDenied.Key, without.Key = p+"a1", p+"a2"
				tight := limiter.Limit{Key: p + "b", Algorithm: limit.SlidingLog, Limit: 1, Window: time.Hour}
				take := func(l limiter.Limit, cost int64) limiter.Decision {
					ds, err := st.store.Take(ctx(t), []limiter.Request{{Limit: l, Cost: cost}})
					require.NoError(t, err)
					return ds[0]
				}
				take(withDenied, 3)
				take(without, 3)
				take(tight, 1)

				v, err := decider(t, st.store).Decide(ctx(t), checks(
					limiter.Request{Limit: withDenied, Cost: 2},
					limiter.Request{Limit: tight, Cost: 1},
				))
				require.NoError(t, err)
				require.False(t, v.Allowed)
				require.True(t, v.Checks[0].Allowed, "the other limit admitted before the refund")
				require.False(t, v.Checks[1].Allowed)

				a, b := take(without, 10), take(withDenied, 10)
				require.Equal(t, [2]int64{a.Admitted, a.Remaining}, [2]int64{b.Admitted, b.Remaining})
			})
		}
	}
}

func TestDecideAllowsWhenAllAdmit(t *testing.T) {
	for _, st := range allStores(t) {
		t.Run(st.name, func(t *testing.T) {
			p := testenv.KeyPrefix(t)
			reqs := []limiter.Request{
				{Limit: limiter.Limit{Key: p + "a", Algorithm: limit.SlidingLog, Limit: 2, Window: time.Hour}, Cost: 1},
				{Limit: limiter.Limit{Key: p + "b", Algorithm: limit.TokenBucket, Limit: 2, Window: time.Hour}, Cost: 1},
			}
			l := decider(t, st.store)
			for i := range 2 {
				v, err := l.Decide(ctx(t), checks(reqs...))
				require.NoError(t, err)
				require.True(t, v.Allowed)
				require.EqualValues(t, 1-i, v.Checks[0].Remaining)
			}
			v, err := l.Decide(ctx(t), checks(reqs...))
			require.NoError(t, err)
			require.False(t, v.Allowed)
		})
	}
}

// A coalesced call's lease splits per request, and each share refunds alone.
func TestLeaseSplitRefundsShares(t *testing.T) {
	for _, st := range allStores(t) {
		t.Run(st.name, func(t *testing.T) {
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingLog, Limit: 10, Window: 10 * s}
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
