package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// exactEdges are n limiters (edges) on one real Redis, each behind a store
// whose failures the test controls; every failed call goes to the fallback
// (no breaker), so what each edge admits is decided by the test alone.
type exactEdges struct {
	srv    *testenv.Standalone
	edges  []*Limiter
	stores []*countingStore
}

func newExactEdges(t *testing.T, n int) *exactEdges {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	e := &exactEdges{srv: srv}
	prefix := testenv.KeyPrefix(t)
	for range n {
		c, err := NewRedisClient(srv.URL(), ModeStandalone)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		st, err := NewRedisStore(Conn(c), prefix)
		require.NoError(t, err)
		require.NoError(t, st.Load(context.Background()))
		cs := &countingStore{Store: st}
		l, err := New(cs, Config{BreakerFailures: 1 << 20}, prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		t.Cleanup(l.Close)
		e.edges = append(e.edges, l)
		e.stores = append(e.stores, cs)
	}
	return e
}

// fail makes every edge's store fail (true) or answer again (false).
func (e *exactEdges) fail(down bool) {
	for _, s := range e.stores {
		s.fail.Store(down)
	}
}

// decide has edge i decide c n times and returns how many units it
// admitted, checking each decision came from want.
func (e *exactEdges) decide(t *testing.T, i int, c Check, n int, want Source) int64 {
	t.Helper()
	var admitted int64
	for range n {
		v, err := e.edges[i].Decide(context.Background(), []Check{c})
		require.NoError(t, err)
		if want == SourceFallback {
			require.Equal(t, SourceFallback, v.Checks[0].Source)
		} else {
			require.NotEqual(t, SourceFallback, v.Checks[0].Source)
		}
		if v.Allowed {
			admitted += c.Cost
		}
	}
	return admitted
}

// An exact rule's window holds at most its limit across a store outage on
// every edge: a key the store has counted to 90 % of its limit through one
// edge leaves the fallback of that edge its share of the 10 % left
// (⌊remaining/N⌋), and the edges that never asked for it — they served
// other keys from the same store in the window — no share at all: the store
// may have counted the whole limit for them. Once the store answers again,
// the clients get exactly the rest of the limit, no fewer.
func TestExactFallbackHoldsTheLimit(t *testing.T) {
	const L, N = 1000, 3
	e := newExactEdges(t, N)
	k := Limit{Key: "exact", Algorithm: limit.SlidingLog, Limit: L, Window: time.Hour}
	c := Check{Limit: k, Cost: 1, Nodes: N}
	other := Check{Limit: Limit{Key: "other", Algorithm: limit.SlidingLog, Limit: L, Window: time.Hour}, Cost: 1, Nodes: N}

	// 900 of 1000 through edge 0; edges 1 and 2 serve other traffic.
	admitted := e.decide(t, 0, Check{Limit: k, Cost: 10, Nodes: N}, 90, SourceStore)
	require.EqualValues(t, 900, admitted)
	for i := 1; i < N; i++ {
		e.decide(t, i, other, 1, SourceStore)
	}

	e.fail(true)
	perEdge := make([]int64, N)
	for i := range N {
		perEdge[i] = e.decide(t, i, c, L, SourceFallback)
	}
	total := admitted + perEdge[0] + perEdge[1] + perEdge[2]
	t.Logf("fallback admitted per edge %v: %d of %d in the window", perEdge, total, L)
	require.Equal(t, []int64{0, 0, 0}, perEdge, "the store answered every edge within the window: others may have counted since, no share is safe")
	require.EqualValues(t, 900, total)

	// The store answers again, within the window: the clients get exactly
	// the limit in all.
	e.fail(false)
	for i := range N {
		total += e.decide(t, i, c, L, SourceStore)
	}
	require.EqualValues(t, L, total, "once the store answers, the clients get the rest of the limit, no fewer")
	require.EqualValues(t, L, e.zcard(t, k), "Redis counted each admitted request once")
}

// The same outage with the key's traffic spread over the edges: each
// edge's last answer is behind the store's count by what the others
// counted after it, so no edge takes a share of it (shares of ⌊remaining/N⌋
// each could add up to more than the store had left); once the store
// answers, the clients get exactly the limit.
func TestExactFallbackSpreadOverEdges(t *testing.T) {
	const L, N = 1000, 3
	e := newExactEdges(t, N)
	k := Limit{Key: "spread", Algorithm: limit.SlidingLog, Limit: L, Window: time.Hour}
	c := Check{Limit: k, Cost: 1, Nodes: N}
	var total int64
	for i := range 900 {
		total += e.decide(t, i%N, c, 1, SourceStore)
	}
	e.fail(true)
	for i := range N {
		total += e.decide(t, i, c, L, SourceFallback)
	}
	t.Logf("after the outage: %d of %d", total, L)
	require.EqualValues(t, 900, total, "no edge's last answer is a share others cannot have spent")

	e.fail(false)
	for i := range N {
		total += e.decide(t, i, c, 1, SourceStore)
	}
	for i := range N {
		total += e.decide(t, i, c, L, SourceStore)
	}
	t.Logf("after the store returned: %d of %d", total, L)
	require.EqualValues(t, L, total, "exactly the limit: nothing was admitted that the store did not count")
	require.EqualValues(t, L, e.zcard(t, k), "Redis counted up to the limit, and no more")
}

// zcard is how many requests Redis holds for a sliding-log limit.
func (e *exactEdges) zcard(t *testing.T, k Limit) int64 {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: e.srv.Addr})
	defer func() { _ = rc.Close() }()
	keys := e.stores[0].Store.(*RedisStore).Keys(k)
	n, err := rc.ZCard(context.Background(), keys[0]).Result()
	require.NoError(t, err)
	return n
}

