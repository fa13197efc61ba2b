package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

func leased(l Limit, tol float64, nodes int) []Check {
	return []Check{{Limit: l, Cost: 1, Nodes: nodes, Tolerance: tol}}
}

// held is what l holds of lm's key: units and the next batch's size.
func held(l *Limiter, lm Limit) (units, size int64) {
	v, ok := l.allowances.m.Load(memKey(lm))
	if !ok {
		return 0, 0
	}
	a := v.(*allowance)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.units, a.size
}

// noSweep keeps l's background sweep from starting, and has every batch
// carved by the request short of units (none ahead, in the background):
// these tests walk a fake clock, call ReturnIdle themselves and count
// batches.
func noSweep(l *Limiter) {
	l.allowances.start.Do(func() {})
	l.allowances.inline = true
}

func TestLeaseRefusesWhatCannotBeLeased(t *testing.T) {
	l, _, _ := newTestLimiter(t, Config{})
	t.Cleanup(l.Close)
	noSweep(l)
	for _, c := range []Check{
		{Limit: lim("log", limit.SlidingLog, 10, time.Minute), Cost: 1, Tolerance: 0.05},
		{Limit: lim("conc", limit.Concurrency, 10, time.Minute), Cost: 1, Tolerance: 0.05},
		{Limit: lim("fw", limit.FixedWindow, 10, time.Minute), Cost: 1, Tolerance: 0.6},
		{Limit: lim("fw", limit.FixedWindow, 10, time.Minute), Cost: 1, Tolerance: -0.1},
	} {
		_, err := l.Decide(context.Background(), []Check{c})
		require.ErrorIs(t, err, ErrInvalidRequest, "%s tolerance %g", c.Limit.Algorithm, c.Tolerance)
	}
}

// TestLeaseSizeAdapts: a busy key's batches double up to
// floor(limit × tolerance / nodes), a quiet key's halve back.
func TestLeaseSizeAdapts(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{})
	t.Cleanup(l.Close)
	noSweep(l)
	k := lim("busy", limit.FixedWindow, 6000, time.Hour) // period 1 s; most = 6000 × 0.05 / 3 = 100
	for range 1000 {
		v, err := l.Decide(context.Background(), leased(k, 0.05, 3))
		require.NoError(t, err)
		require.True(t, v.Allowed)
	}
	units, size := held(l, k)
	require.EqualValues(t, 100, size, "a busy key's batch grows to its cap")
	require.Less(t, st.calls.Load(), int64(20), "1000 decisions, batches of up to 101")
	require.LessOrEqual(t, units, int64(100), "an edge holds at most the cap")
	// Quiet: one request every 3 s, longer than two periods.
	for range 10 {
		clock.add(3 * time.Second)
		for {
			v, err := l.Decide(context.Background(), leased(k, 0.05, 3))
			require.NoError(t, err)
			require.True(t, v.Allowed)
			if v.Checks[0].Source == SourceStore {
				break // drained down to a carve
			}
		}
	}
	_, size = held(l, k)
	require.EqualValues(t, 1, size, "a quiet key's batch shrinks back")
}

// TestLeaseAllOrNothing: a leased check's unit goes back to the edge's
// allowance when another check of the request denies, without a call.
func TestLeaseAllOrNothing(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{})
	t.Cleanup(l.Close)
	noSweep(l)
	k := lim("leased", limit.FixedWindow, 1000, time.Hour)
	tight := lim("tight", limit.FixedWindow, 1, time.Hour)
	checks := []Check{{Limit: k, Cost: 1, Tolerance: 0.05}, {Limit: tight, Cost: 1}}
	v, err := l.Decide(context.Background(), checks)
	require.NoError(t, err)
	require.True(t, v.Allowed)
	units, _ := held(l, k)
	refunds := st.refunds.Load()
	v, err = l.Decide(context.Background(), checks)
	require.NoError(t, err)
	require.False(t, v.Allowed)
	after, _ := held(l, k)
	require.Equal(t, units, after, "the leased unit is back")
	require.Equal(t, refunds, st.refunds.Load(), "and the store was not told")
}

// TestLeaseFollowsTheCheckLimit: a check of the same key with a lower
// limit (the behaviour layer tightening a client) does not spend what the
// higher limit carved.
func TestLeaseFollowsTheCheckLimit(t *testing.T) {
	l, _, _ := newTestLimiter(t, Config{})
	t.Cleanup(l.Close)
	noSweep(l)
	full := lim("client", limit.FixedWindow, 100, time.Hour)
	for range 20 {
		v, err := l.Decide(context.Background(), leased(full, 0.1, 1))
		require.NoError(t, err)
		require.True(t, v.Allowed)
	}
	units, _ := held(l, full)
	require.Positive(t, units)
	tight := full
	tight.Limit = 10 // carving limit 11, already used up by the 20
	v, err := l.Decide(context.Background(), leased(tight, 0.1, 1))
	require.NoError(t, err)
	require.False(t, v.Allowed, "the tightened limit is over: the held units are not spent")
}

