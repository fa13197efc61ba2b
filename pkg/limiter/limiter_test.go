package limiter

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// countingStore wraps a store: counts calls and units asked, can hold calls at
// a gate, and can fail.
type countingStore struct {
	Store
	calls, takes, units, refunds, probes atomic.Int64
	gate                                 chan struct{} // when set, Take waits for a receive
	fail                                 atomic.Bool
}

var errDown = errors.New("store down")

func (s *countingStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	s.calls.Add(1)
	s.takes.Add(int64(len(reqs)))
	for _, r := range reqs {
		s.units.Add(r.Cost)
	}
	if s.gate != nil {
		<-s.gate
	}
	if s.fail.Load() {
		return make([]Decision, len(reqs)), errDown
	}
	return s.Store.Take(ctx, reqs)
}

func (s *countingStore) Probe(ctx context.Context, l Limit) error {
	s.probes.Add(1)
	if s.fail.Load() {
		return errDown
	}
	return s.Store.Probe(ctx, l)
}

func (s *countingStore) Refund(ctx context.Context, leases []Lease) error {
	s.refunds.Add(int64(len(leases)))
	return s.Store.Refund(ctx, leases)
}

// fakeClock is shared by the memory store and the limiter.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestLimiter(t *testing.T, cfg Config) (*Limiter, *countingStore, *fakeClock) {
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &countingStore{Store: NewMemoryStore(WithClock(clock.now))}
	cfg.Timeout = time.Second
	l, err := New(st, cfg, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	l.now = clock.now
	l.fallback = NewMemoryStore(WithClock(clock.now))
	return l, st, clock
}

// standaloneStore is a store, its script loaded, on a Redis of the test's
// own (keys under the test's prefix), closed with the test.
func standaloneStore(t *testing.T) *RedisStore {
	_, st := standaloneServer(t)
	return st
}

// standaloneServer is standaloneStore with its server, for a test that
// freezes or empties it.
func standaloneServer(t *testing.T) (*testenv.Standalone, *RedisStore) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	c, err := NewRedisClient(srv.URL(), ModeStandalone)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	st, err := NewRedisStore(Conn(c), testenv.KeyPrefix(t))
	require.NoError(t, err)
	require.NoError(t, st.Load(context.Background()))
	return srv, st
}

func lim(key string, alg Algorithm, n int64, w time.Duration) Limit {
	return Limit{Key: key, Algorithm: alg, Limit: n, Window: w}
}

