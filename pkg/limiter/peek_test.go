package limiter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// peekWindow is long enough that no bucket refills a unit while a test
// runs; its fixed window starts again at midnight UTC, which the tests that
// count in it wait past (testenv.EarlyInWindow).
const peekWindow = 24 * time.Hour

// redisState is what a limit's Redis keys hold: each key's DUMP ("" when
// absent).
func redisState(t *testing.T, c redis.UniversalClient, keys []string) []string {
	t.Helper()
	out := make([]string, len(keys))
	for i, k := range keys {
		v, err := c.Dump(context.Background(), k).Result()
		if err == redis.Nil {
			continue
		}
		require.NoError(t, err)
		out[i] = v
	}
	return out
}

// TestPeekCountsNothing: a peek answers what remains and takes nothing, for
// every algorithm that can peek, in memory and in Redis: no key is created,
// no field or TTL changes, and the takes after many peeks admit exactly the
// limit.
func TestPeekCountsNothing(t *testing.T) {
	testenv.EarlyInWindow(peekWindow, 10*time.Second) // not across midnight UTC
	const lim, taken = 5, 2
	for _, ns := range []struct {
		name string
		c    redis.UniversalClient
	}{{"memory", nil}, {"standalone", client(limiter.ModeStandalone)}, {"cluster", client(limiter.ModeCluster)}} {
		for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.TokenBucket, limit.LeakyBucket, limit.SlidingWindow} {
			t.Run(ns.name+"/"+alg.String(), func(t *testing.T) {
				var store limiter.Store = limiter.NewMemoryStore()
				var rs *limiter.RedisStore
				if ns.c != nil {
					rs = redisStore(t, ns.c)
					store = rs
				}
				l, err := limiter.New(store, limiter.Config{}, nil, nil)
				require.NoError(t, err)
				t.Cleanup(l.Close)
				li := limit.Limit{Key: fmt.Sprintf("peek-%s-%d", t.Name(), time.Now().UnixNano()), Algorithm: alg, Limit: lim, Window: peekWindow}
				peek := []limiter.Check{{Limit: li, Cost: 1, Peek: true}}
				take := []limiter.Check{{Limit: li, Cost: 1}}
				var keys []string
				if rs != nil {
					keys = rs.Keys(li)
				}

				// Never taken: the whole limit, and no key created.
				v, err := l.Decide(ctx(t), peek)
				require.NoError(t, err)
				require.True(t, v.Allowed)
				require.Equal(t, int64(lim), v.Checks[0].Remaining)
				require.Equal(t, int64(0), v.Checks[0].Admitted)
				if rs != nil {
					require.Equal(t, make([]string, len(keys)), redisState(t, ns.c, keys), "a peek created a key")
				}

				for range taken {
					v, err := l.Decide(ctx(t), take)
					require.NoError(t, err)
					require.True(t, v.Allowed)
				}
				var before []string
				if rs != nil {
					// A TTL far from any the scripts set: a peek that
					// touched it would show.
					for _, k := range keys {
						if n, err := ns.c.Exists(context.Background(), k).Result(); err == nil && n == 1 {
							require.NoError(t, ns.c.PExpire(context.Background(), k, 3*peekWindow).Err())
						}
					}
					before = redisState(t, ns.c, keys)
				}
				for range 20 {
					v, err := l.Decide(ctx(t), peek)
					require.NoError(t, err)
					require.True(t, v.Allowed)
					require.Equal(t, int64(lim-taken), v.Checks[0].Remaining)
					require.Equal(t, limiter.SourceStore, v.Checks[0].Source)
				}
				if rs != nil {
					require.Equal(t, before, redisState(t, ns.c, keys), "a peek changed the key")
					for _, k := range keys {
						if n, err := ns.c.Exists(context.Background(), k).Result(); err == nil && n == 1 {
							ttl, err := ns.c.PTTL(context.Background(), k).Result()
							require.NoError(t, err)
							require.Greater(t, ttl, 2*peekWindow, "a peek set the TTL of %s", k)
						}
					}
				}
				// The peeks took nothing: exactly the rest of the limit is admitted.
				admitted := 0
				for range lim {
					v, err := l.Decide(ctx(t), take)
					require.NoError(t, err)
					if v.Allowed {
						admitted++
					}
				}
				require.Equal(t, lim-taken, admitted)

				// Over: the over-limit cache answers without a call,
				// and the store answers the same.
				v, err = l.Decide(ctx(t), peek)
				require.NoError(t, err)
				require.False(t, v.Allowed)
				require.Equal(t, int64(0), v.Checks[0].Remaining)
				l.Flush()
				v, err = l.Decide(ctx(t), peek)
				require.NoError(t, err)
				require.False(t, v.Allowed)
				require.Equal(t, int64(0), v.Checks[0].Remaining)
				require.Equal(t, limiter.SourceStore, v.Checks[0].Source)
				require.Positive(t, v.Checks[0].ResetAfter)
			})
		}
	}
}