// TestLeaseEndsWithItsWindow: fixed_window units carved in one window are
// never spent in the next.
func TestLeaseEndsWithItsWindow(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{})
	t.Cleanup(l.Close)
	noSweep(l)
	k := lim("edge-of-window", limit.FixedWindow, 10, time.Second)
	// The fake clock starts on a whole second: move to the window's end.
	clock.add(900 * time.Millisecond)
	for range 6 { // quick succession: batches of 1+1, 1+2, then 1+4 (4 left)
		v, err := l.Decide(context.Background(), leased(k, 0.5, 1))
		require.NoError(t, err)
		require.True(t, v.Allowed)
	}
	units, _ := held(l, k)
	require.EqualValues(t, 4, units)
	calls := st.calls.Load()
	clock.add(100 * time.Millisecond) // the next window
	v, err := l.Decide(context.Background(), leased(k, 0.5, 1))
	require.NoError(t, err)
	require.True(t, v.Allowed)
	require.Equal(t, calls+1, st.calls.Load(), "the old window's units expired: a new carve")
	// The new window holds only what was carved in it (limit 10 + 5).
	admitted := int64(1)
	for {
		v, err := l.Decide(context.Background(), leased(k, 0.5, 1))
		require.NoError(t, err)
		if !v.Allowed {
			break
		}
		admitted++
	}
	require.EqualValues(t, 15, admitted)
}

// TestLeaseIdleReturn: an edge that stops using a key gives its allowance
// back to the window it came from.
func TestLeaseIdleReturn(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{})
	t.Cleanup(l.Close)
	noSweep(l)
	k := lim("idle", limit.FixedWindow, 100, time.Hour)
	for range 11 { // batches of 1+1, 1+2, 1+4, then 1+8 (8 left)
		_, err := l.Decide(context.Background(), leased(k, 0.2, 1))
		require.NoError(t, err)
	}
	kept, _ := held(l, k)
	require.EqualValues(t, 8, kept)
	l.ReturnIdle(clock.now()) // not idle yet
	units, _ := held(l, k)
	require.Equal(t, kept, units)
	clock.add(3 * time.Second) // two periods of 1 s
	l.ReturnIdle(clock.now())
	units, _ = held(l, k)
	require.Zero(t, units)
	// The store counts only the 11 spent: 120 - 11 fit.
	ds, err := st.Store.Take(context.Background(), []Request{{Limit: carveLimit(Check{Limit: k, Tolerance: 0.2}), Cost: 1000, Need: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 120, carveLimit(Check{Limit: k, Tolerance: 0.2}).Limit)
	require.EqualValues(t, 109, ds[0].Admitted)
}

// TestLeaseFallbackBound: two edges share a key; the store fails
// mid-window. What they hold is spent, then the fallback's limit / nodes
// applies to the carving limit L' = limit × (1 + tolerance), seeded with
// what each edge last heard the store had counted: the exact checks'
// bound, L' + ceil(L'/N), holds (docs/guarantees.md).
func TestLeaseFallbackBound(t *testing.T) {
	// inline: every batch carved by the request short of units; ahead: a
	// busy key's batches carved in the background as well (the fake clock
	// never moves, so the key stays busy), some failing with the store.
	for _, ahead := range []bool{false, true} {
		t.Run(map[bool]string{false: "inline", true: "ahead"}[ahead], func(t *testing.T) { leaseFallbackBound(t, ahead) })
	}
}

func leaseFallbackBound(t *testing.T, ahead bool) {
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &countingStore{Store: NewMemoryStore(WithClock(clock.now))}
	var edges []*Limiter
	for range 2 {
		l, err := New(st, Config{Timeout: time.Second}, prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		l.now = clock.now
		l.fallback = NewMemoryStore(WithClock(clock.now))
		t.Cleanup(l.Close)
		noSweep(l)
		l.allowances.inline = !ahead
		edges = append(edges, l)
	}
	k := lim("outage", limit.FixedWindow, 100, time.Hour) // carving limit 110
	var admitted int64
	for i := range 40 {
		v, err := edges[i%2].Decide(context.Background(), leased(k, 0.1, 2))
		require.NoError(t, err)
		require.True(t, v.Allowed)
		admitted++
	}
	st.fail.Store(true)
	sources := map[Source]int{}
	for i := range 400 {
		v, err := edges[i%2].Decide(context.Background(), leased(k, 0.1, 2))
		require.NoError(t, err)
		if v.Allowed {
			admitted++
			sources[v.Checks[0].Source]++
		}
	}
	t.Logf("admitted %d in the window; during the outage by source: %v", admitted, sources)
	require.LessOrEqual(t, admitted, int64(110+55))
	require.Positive(t, sources[SourceFallback], "the fallback decided once the allowance was spent")
	require.GreaterOrEqual(t, admitted, int64(90), "the fallback still admits its share")
}

// TestLeaseFailClosed: with the store down and nothing held, a leased
// check follows the fail mode like an exact one.
func TestLeaseFailClosed(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{FailMode: FailClosed})
	t.Cleanup(l.Close)
	noSweep(l)
	st.fail.Store(true)
	_, err := l.Decide(context.Background(), leased(lim("closed", limit.TokenBucket, 100, time.Second), 0.1, 1))
	require.True(t, errors.Is(err, ErrUnavailable), "%v", err)
}

// TestLeaseTableFull: past its size the edge holds no allowance for new
// keys; their checks are decided exactly, against the rule's own limit.
func TestLeaseTableFull(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{CacheSize: 1})
	t.Cleanup(l.Close)
	noSweep(l)
	first := lim("first", limit.FixedWindow, 100, time.Hour)
	v, err := l.Decide(context.Background(), leased(first, 0.1, 1))
	require.NoError(t, err)
	require.True(t, v.Allowed)
	second := lim("second", limit.FixedWindow, 3, time.Hour)
	calls := st.calls.Load()
	for i := range 5 {
		v, err := l.Decide(context.Background(), leased(second, 0.5, 1))
		require.NoError(t, err)
		require.Equal(t, i < 3, v.Allowed, "request %d: exact, at the rule's own limit", i)
	}
	require.Equal(t, calls+4, st.calls.Load(), "one call per decision up to the first denial, then the cache")
	units, _ := held(l, second)
	require.Zero(t, units)
}