func TestLimiterAllOrNothing(t *testing.T) {
	l, _, _ := newTestLimiter(t, Config{})
	wide := lim("wide", limit.SlidingLog, 10, time.Minute)
	tight := lim("tight", limit.FixedWindow, 1, time.Minute)
	v, err := l.Decide(context.Background(), []Check{{Limit: wide, Cost: 1}, {Limit: tight, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v.Allowed)
	require.EqualValues(t, 9, v.Checks[0].Remaining)

	v, err = l.Decide(context.Background(), []Check{{Limit: wide, Cost: 1}, {Limit: tight, Cost: 1}})
	require.NoError(t, err)
	require.False(t, v.Allowed)
	v, err = l.Decide(context.Background(), []Check{{Limit: wide, Cost: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 8, v.Checks[0].Remaining, "the denied request's unit on `wide` was refunded")
}

func TestLimiterShadowNeverDenies(t *testing.T) {
	l, _, _ := newTestLimiter(t, Config{})
	shadow := lim("shadow", limit.FixedWindow, 2, time.Minute)
	for i := range 4 {
		v, err := l.Decide(context.Background(), []Check{{Limit: shadow, Cost: 1, Shadow: true}})
		require.NoError(t, err)
		require.True(t, v.Allowed)
		require.Equal(t, i < 2, v.Checks[0].Allowed, "request %d: the shadow check itself says whether it would deny", i)
		require.Equal(t, SourceStore, v.Checks[0].Source, "shadow denials are never served from the cache")
	}
}

func TestLimiterReleasesConcurrencySlots(t *testing.T) {
	l, _, _ := newTestLimiter(t, Config{})
	c := lim("conc", limit.Concurrency, 1, time.Minute)
	v, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v.Allowed)
	v2, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.False(t, v2.Allowed)
	l.Release(context.Background(), v)
	v3, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v3.Allowed)
	l.Release(context.Background(), v3)
	l.Release(context.Background(), v3) // twice is harmless: a lease is given back once
	v4, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v4.Allowed)
}

func TestOverLimitCache(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{})
	k := lim("hot", limit.SlidingLog, 2, 10*time.Second)
	decide := func(cost int64) Verdict {
		v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: cost}})
		require.NoError(t, err)
		return v
	}
	decide(1)
	clock.add(time.Second)
	decide(1)
	v := decide(1) // the store denies: retry when the first unit leaves, 9 s
	require.False(t, v.Allowed)
	require.Equal(t, SourceStore, v.Checks[0].Source)
	require.Equal(t, 9*time.Second, v.Checks[0].RetryAfter)
	calls := st.takes.Load()

	clock.add(4 * time.Second)
	v = decide(1)
	require.False(t, v.Allowed)
	require.Equal(t, SourcePrefilter, v.Checks[0].Source)
	require.Equal(t, 5*time.Second, v.Checks[0].RetryAfter)
	require.Equal(t, calls, st.takes.Load(), "denied locally, no store call")

	clock.add(5 * time.Second) // the retry time: back to the store, which admits
	v = decide(1)
	require.True(t, v.Allowed)
	require.Equal(t, SourceStore, v.Checks[0].Source)

	decide(1) // denied by the store again, cached
	require.Equal(t, SourcePrefilter, decide(1).Checks[0].Source)
	l.Flush()
	require.Equal(t, SourceStore, decide(1).Checks[0].Source, "rules changed: cache flushed")
}

// The prefilter must never deny what the store would allow: the same random
// traffic through a Limiter and straight to an identical store gives the same
// admissions.
func TestOverLimitCacheNeverDeniesWhatStoreAllows(t *testing.T) {
	for _, alg := range limit.All() {
		if alg.Spec().Held {
			continue // never cached
		}
		t.Run(alg.String(), func(t *testing.T) {
			l, _, clock := newTestLimiter(t, Config{})
			direct := NewMemoryStore(WithClock(clock.now))
			k := lim("k", alg, 5, 2*time.Second)
			if alg.Spec().Burst {
				k.Burst = 3
			}
			seed := uint64(alg)
			for i := range 3000 {
				seed = seed*6364136223846793005 + 1442695040888963407
				clock.add(time.Duration(seed>>40%300) * time.Millisecond)
				cost := int64(1 + seed>>20%2)
				v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: cost}})
				require.NoError(t, err)
				ds, err := direct.Take(context.Background(), []Request{{Limit: k, Cost: cost}})
				require.NoError(t, err)
				require.Equal(t, ds[0].Allowed, v.Allowed, "step %d (source %s)", i, v.Checks[0].Source)
			}
		})
	}
}

func TestOverLimitCacheIsBounded(t *testing.T) {
	c := newOverLimitCache(640)
	now := time.Now()
	for i := range 10000 {
		c.put(lim(string(rune('a'+i%26))+time.Duration(i).String(), limit.FixedWindow, 1, time.Minute), 1, Decision{Limit: 1, RetryAfter: time.Minute}, now, 0)
	}
	require.LessOrEqual(t, c.len(), 640)
	require.Greater(t, c.len(), 500)
}