// TestPeekOverLimitCached: a key the over-limit cache holds is answered
// over without a store call.
func TestPeekOverLimitCached(t *testing.T) {
	testenv.EarlyInWindow(peekWindow, 10*time.Second) // not across midnight UTC
	rs := redisStore(t, client(limiter.ModeStandalone))
	l, err := limiter.New(rs, limiter.Config{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	li := limit.Limit{Key: fmt.Sprintf("peek-cached-%d", time.Now().UnixNano()), Algorithm: limit.FixedWindow, Limit: 1, Window: peekWindow}
	for _, want := range []bool{true, false} {
		v, err := l.Decide(ctx(t), []limiter.Check{{Limit: li, Cost: 1}})
		require.NoError(t, err)
		require.Equal(t, want, v.Allowed)
	}
	v, err := l.Decide(ctx(t), []limiter.Check{{Limit: li, Cost: 1, Peek: true}})
	require.NoError(t, err)
	require.False(t, v.Allowed)
	require.Equal(t, limiter.SourcePrefilter, v.Checks[0].Source)
}

// TestPeekRefused: the algorithms whose scripts trim before they read, and
// leased checks, cannot peek: the limiter refuses them before any call, and
// a store refuses such a request.
func TestPeekRefused(t *testing.T) {
	st := &takeCounter{Store: limiter.NewMemoryStore()}
	l, err := limiter.New(st, limiter.Config{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	log := limit.Limit{Key: "k", Algorithm: limit.SlidingLog, Limit: 5, Window: time.Minute}
	for _, c := range []limiter.Check{
		{Limit: log, Cost: 1, Peek: true},
		{Limit: limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 5, Window: time.Minute}, Cost: 1, Peek: true, Tolerance: 0.1},
	} {
		_, err := l.Decide(ctx(t), []limiter.Check{c})
		require.ErrorIs(t, err, limiter.ErrInvalidRequest)
	}
	require.Zero(t, st.takes.Load(), "refused before any call")
	for _, s := range []limiter.Store{limiter.NewMemoryStore(), redisStore(t, client(limiter.ModeStandalone))} {
		_, err := s.Take(ctx(t), []limiter.Request{{Limit: log, Cost: 1, Peek: true}})
		require.ErrorIs(t, err, limiter.ErrInvalidRequest)
	}
}

// takeCounter counts the calls of Take.
type takeCounter struct {
	limiter.Store
	takes atomic.Int64
}

func (s *takeCounter) Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	s.takes.Add(1)
	return s.Store.Take(ctx, reqs)
}

// downStore fails every call while down is set.
type downStore struct {
	limiter.Store
	down atomic.Bool
}

var errPeekDown = fmt.Errorf("store down")

func (s *downStore) Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	if s.down.Load() {
		return make([]limiter.Decision, len(reqs)), errPeekDown
	}
	return s.Store.Take(ctx, reqs)
}

func (s *downStore) Probe(ctx context.Context, l limiter.Limit) error {
	if s.down.Load() {
		return errPeekDown
	}
	return s.Store.Probe(ctx, l)
}

// TestPeekInFallback: while Redis cannot answer, a peek answers from the
// fallback's view (this node's share of the store's last answer, then of
// the fallback's own count) and counts nothing there: the takes of the
// outage admit exactly the share left, and the store counts exactly the
// limit once back.
func TestPeekInFallback(t *testing.T) {
	const lim, taken = 6, 2
	c := client(limiter.ModeStandalone)
	rs := redisStore(t, c)
	st := &downStore{Store: rs}
	l, err := limiter.New(st, limiter.Config{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	li := limit.Limit{Key: fmt.Sprintf("peek-fallback-%d", time.Now().UnixNano()), Algorithm: limit.FixedWindow, Limit: lim, Window: peekWindow}
	// Its outage and the breaker's cool-down take seconds: not across
	// midnight UTC, where the day's fixed window starts again.
	testenv.EarlyInWindow(peekWindow, time.Minute)
	peek := []limiter.Check{{Limit: li, Cost: 1, Peek: true}}
	take := []limiter.Check{{Limit: li, Cost: 1}}
	for range taken {
		v, err := l.Decide(ctx(t), take)
		require.NoError(t, err)
		require.True(t, v.Allowed)
	}
	st.down.Store(true)
	peekAll := func(want int64) {
		t.Helper()
		for range 10 {
			v, err := l.Decide(ctx(t), peek)
			require.NoError(t, err)
			require.Equal(t, limiter.SourceFallback, v.Checks[0].Source)
			require.Equal(t, want, v.Checks[0].Remaining)
			require.Equal(t, want > 0, v.Allowed)
		}
	}
	peekAll(lim - taken) // before the outage's first take: the store's last answer
	v, err := l.Decide(ctx(t), take)
	require.NoError(t, err)
	require.True(t, v.Allowed)
	require.Equal(t, limiter.SourceFallback, v.Checks[0].Source)
	peekAll(lim - taken - 1) // after it: the fallback's count
	admitted := 0
	for range lim {
		v, err := l.Decide(ctx(t), take)
		require.NoError(t, err)
		if v.Allowed {
			admitted++
		}
	}
	require.Equal(t, lim-taken-1, admitted, "the peeks were counted in the fallback")
	peekAll(0)

	// Back: the first take carries what the fallback admitted; the store
	// then holds exactly the limit.
	st.down.Store(false)
	require.Eventually(t, func() bool {
		v, err := l.Decide(ctx(t), take)
		return err == nil && v.Checks[0].Source == limiter.SourceStore
	}, 10*time.Second, time.Millisecond)
	vals, err := c.HVals(context.Background(), rs.Keys(li)[0]).Result()
	require.NoError(t, err)
	require.Len(t, vals, 1)
	require.Equal(t, fmt.Sprint(lim), vals[0])
}
