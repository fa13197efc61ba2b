package limiter

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
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
		// The outages are the test's own (fail): a call to the live
		// Redis must not run past its deadline on a loaded host and
		// fall back where the test wants the store's decision.
		l, err := New(cs, Config{Timeout: 10 * time.Second, BreakerFailures: 1 << 20}, prometheus.NewRegistry(), nil)
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

// heldStore is a Redis store whose calls made while hold is set wait until
// release is closed (a call queued in a frozen Redis, or still in a lane
// when its caller gave up), while the calls made after hold is cleared
// run at once. Each held call says so on arrived.
type heldStore struct {
	*RedisStore
	hold    atomic.Bool
	held    atomic.Int32 // calls that waited
	arrived chan struct{}
	release chan struct{}
}

func (s *heldStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	if s.hold.Load() {
		s.held.Add(1)
		s.arrived <- struct{}{}
		<-s.release
	}
	return s.RedisStore.Take(ctx, reqs)
}

// aloneRig is one edge alone on a key (Nodes 1) of an exact fixed window
// of 5 an hour, on a real Redis behind a heldStore, whose store answer
// leaves out one of the edge's admissions (newAloneRig).
type aloneRig struct {
	t        *testing.T
	l        *Limiter
	st       *heldStore
	rc       *redis.Client
	check    Check
	admitted int64
	released bool
}

const aloneLimit = 5

// newAloneRig has the store answer 1 of 5, then two calls are held and
// their callers give up (both decided by the fallback: 3 admitted), and
// the next call is answered: it carries the second call's admission but
// not the first's, which rode on the second call, still held. The answer
// says 2 left where 1 is.
func newAloneRig(t *testing.T) *aloneRig {
	srv, rs := standaloneServer(t)
	r := &aloneRig{t: t, st: &heldStore{RedisStore: rs, arrived: make(chan struct{}, 16), release: make(chan struct{})}}
	// The calls Redis answers are not stalled out of it by a busy
	// machine: a held call's caller gives up when the test says
	// (decideHeld), not at the deadline.
	var err error
	r.l, err = New(r.st, Config{Timeout: rigDeadline, BreakerFailures: 1 << 20}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(t.Output(), nil)))
	require.NoError(t, err)
	t.Cleanup(r.l.Close)
	t.Cleanup(func() { // first: Close waits for the held calls
		if !r.released {
			close(r.st.release)
		}
	})
	r.rc = redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = r.rc.Close() })
	r.check = Check{Limit: Limit{Key: "alone", Algorithm: limit.FixedWindow, Limit: aloneLimit, Window: time.Hour}, Cost: 1, Nodes: 1}

	d := r.decide(SourceStore)
	require.True(t, d.Allowed)
	require.EqualValues(t, aloneLimit-1, d.Remaining)
	r.st.hold.Store(true)
	for range 2 {
		require.True(t, r.decideHeld().Allowed, "the fallback's share of 4 left")
	}
	require.EqualValues(t, 2, r.st.held.Load(), "both calls were sent, and held")
	r.st.hold.Store(false)
	d = r.decide(SourceStore)
	require.True(t, d.Allowed)
	require.EqualValues(t, 4, r.admitted)
	require.EqualValues(t, 3, r.counted(), "Redis lacks the admission the held call carries")
	require.EqualValues(t, 1, d.Remaining, "the answer leaves room for the held call's unit")
	return r
}

// decide has the edge decide one request, from want, and counts it.
func (r *aloneRig) decide(want ...Source) Decision {
	r.t.Helper()
	return r.decideIn(context.Background(), want...)
}

// decideHeld is decide while the store holds calls: its caller gives up
// once its call is held, and the fallback decides.
func (r *aloneRig) decideHeld() Decision {
	r.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.st.arrived:
			cancel()
		case <-ctx.Done():
		}
	}()
	return r.decideIn(ctx, SourceFallback)
}

func (r *aloneRig) decideIn(ctx context.Context, want ...Source) Decision {
	r.t.Helper()
	v, err := r.l.Decide(ctx, []Check{r.check})
	require.NoError(r.t, err)
	d := v.Checks[0]
	require.Contains(r.t, want, d.Source)
	if d.Allowed {
		r.admitted++
	}
	require.LessOrEqual(r.t, r.admitted, int64(aloneLimit), "admitted over the limit")
	return d
}

// counted is what Redis counts for the key (every window's field: one).
func (r *aloneRig) counted() (n int64) {
	for _, v := range r.rc.HGetAll(context.Background(), r.st.Keys(r.check.Limit)[0]).Val() {
		x, err := strconv.ParseInt(v, 10, 64)
		require.NoError(r.t, err)
		n += x
	}
	return n
}