// A give-back drops the key's cached denial, and a denial from a call sent
// before the give-back returned (the store may have decided it before the
// units were back) is not cached after it; one from a call sent later is.
func TestOverLimitCacheAfterGiveBack(t *testing.T) {
	c := newOverLimitCache(640)
	k := lim("flood", limit.FixedWindow, 10, time.Minute)
	t0 := time.Now()
	denied := Decision{Limit: 10, RetryAfter: time.Minute, ResetAfter: time.Minute}
	c.put(k, 1, denied, t0, 0)
	_, ok := c.get(k, 1, t0.Add(time.Millisecond))
	require.True(t, ok, "a denial is cached")

	back := t0.Add(10 * time.Millisecond)
	c.dropAfterGiveBack(k, back)
	_, ok = c.get(k, 1, back)
	require.False(t, ok, "the give-back dropped it")
	c.put(k, 1, denied, back.Add(-time.Millisecond), 0)
	_, ok = c.get(k, 1, back.Add(time.Millisecond))
	require.False(t, ok, "a denial of a call sent before the give-back returned is not kept")
	c.put(k, 1, denied, back, 0)
	_, ok = c.get(k, 1, back.Add(time.Millisecond))
	require.True(t, ok, "one sent after it is")
	require.Equal(t, 1, c.len())
}

// Checks for one key that arrive while its call is in flight travel together.
func TestCoalescingOneCallPerBatch(t *testing.T) {
	for _, tc := range []struct {
		name         string
		limit, flood int64
	}{{"limit above flood", 1000, 200}, {"limit below flood", 150, 200}} {
		t.Run(tc.name, func(t *testing.T) {
			l, st, _ := newTestLimiter(t, Config{})
			st.gate = make(chan struct{})
			k := lim("flood", limit.SlidingLog, tc.limit, time.Minute)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			first := make(chan struct{})
			wg.Add(1)
			go func() { // the leader: its call waits at the gate
				defer wg.Done()
				close(first)
				v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
				require.NoError(t, err)
				if v.Allowed {
					admitted.Add(1)
				}
			}()
			<-first
			require.Eventually(t, func() bool { return st.takes.Load() == 1 }, 5*time.Second, time.Millisecond)
			for range tc.flood - 1 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
					require.NoError(t, err)
					if v.Allowed {
						admitted.Add(1)
					}
				}()
			}
			require.Eventually(t, func() bool {
				return int64(testCounter(l.metrics.coalesced)) == tc.flood-1
			}, 5*time.Second, time.Millisecond)
			st.gate <- struct{}{} // the leader's call
			st.gate <- struct{}{} // the one batch carrying everyone else
			wg.Wait()
			require.EqualValues(t, 2, st.takes.Load(), "one call for the leader, one for the batch")
			require.EqualValues(t, min(tc.limit, tc.flood), admitted.Load())
			require.Equal(t, tc.flood, st.units.Load(), "the batch carried the summed cost")
		})
	}
}

// fallbackAdmitted decides c n times, each from the local fallback, and
// counts the admissions.
func fallbackAdmitted(t *testing.T, l *Limiter, c Check, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		v, err := l.Decide(context.Background(), []Check{c})
		require.NoError(t, err)
		require.Equal(t, SourceFallback, v.Checks[0].Source)
		if v.Allowed {
			admitted++
		}
	}
	return admitted
}