// A store restarted empty during the outage relearns, when it answers
// again, what it had counted (the restore of the edge's last answer) and
// what the fallback admitted (the replay): the window still holds exactly
// the limit.
func TestExactFallbackRestoreAfterEmptyRestart(t *testing.T) {
	const L, N = 1000, 3
	e := newExactEdges(t, N)
	k := Limit{Key: "restore", Algorithm: limit.SlidingLog, Limit: L, Window: time.Hour}
	c := Check{Limit: k, Cost: 1, Nodes: N}
	total := e.decide(t, 0, Check{Limit: k, Cost: 10, Nodes: N}, 90, SourceStore)
	require.EqualValues(t, 900, total)

	e.fail(true)
	total += e.decide(t, 0, c, L, SourceFallback)
	require.EqualValues(t, 900, total, "denied: the store answered within the window")

	require.NoError(t, e.srv.ComeBackEmpty(context.Background())) // a replica promoted with none of it
	e.fail(false)
	for i := range N {
		total += e.decide(t, i, c, L, SourceStore)
	}
	require.EqualValues(t, L, total, "the empty store relearned every admission: exactly the limit")
	require.EqualValues(t, L, e.zcard(t, k))
}

// The edge denies an exact check while the store answered it within the
// window, in this window and the next (the last answer says nothing of
// it); once the store has not answered for a whole window (down for
// everyone, it counted nothing), each edge decides floor(limit/N).
func TestExactFallbackAnswerEndsWithItsWindow(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{BreakerFailures: 1 << 20})
	k := lim("fw", limit.FixedWindow, 10, time.Minute) // the fake clock starts a window
	c := Check{Limit: k, Cost: 1, Nodes: 2}
	clock.add(30 * time.Second)
	for range 4 { // 6 left: 3 for this edge's fallback
		v, err := l.Decide(context.Background(), []Check{c})
		require.NoError(t, err)
		require.True(t, v.Allowed)
	}
	st.fail.Store(true)
	require.Zero(t, fallbackAdmitted(t, l, c, 10), "the store answered within the window: others may have spent the 6 it had left")
	clock.add(31 * time.Second) // the next window: the store's answer was for the last
	require.Zero(t, fallbackAdmitted(t, l, c, 10), "nothing known of this window, and the store answered 31 s ago")
	require.EqualValues(t, 20, testCounter(l.metrics.unknown), "each denial counted")
	clock.add(30 * time.Second) // a whole window since the store last answered
	require.Equal(t, 5, fallbackAdmitted(t, l, c, 10), "floor(10/2): nobody counted in the store in this window")
}

// The record of the store's last answers is bounded: a flood of random keys
// cannot grow it past its cap, and eviction spares a key that owes the
// store a replay of the fallback's admissions.
func TestExactFallbackRecordIsBounded(t *testing.T) {
	const size = 4 * 64 // four keys per shard
	l, st, _ := newTestLimiter(t, Config{BreakerFailures: 1 << 20, CacheSize: size})
	l.started = l.started.Add(-time.Hour) // an edge the store has not answered for a window
	owed := lim("owed", limit.SlidingLog, 100, time.Hour)
	st.fail.Store(true) // not answered for a window: the fallback decides floor(100/1)
	require.Equal(t, 5, fallbackAdmitted(t, l, Check{Limit: owed, Cost: 1}, 5))
	st.fail.Store(false)
	for i := range 20_000 {
		v, err := l.Decide(context.Background(), []Check{{Limit: lim("flood-"+strconv.Itoa(i), limit.SlidingLog, 100, time.Hour), Cost: 1}})
		require.NoError(t, err)
		require.True(t, v.Allowed)
		require.LessOrEqual(t, l.ledger.len(), size)
	}
	require.Equal(t, size, l.ledger.len(), "witness: the flood filled it")
	v, err := l.Decide(context.Background(), []Check{{Limit: owed, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v.Allowed)
	require.EqualValues(t, 5, testCounter(l.metrics.replayed), "the fallback's 5 were replayed after the flood")
}

// A share of floor(limit/N) needs the store to be failing this edge now,
// not only to have failed it a window ago: with the breaker open and its
// last failure older than a store deadline, the check is denied and the
// breaker probes at once rather than at the end of its cooldown. A probe
// that fails makes the share safe again; one that succeeds closes the
// breaker, and the store decides.
func TestExactFallbackShareNeedsRecentFailure(t *testing.T) {
	l, st, clock := newTestLimiter(t, Config{BreakerFailures: 1, BreakerCooldown: 10 * time.Minute})
	k := lim("fresh", limit.FixedWindow, 10, time.Minute)
	c := Check{Limit: k, Cost: 1, Nodes: 2}
	st.fail.Store(true)
	require.Zero(t, fallbackAdmitted(t, l, c, 1), "the first failure: not down for a window yet")
	clock.add(k.Window)
	require.Zero(t, fallbackAdmitted(t, l, c, 1), "failing since a window ago, but the last failure is that old: the store may be back for the other edge")
	l.bg.Wait()
	require.EqualValues(t, 1, st.probes.Load(), "probed at once, not at the end of the 10 min cooldown")
	require.Equal(t, 5, fallbackAdmitted(t, l, c, 10), "the probe failed just now: floor(10/2)")

	clock.add(2 * time.Second) // the last failure older than the deadline (1 s here) again
	st.fail.Store(false)
	require.Zero(t, fallbackAdmitted(t, l, c, 1), "no share on stale evidence")
	l.bg.Wait()
	require.EqualValues(t, 2, st.probes.Load())
	v, err := l.Decide(context.Background(), []Check{c})
	require.NoError(t, err)
	require.Equal(t, SourceStore, v.Checks[0].Source, "the probe closed the breaker: the store decides")
}