// landed waits for the batch being carved ahead for lm's key, if any.
func landed(t *testing.T, l *Limiter, lm Limit) {
	v, ok := l.allowances.m.Load(memKey(lm))
	if !ok {
		return
	}
	a := v.(*allowance)
	a.mu.Lock()
	done := a.ahead
	a.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the batch carved ahead never landed")
		}
	}
}

// TestLeaseCarvesAhead: a busy key's next batch is carved in the
// background once its allowance is down to a quarter, so its requests are
// decided from units waiting (only the first carves on its own time), and
// the edge never holds more than the cap; a quiet key carves nothing
// ahead (it would only give it back).
func TestLeaseCarvesAhead(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{})
	t.Cleanup(l.Close)
	// No sweep.
	l.allowances.start.Do(func() {})
	// decide sends n leased decisions of k, each after gap, waits for
	// what is carved ahead after each, and counts those carved for on the
	// request's own time.
	decide := func(k Limit, n int, gap time.Duration) (inline int) {
		for range n {
			clock.add(gap)
			v, err := l.Decide(context.Background(), leased(k, 0.05, 3))
			require.NoError(t, err)
			require.True(t, v.Allowed)
			if v.Checks[0].Source == SourceStore {
				inline++
			}
			landed(t, l, k)
			units, _ := held(l, k)
			require.LessOrEqual(t, units, int64(100), "an edge holds at most the cap")
		}
		return inline
	}
	busy := lim("busy", limit.FixedWindow, 6000, time.Hour) // period 1 s; most = 100
	require.Equal(t, 1, decide(busy, 1000, 0), "only the first request carved on its own time")
	_, size := held(l, busy)
	require.EqualValues(t, 100, size, "the batch grows to its cap")
	require.Less(t, st.calls.Load(), int64(30), "1000 decisions in batches of up to 100")

	calls := st.calls.Load()
	inline := decide(lim("quiet", limit.FixedWindow, 6000, time.Hour), 10, 2*time.Second) // two periods apart
	require.Positive(t, inline)
	require.EqualValues(t, inline, st.calls.Load()-calls, "every call was a request's own carve: none ahead")
}

// TestLeaseSlowStoreWaitsOnce: Redis freezes while a busy key's batch is
// carved ahead. A request that runs out of units waits for that batch, at
// most the store's timeout, and when it fails is decided by the fail mode
// (the fallback) without a carve of its own: it waits one timeout, not two.
func TestLeaseSlowStoreWaitsOnce(t *testing.T) {
	srv, st := standaloneServer(t)
	l, err := New(st, Config{Timeout: 300 * time.Millisecond}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	l.allowances.start.Do(func() {}) // no sweep
	k := lim("slow", limit.FixedWindow, 1_000_000, time.Hour)
	decide := func() Decision {
		v, err := l.Decide(context.Background(), leased(k, 0.05, 1))
		require.NoError(t, err)
		require.True(t, v.Allowed)
		return v.Checks[0]
	}
	for range 2000 { // busy: batches grow, and are carved ahead
		decide()
		landed(t, l, k)
	}
	srv.Freeze()
	defer srv.Thaw()
	_, calls := st.Sent()
	var d Decision
	for n := 0; ; n++ {
		require.Less(t, n, 100_000, "never ran out of units")
		if d = decide(); d.Source != SourceLease {
			break
		}
	}
	_, after := st.Sent()
	require.Equal(t, SourceFallback, d.Source, "decided by the fail mode once the batch carved ahead failed")
	require.EqualValues(t, 1, after-calls, "one call while frozen: the batch carved ahead, no carve of the request's own")
}