func TestFallbackModes(t *testing.T) {
	k := lim("k", limit.FixedWindow, 10, time.Minute)
	t.Run("fallback divides the limit by nodes", func(t *testing.T) {
		l, st, clock := newTestLimiter(t, Config{})
		st.fail.Store(true)
		c := Check{Limit: k, Cost: 1, Nodes: 3}
		_, err := l.Decide(context.Background(), []Check{c}) // the store's first failure
		require.NoError(t, err)
		clock.add(k.Window) // failing for a window: down for every node, it counted nothing
		allowed := fallbackAdmitted(t, l, c, 10)
		require.Equal(t, 3, allowed, "floor(10/3) locally: three nodes together admit at most the limit")
	})
	t.Run("open admits", func(t *testing.T) {
		l, st, _ := newTestLimiter(t, Config{FailMode: FailOpen})
		st.fail.Store(true)
		v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
		require.NoError(t, err)
		require.True(t, v.Allowed)
		require.Equal(t, SourceOpen, v.Checks[0].Source)
	})
	t.Run("closed refuses", func(t *testing.T) {
		l, st, _ := newTestLimiter(t, Config{FailMode: FailClosed})
		st.fail.Store(true)
		_, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
		require.ErrorIs(t, err, ErrUnavailable)
	})
	t.Run("invalid check is an error, not a fallback", func(t *testing.T) {
		l, _, _ := newTestLimiter(t, Config{})
		_, err := l.Decide(context.Background(), []Check{{Limit: lim("k", limit.FixedWindow, 0, time.Minute), Cost: 1}})
		require.ErrorIs(t, err, ErrInvalidLimit)
	})
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{BreakerFailures: 3, BreakerCooldown: time.Second})
	k := lim("k", limit.FixedWindow, 100, time.Minute)
	decide := func() Decision {
		v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
		require.NoError(t, err)
		return v.Checks[0]
	}
	st.fail.Store(true)
	for range 3 {
		require.Equal(t, SourceFallback, decide().Source)
	}
	require.EqualValues(t, 3, st.calls.Load())
	for range 10 {
		decide()
	}
	require.EqualValues(t, 3, st.calls.Load(), "breaker open: no calls")
	require.EqualValues(t, breakerOpen, l.breakers.get("").state.Load())

	state := func() breakerState { return breakerState(l.breakers.get("").state.Load()) }
	clock.add(time.Second)
	// The probe runs in the background; the request that triggered it is
	// decided locally like the others.
	require.Equal(t, SourceFallback, decide().Source)
	require.Eventually(t, func() bool { return st.probes.Load() == 1 && state() == breakerOpen }, 5*time.Second, time.Millisecond, "the probe fails: open again")
	decide()
	require.EqualValues(t, 3, st.calls.Load(), "probes count nothing")
	require.EqualValues(t, 1, st.probes.Load(), "one probe per cooldown")

	st.fail.Store(false)
	clock.add(time.Second)
	require.Equal(t, SourceFallback, decide().Source)
	require.Eventually(t, func() bool { return state() == breakerClosed }, 5*time.Second, time.Millisecond, "the probe succeeds")
	require.Equal(t, SourceStore, decide().Source)
	require.Equal(t, SourceStore, decide().Source)
}

func testCounter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// shardedStore plays a Cluster: a limit's shard is the first byte of its key,
// and shards listed in down fail.
type shardedStore struct {
	*MemoryStore
	down  map[string]bool
	calls map[string]int
	mu    sync.Mutex
}

func (s *shardedStore) Shard(l Limit) string { return l.Key[:1] }

func (s *shardedStore) Probe(_ context.Context, l Limit) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down[s.Shard(l)] {
		return errDown
	}
	return nil
}

func (s *shardedStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	ds, _ := s.MemoryStore.Take(ctx, reqs)
	errs := make([]error, len(reqs))
	failed := false
	s.mu.Lock()
	defer s.mu.Unlock()
	called := map[string]bool{}
	for i, r := range reqs {
		if sh := s.Shard(r.Limit); !called[sh] {
			called[sh] = true
			s.calls[sh]++ // one call per shard per Take, replays included
		}
		if s.down[s.Shard(r.Limit)] {
			errs[i], ds[i], failed = errDown, Decision{}, true
		}
	}
	if failed {
		return ds, &TakeError{Errs: errs}
	}
	return ds, nil
}