// settle lets every held call run, and then the clients ask until denied:
// nothing more is admitted, and Redis counts each admission once. The held
// calls run in the order they were sent: a late take fills the window
// before a replay behind it, which counts only what fits; the take is
// given back (its caller gave up), and the replay's units that did not fit
// are owed again and counted with the next call.
func (r *aloneRig) settle() {
	r.st.hold.Store(false)
	close(r.st.release)
	r.released = true
	// Each held call is settled on the limiter's background work once it
	// answers: its take given back (which drops the cached denial), its
	// replay's units that did not fit owed again. The clients ask after
	// that: counted as the call answered, before its give-back landed, the
	// settle raced it, and a denial cached before the give-back kept the
	// owed unit off the next call (4 of 5 counted).
	r.l.bg.Wait()
	require.EqualValues(r.t, r.st.held.Load(), testCounter(r.l.metrics.lateCalls), "the held calls answered late")
	for range 2 {
		require.False(r.t, r.decide(SourceStore, SourcePrefilter).Allowed, "once the store answers, nothing more")
	}
	require.EqualValues(r.t, aloneLimit, r.admitted)
	require.EqualValues(r.t, aloneLimit, r.counted(), "Redis counted each admission once")
}

// An edge alone on a key takes, in an outage, what the store's last answer
// left less what it admitted that this answer does not count: the
// fallback's admissions still owed, or replayed on a call that had not run
// when the answer was given (a call its caller gave up on, held in a
// frozen Redis). The store holds calls again before the held one has run:
// the fallback admits 1, not the 2 the answer said.
func TestAloneShareLeavesOutWhatTheAnswerDidNotCount(t *testing.T) {
	r := newAloneRig(t)
	r.st.hold.Store(true)
	for range aloneLimit {
		r.decideHeld()
	}
	require.EqualValues(t, aloneLimit, r.admitted, "the second outage's share: what was left")
	r.settle()
}

// The same answer, and the store goes on answering while the held call
// has not run: Redis admits the request it has room for, and the next
// one, which Redis still has room for, is denied (its unit given back):
// the held call's unit takes it.
func TestAloneStoreAnswerLeavesRoomForWhatItDidNotCount(t *testing.T) {
	r := newAloneRig(t)
	d := r.decide(SourceStore)
	require.True(t, d.Allowed)
	require.Zero(t, d.Remaining)
	d = r.decide(SourceStore, SourcePrefilter)
	require.False(t, d.Allowed, "the held call's unit fills the window")
	require.Positive(t, d.RetryAfter)
	require.EqualValues(t, aloneLimit-1, r.counted(), "the denied request's unit was given back")
	r.settle()
}

// A coalesced batch's answer is held back the same way: of the 3 units the
// store admitted for a batch of three, with 1 of the edge's admissions not
// counted and none left after the batch, the first two requests get one
// each, the third is denied, and its unit goes back to the store.
func TestBatchHoldsBackWhatTheAnswerDidNotCount(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{})
	k := lim("batch", limit.FixedWindow, 5, time.Hour)
	ds, err := st.Take(context.Background(), []Request{{Limit: k, Cost: 3, Need: 1}})
	require.NoError(t, err)
	d := ds[0]
	require.EqualValues(t, 3, d.Admitted)
	require.EqualValues(t, 2, d.Remaining)
	d.unseen = 3 // the answer's 2 left are short of 3 of this edge's units: 1 over
	b := &batch{key: memKey(k), limit: k, cost: 1, done: make(chan struct{})}
	for range 3 {
		b.items = append(b.items, &item{check: Check{Limit: k, Cost: 1}})
	}
	l.split(b, d, 1, l.now(), l.cache.generation())
	var allowed []bool
	var remaining []int64
	for _, it := range b.items {
		allowed, remaining = append(allowed, it.out.Allowed), append(remaining, it.out.Remaining)
	}
	require.Equal(t, []bool{true, true, false}, allowed)
	require.Equal(t, []int64{1, 0, 0}, remaining, "as if decided one after another, short of the unit not counted")
	require.Positive(t, b.items[2].out.RetryAfter)
	require.EqualValues(t, 1, st.refunds.Load(), "the held-back unit given back")
	ds, err = st.Take(context.Background(), []Request{{Limit: k, Cost: 5, Need: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 3, ds[0].Admitted, "the store counts the two admitted")
}