// One dead shard opens only its own breaker: keys on the healthy shards are
// still decided by the store.
func TestBreakerPerShard(t *testing.T) {
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &shardedStore{MemoryStore: NewMemoryStore(WithClock(clock.now)), down: map[string]bool{"a": true}, calls: map[string]int{}}
	l, err := New(st, Config{Timeout: time.Second, BreakerFailures: 3}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	l.now = clock.now
	onA, onB := lim("a-key", limit.FixedWindow, 100, time.Minute), lim("b-key", limit.FixedWindow, 100, time.Minute)
	for range 10 {
		v, err := l.Decide(context.Background(), []Check{{Limit: onA, Cost: 1}, {Limit: onB, Cost: 1}})
		require.NoError(t, err)
		require.True(t, v.Allowed)
		require.Equal(t, SourceFallback, v.Checks[0].Source)
		require.Equal(t, SourceStore, v.Checks[1].Source, "the healthy shard keeps deciding exactly")
	}
	require.Equal(t, 3, st.calls["a"], "shard a's breaker opened after 3 failures")
	require.Equal(t, 10, st.calls["b"])
	require.EqualValues(t, breakerOpen, l.breakers.get("a").state.Load())
	require.EqualValues(t, breakerClosed, l.breakers.get("b").state.Load())
	require.EqualValues(t, 1, testGauge(l.metrics.breakersOpen))
}

func testGauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		panic(err)
	}
	return m.GetGauge().GetValue()
}

// The fallback's evictions are exported: a flood of random keys while the
// store is down fills the capped fallback and the counter says so.
func TestFallbackEvictionsExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := &countingStore{Store: NewMemoryStore()}
	st.fail.Store(true)
	l, err := New(st, Config{Timeout: time.Second, FallbackKeys: memoryShards, BreakerFailures: 1 << 30}, reg, nil)
	require.NoError(t, err)
	const keys = 500
	for i := range keys {
		v, err := l.Decide(context.Background(), []Check{{Limit: lim("k"+strconv.Itoa(i), limit.FixedWindow, 5, time.Minute), Cost: 1}})
		require.NoError(t, err)
		require.Equal(t, SourceFallback, v.Checks[0].Source)
	}
	evicted := gathered(t, reg, "edgeguard_limiter_fallback_evictions_total")
	require.Equal(t, float64(l.fallback.Evicted()), evicted)
	require.Greater(t, evicted, float64(keys-2*memoryShards), "one key per shard kept, the rest evicted")
}

// gathered reads one unlabelled metric's value from reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not exported", name)
	return 0
}

// swappableStore is a store that can fail and can come back empty (a Redis
// restarted without its data).
type swappableStore struct {
	mu sync.Mutex
	*countingStore
}

func (s *swappableStore) restartEmpty(clock *fakeClock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.countingStore.Store = NewMemoryStore(WithClock(clock.now))
}

// What the fallback admitted while the store was down is replayed into the
// store when it answers again, so a store that comes back empty still holds
// the window to its limit.
func TestFallbackAdmissionsReplayedOnRecovery(t *testing.T) {
	for _, alg := range limit.All() {
		if alg.Spec().Held {
			continue // concurrency slots are released, not replayed
		}
		t.Run(alg.String(), func(t *testing.T) {
			l, st, clock := newTestLimiter(t, Config{BreakerFailures: 1 << 20})
			k := lim("k", alg, 10, time.Hour)
			decide := func() Decision {
				v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
				require.NoError(t, err)
				return v.Checks[0]
			}
			st.fail.Store(true)
			admitted := 0
			for range 4 {
				o := decide()
				require.Equal(t, SourceFallback, o.Source, "witness: decided locally")
				if o.Allowed {
					admitted++
				}
			}
			require.Equal(t, 4, admitted)
			st.fail.Store(false)
			(&swappableStore{countingStore: st}).restartEmpty(clock)
			for range 20 {
				o := decide()
				require.NotEqual(t, SourceFallback, o.Source)
				if o.Allowed {
					admitted++
				}
			}
			require.Equal(t, 10, admitted, "the window holds exactly the limit across the outage and an empty restart")
			require.EqualValues(t, 4, testCounter(l.metrics.replayed))
		})
	}
}

// The store counts each of the fallback's admissions as of when it was
// admitted, not as of when the store answers again: a sliding window or a
// bucket lets them go when it would have had it decided them. Counted as
// of the replay, they were held for as long as the outage lasted after
// them, and clients got fewer than the limit (here, after 4 admitted by
// the fallback 300 ms before the store answered: sliding_log 0 of 4 at the
// second check, sliding_window 5 of 6 at the first, the buckets 7 of 10 at
// the first). Counted as of the latest of them, those admitted earlier
// were held as long as the latest (2 at 300 ms and 2 at 900 ms: the store
// answers at 1,200 ms, and at 1,350 ms sliding_log admitted 5 where 7 fit).
// The limiter's answers equal a store's that decided every request when it
// was made.
func TestReplayDatedWhenAdmitted(t *testing.T) {
	type burst struct {
		at time.Duration
		n  int
	}
	for _, alg := range limit.All() {
		if alg.Spec().Held || alg == limit.FixedWindow {
			continue // slots are released; a fixed window counts a unit in its window either way
		}
		for _, tc := range []struct {
			name     string
			fallback []burst
		}{
			{"at once", []burst{{900 * time.Millisecond, 4}}},
			{"apart", []burst{{300 * time.Millisecond, 2}, {900 * time.Millisecond, 2}}},
		} {
			t.Run(alg.String()+"/"+tc.name, func(t *testing.T) {
				l, st, clock := newTestLimiter(t, Config{BreakerFailures: 1 << 20})
				k := lim("k", alg, 10, time.Second)
				start := clock.now() // a second's start
				control := NewMemoryStore(WithClock(clock.now))
				at := func(d time.Duration, n int, fallback bool) {
					t.Helper()
					clock.add(start.Add(d).Sub(clock.now()))
					got, want := 0, 0
					for range n {
						v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
						require.NoError(t, err)
						require.Equal(t, fallback, v.Checks[0].Source == SourceFallback, "at %v: %s", d, v.Checks[0].Source)
						if v.Allowed {
							got++
						}
						ds, err := control.Take(context.Background(), []Request{{Limit: k, Cost: 1}})
						require.NoError(t, err)
						if ds[0].Allowed {
							want++
						}
					}
					require.Equal(t, want, got, "admitted at %v", d)
				}
				st.fail.Store(true)
				for _, b := range tc.fallback {
					at(b.at, b.n, true)
				}
				st.fail.Store(false)
				at(1200*time.Millisecond, 1, false) // the 4 replayed with it
				require.EqualValues(t, 4, testCounter(l.metrics.replayed))
				at(1350*time.Millisecond, 20, false)
				at(1450*time.Millisecond, 20, false)
				at(1950*time.Millisecond, 20, false)
			})
		}
	}
}

// The fallback starts from the store's last answer: the window an outage
// starts in holds at most the limit across the nodes sharing it.
func TestFallbackSeededFromLastAnswer(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{BreakerFailures: 1 << 20})
	k := lim("k", limit.SlidingLog, 10, time.Hour)
	for range 6 { // the store admits 6: 4 remain for the region
		v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1, Nodes: 2}})
		require.NoError(t, err)
		require.True(t, v.Allowed)
	}
	st.fail.Store(true)
	admitted := fallbackAdmitted(t, l, Check{Limit: k, Cost: 1}, 10)
	require.Equal(t, 4, admitted, "alone, the 4 the store had left, not 10")
	// Shared by two nodes, no share of the answer is safe: the other node
	// may have counted after it (decideLocally).
	k.Key = "shared"
	st.fail.Store(false)
	for range 6 {
		v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1, Nodes: 2}})
		require.NoError(t, err)
		require.True(t, v.Allowed)
	}
	st.fail.Store(true)
	require.Zero(t, fallbackAdmitted(t, l, Check{Limit: k, Cost: 1, Nodes: 2}, 10), "shared: denied while the store answered within the window")
}

// A limit smaller than the nodes sharing it leaves a node no local share:
// it denies, with a retry at the breaker's probe interval.
func TestFallbackLimitBelowNodesDenies(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{BreakerFailures: 1 << 20})
	st.fail.Store(true)
	v, err := l.Decide(context.Background(), []Check{{Limit: lim("k", limit.FixedWindow, 2, time.Minute), Cost: 1, Nodes: 3}})
	require.NoError(t, err)
	require.False(t, v.Allowed)
	require.Equal(t, SourceFallback, v.Checks[0].Source)
	require.Equal(t, time.Second, v.Checks[0].RetryAfter)
}

// A shard no key maps to any more (a failed master whose slots moved) is
// forgotten: its open breaker leaves the metrics.
func TestBreakerOfAGoneShardIsForgotten(t *testing.T) {
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &shardedStore{MemoryStore: NewMemoryStore(WithClock(clock.now)), down: map[string]bool{"a": true}, calls: map[string]int{}}
	l, err := New(st, Config{Timeout: time.Second, BreakerFailures: 1}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	l.now = clock.now
	_, err = l.Decide(context.Background(), []Check{{Limit: lim("a-key", limit.FixedWindow, 100, time.Minute), Cost: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 1, testGauge(l.metrics.breakersOpen), "witness: shard a's breaker opened")
	// The breakers sweep by the wall clock: age shard a's last use instead of sleeping.
	l.breakers.m["a"].used.Store(time.Now().Add(-2 * forgetAfter).UnixNano())
	l.breakers.swept.Store(time.Now().Add(-2 * forgetAfter).UnixNano())
	_, err = l.Decide(context.Background(), []Check{{Limit: lim("b-key", limit.FixedWindow, 100, time.Minute), Cost: 1}})
	require.NoError(t, err)
	require.NotContains(t, l.breakers.m, "a")
	require.EqualValues(t, 0, testGauge(l.metrics.breakersOpen))
	require.Equal(t, 1, testutil.CollectAndCount(l.metrics.breakerState), "only shard b's series is left")
}

// An outage that starts mid-window and ends with the store restarted empty:
// the nodes' seeded shares of what the store had counted are replayed with
// their own admissions, so the window still holds the limit.
func TestEmptyRestartMidWindowHoldsTheLimit(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{BreakerFailures: 1 << 20})
	k := lim("k", limit.SlidingLog, 12, time.Hour)
	admitted := 0
	decide := func(want Source) {
		v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
		require.NoError(t, err)
		if want == SourceFallback {
			require.Equal(t, SourceFallback, v.Checks[0].Source)
		} else {
			require.NotEqual(t, SourceFallback, v.Checks[0].Source)
		}
		if v.Allowed {
			admitted++
		}
	}
	for range 4 {
		decide(SourceStore)
	}
	st.fail.Store(true)
	for range 20 {
		decide(SourceFallback)
	}
	require.Equal(t, 12, admitted, "the store's 4, then the 8 it had left")
	st.fail.Store(false)
	(&swappableStore{countingStore: st}).restartEmpty(clock)
	for range 20 {
		decide(SourceStore)
	}
	require.Equal(t, 12, admitted, "the empty store relearned all 12")
}

// Redis flapping within one window (it comes back with its data each time)
// must not use the quota up: the store's answer before each outage is owed
// back as a restore, which takes nothing from a store that kept its count,
// so the clients get exactly the limit. (Before, two flaps after 43
// requests left a limit of 100 exhausted; then, owing the seeded share once
// per window, 4 of the 47 left.)
func TestFlapsKeepTheQuota(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{BreakerFailures: 1 << 20})
	k := lim("k", limit.FixedWindow, 100, 10*time.Minute)
	decide := func(want Source) bool {
		v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
		require.NoError(t, err)
		if want == SourceFallback {
			require.Equal(t, SourceFallback, v.Checks[0].Source)
		} else {
			require.NotEqual(t, SourceFallback, v.Checks[0].Source)
		}
		return v.Allowed
	}
	real := 0
	for range 43 {
		require.True(t, decide(SourceStore))
		real++
	}
	for flap := range 5 {
		st.fail.Store(true)
		require.True(t, decide(SourceFallback), "flap %d: the fallback admits", flap)
		real++
		st.fail.Store(false)
		require.True(t, decide(SourceStore), "flap %d: the quota is not used up by replays", flap)
		real++
	}
	// 53 real requests, and the store counted each once: 47 left.
	for range 47 {
		require.True(t, decide(SourceStore))
		real++
	}
	require.False(t, decide(SourceStore), "the limit still holds")
	require.Equal(t, 100, real)
}

// On Redis a replay is dated on Redis's clock, through the store's estimate
// of it: never earlier than the fallback's admission was there (the
// estimate's round trip and clockSkew added). Without an estimate it runs
// at Redis's TIME, as before.
func TestReplayDatedOnRedisClock(t *testing.T) {
	srv, st := standaloneServer(t)
	c, err := NewRedisClient(srv.URL(), ModeStandalone)
	require.NoError(t, err)
	defer c.Close()
	k := Limit{Key: "replay", Algorithm: limit.SlidingLog, Limit: 10, Window: time.Minute}
	scores := func() []float64 {
		zs, err := c.ZRangeWithScores(context.Background(), st.Keys(k)[0], 0, -1).Result()
		require.NoError(t, err)
		var out []float64
		for _, z := range zs {
			out = append(out, z.Score)
		}
		return out
	}
	// Redis a second behind the edge, read with a 3 ms round trip.
	st.clock.est.Store(&clockEstimate{offset: -time.Second, rtt: 3 * time.Millisecond, at: time.Now()})
	dated := time.Now().Add(-5 * time.Second)
	replay := Request{Limit: k, Cost: 2, Need: 1, until: dated.Add(k.Window), dated: true}
	_, err = st.Take(context.Background(), []Request{replay})
	require.NoError(t, err)
	want := float64(dated.Add(-time.Second + 3*time.Millisecond + clockSkew).UnixMicro())
	require.Equal(t, []float64{want, want}, scores())

	st.clock.est.Store(nil)
	st.clock.tried.Store(time.Now().UnixNano()) // no reading in the background meanwhile
	replay.Cost = 1
	_, err = st.Take(context.Background(), []Request{replay})
	require.NoError(t, err)
	got := scores()
	require.Len(t, got, 3)
	require.Greater(t, got[2], float64(dated.Add(4*time.Second).UnixMicro()), "run at Redis's TIME")

	// Lots admitted at two times, replayed in one call beside a
	// request: each is dated at its own time.
	k.Key = "lots"
	st.clock.est.Store(&clockEstimate{offset: -time.Second, rtt: 3 * time.Millisecond, at: time.Now()})
	early, late := time.Now().Add(-5*time.Second), time.Now().Add(-2*time.Second)
	ds, err := st.Take(context.Background(), []Request{
		{Limit: k, Cost: 2, Need: 1, until: early.Add(k.Window), dated: true},
		{Limit: k, Cost: 1, Need: 1, until: late.Add(k.Window), dated: true},
		{Limit: k, Cost: 1},
	})
	require.NoError(t, err)
	require.True(t, ds[2].Allowed)
	require.EqualValues(t, 6, ds[2].Remaining, "10 less the 3 replayed and the request")
	got = scores()
	require.Len(t, got, 4)
	onRedis := func(at time.Time) float64 {
		return float64(at.Add(-time.Second + 3*time.Millisecond + clockSkew).UnixMicro())
	}
	require.Equal(t, []float64{onRedis(early), onRedis(early), onRedis(late)}, got[:3])
	require.Greater(t, got[3], onRedis(late), "the request, at Redis's TIME")
}
