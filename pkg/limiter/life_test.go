package limiter

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// TestWaitsOnLife walks keepWaiting's rule on values: a call past its
// deadline waits on while every shard it went to answered within the last
// half deadline, for at most maxLifeWait deadlines.
func TestWaitsOnLife(t *testing.T) {
	const timeout = 250 * time.Millisecond
	sent := time.UnixMilli(1_800_000_000_000)
	at := func(d time.Duration) int64 { return sent.Add(d).UnixNano() }
	for _, tc := range []struct {
		name    string
		waited  time.Duration
		answers []int64
		want    bool
	}{
		{"answered just now", timeout, []int64{at(timeout)}, true},
		{"answered half a deadline ago", timeout, []int64{at(timeout / 2)}, true},
		{"answered just over half a deadline ago", timeout, []int64{at(timeout/2 - time.Millisecond)}, false},
		{"answered before the call was sent", timeout, []int64{at(-time.Second)}, false},
		{"never answered", timeout, []int64{0}, false},
		{"no shard (replays only)", timeout, nil, false},
		{"every shard alive", 2 * timeout, []int64{at(2 * timeout), at(2*timeout - 10*time.Millisecond)}, true},
		{"one shard of two silent", 2 * timeout, []int64{at(2 * timeout), at(0)}, false},
		{"alive, just under the cap", maxLifeWait*timeout - time.Millisecond, []int64{at(maxLifeWait*timeout - time.Millisecond)}, true},
		{"alive, at the cap", maxLifeWait * timeout, []int64{at(maxLifeWait * timeout)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := waitsOnLife(sent.Add(tc.waited), sent, timeout, func(yield func(int64) bool) {
				for _, a := range tc.answers {
					if !yield(a) {
						return
					}
				}
			})
			require.Equal(t, tc.want, got)
		})
	}
	// A deadline under 2 ms still takes evidence up to a millisecond old.
	require.True(t, waitsOnLife(sent.Add(time.Millisecond), sent, time.Millisecond, func(yield func(int64) bool) { yield(at(0)) }))
	require.False(t, waitsOnLife(sent.Add(time.Millisecond), sent, time.Millisecond, func(yield func(int64) bool) { yield(at(-time.Millisecond - 1)) }))
}

// gatedStore is a remote memory store whose calls for keys starting with
// "slow" wait for the gate: a store busy with one call (a slow script, a
// queue behind it) while it answers the others.
type gatedStore struct {
	*MemoryStore
	gate    chan struct{}
	opened  sync.Once
	waiting atomic.Int32 // calls that reached the gate
}

// open lets the calls at the gate through.
func (s *gatedStore) open() { s.opened.Do(func() { close(s.gate) }) }

func (s *gatedStore) Remote() bool { return true }

func (s *gatedStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	for _, r := range reqs {
		if strings.HasPrefix(r.Limit.Key, "slow") {
			s.waiting.Add(1)
			<-s.gate
			break
		}
	}
	return s.MemoryStore.Take(ctx, reqs)
}

// newLifeLimiter is a limiter over a gatedStore with a short deadline, on a
// clock the test moves: evidence of life is judged on that clock, while the
// deadline and the looks again are real timers.
func newLifeLimiter(t *testing.T) (*Limiter, *gatedStore, *fakeClock) {
	return newLifeLimiterWith(t, Config{Timeout: 20 * time.Millisecond, BreakerFailures: 100})
}

// newLifeLimiterWith is newLifeLimiter with cfg.
func newLifeLimiterWith(t *testing.T, cfg Config) (*Limiter, *gatedStore, *fakeClock) {
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &gatedStore{MemoryStore: NewMemoryStore(WithClock(clock.now)), gate: make(chan struct{})}
	l, err := New(st, cfg, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	l.now = clock.now
	l.fallback = NewMemoryStore(WithClock(clock.now))
	t.Cleanup(l.Close)
	t.Cleanup(st.open) // before Close, which waits for the calls at the gate
	return l, st, clock
}

// decideAsync decides one check of key on l in the background.
func decideAsync(l *Limiter, key string) <-chan Decision {
	out := make(chan Decision, 1)
	go func() {
		v, _ := l.Decide(context.Background(), []Check{{Limit: lim(key, limit.SlidingLog, 10, time.Minute), Cost: 1, Nodes: 2}})
		out <- v.Checks[0]
	}()
	return out
}

// recv is the decision on got, failing the test if none comes in 10 s.
func recv(t *testing.T, got <-chan Decision) Decision {
	select {
	case d := <-got:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no decision in 10 s")
		return Decision{}
	}
}

// pulse has the store answer one call of another key: the evidence of life.
func pulse(t *testing.T, l *Limiter, i int) {
	v, err := l.Decide(context.Background(), []Check{{Limit: lim("pulse-"+strings.Repeat("x", i%7), limit.FixedWindow, 1_000_000, time.Minute), Cost: 1}})
	require.NoError(t, err)
	require.Equal(t, SourceStore, v.Checks[0].Source)
}

// waitLifeWaits returns once the limiter has waited on life n times in all:
// a call passed its deadline and its caller chose to wait.
func waitLifeWaits(t *testing.T, l *Limiter, n float64) {
	require.Eventually(t, func() bool { return testutil.ToFloat64(l.metrics.lifeWaits) >= n }, 10*time.Second, time.Millisecond)
}

// Goal: slow is not dead. A call the store is slow to answer while it keeps
// answering this edge's other calls is waited for past the deadline and
// decided by the store, not the fallback; a store that answers nothing (a
// frozen one) is given up at the deadline; and the wait on life ends at
// maxLifeWait deadlines, however alive the store looks. The clock life is
// judged on is the test's: no outcome depends on this machine's speed.
func TestSlowButAliveStoreIsWaitedFor(t *testing.T) {
	t.Run("alive: decided by the store past the deadline", func(t *testing.T) {
		l, st, _ := newLifeLimiter(t)
		pulse(t, l, 0)
		got := decideAsync(l, "slow-a")
		waitLifeWaits(t, l, 1) // past the deadline, and waiting on
		pulse(t, l, 1)         // the store still answers others meanwhile
		st.open()
		d := recv(t, got)
		require.Equal(t, SourceStore, d.Source, "a store that answers is waited for")
		require.True(t, d.Allowed)
		require.Zero(t, testutil.ToFloat64(l.metrics.fallbacks.WithLabelValues("error")))
		require.Zero(t, testutil.ToFloat64(l.metrics.lateCalls))
	})
	t.Run("frozen: given up at the deadline", func(t *testing.T) {
		l, st, clock := newLifeLimiter(t)
		pulse(t, l, 0)
		clock.add(l.lifeTick() + time.Millisecond) // the last answer is stale
		d := recv(t, decideAsync(l, "slow-b"))
		require.Equal(t, SourceFallback, d.Source, "a store that answers nothing is not waited for")
		require.Zero(t, testutil.ToFloat64(l.metrics.lifeWaits))
		st.open()
	})
	t.Run("never answered: given up at the deadline", func(t *testing.T) {
		l, st, _ := newLifeLimiter(t)
		d := recv(t, decideAsync(l, "slow-c"))
		require.Equal(t, SourceFallback, d.Source)
		require.Zero(t, testutil.ToFloat64(l.metrics.lifeWaits))
		st.open()
	})
	t.Run("alive, but no longer than the cap", func(t *testing.T) {
		l, st, clock := newLifeLimiter(t)
		pulse(t, l, 0)
		got := decideAsync(l, "slow-d")
		waitLifeWaits(t, l, 1)
		clock.add(maxLifeWait * l.cfg.Timeout) // the call has waited the cap
		pulse(t, l, 1)                         // and the store is as alive as ever
		d := recv(t, got)
		require.Equal(t, SourceFallback, d.Source, "past maxLifeWait deadlines the call is given up")
		st.open()
		require.Eventually(t, func() bool { return testutil.ToFloat64(l.metrics.lateCalls) == 1 }, 10*time.Second, time.Millisecond,
			"the call given up is settled when it answers")
	})
}

// Goal: a check that joined behind another request's call in flight waits
// one call's time from when it joined (the deadline, on while the store
// shows life, up to maxLifeWait deadlines; and no longer than its caller),
// not the rest of that call's and then its batch's whole call. The fallback
// then decides it, and its batch neither counts nor admits it: the store
// ends up holding only what clients were admitted by it.
func TestJoinedCheckWaitsOneCall(t *testing.T) {
	k := lim("slow-j", limit.SlidingLog, 10, time.Minute)
	held := func(t *testing.T, st *gatedStore) int64 { // units the store holds for k
		ds, err := st.MemoryStore.Take(context.Background(), []Request{{Limit: k, Cost: 1}})
		require.NoError(t, err)
		return k.Limit - 1 - ds[0].Remaining
	}
	t.Run("alive: up to the cap from its join, not its batch's", func(t *testing.T) {
		l, st, clock := newLifeLimiter(t)
		timeout := l.cfg.Timeout
		pulse(t, l, 0)
		// aliveFor moves the clock on by d with the store alive throughout:
		// its last answer is stamped with the time the clock moves to first.
		shard := l.breakers.get(l.store.Shard(k))
		aliveFor := func(d time.Duration) {
			shard.answered.Store(clock.now().Add(d).UnixNano())
			clock.add(d)
		}
		lead := decideAsync(l, "slow-j") // sent at t0, held at the gate
		waitLifeWaits(t, l, 1)           // past its deadline, waiting on life
		aliveFor(3 * timeout)
		joined := decideAsync(l, "slow-j") // joins at t0+3T, behind the lead's call
		require.Eventually(t, func() bool { return testCounter(l.metrics.coalesced) == 1 }, 10*time.Second, time.Millisecond)
		aliveFor(timeout + time.Millisecond) // the lead's call reaches its cap
		require.Equal(t, SourceFallback, recv(t, lead).Source, "the lead gives up at its cap")
		// Its batch is sent now: it and the joined check wait on life.
		waitLifeWaits(t, l, 3)
		select {
		case d := <-joined:
			t.Fatalf("the joined check gave up on a store that shows life, %v after it joined: %+v", timeout+time.Millisecond, d)
		default:
		}
		// The joined check has waited its cap since it joined; its
		// batch's call 3 deadlines of its 4, and waits on.
		aliveFor(3 * timeout)
		require.Equal(t, SourceFallback, recv(t, joined).Source, "past maxLifeWait deadlines from its join, the joined check is given up")
		st.open()
		l.bg.Wait() // the calls answered and settled
		require.EqualValues(t, 1, testutil.ToFloat64(l.metrics.lateCalls), "the lead's call, given up, is settled when it answers")
		require.Zero(t, held(t, st), "the store holds nothing: the lead's unit was given back late, and the batch gave back the one it took for the check that left")
	})
	t.Run("its caller's end", func(t *testing.T) {
		l, st, _ := newLifeLimiter(t)
		pulse(t, l, 0)
		lead := decideAsync(l, "slow-j")
		waitLifeWaits(t, l, 1)
		ctx, cancel := context.WithCancel(context.Background())
		joined := make(chan Decision, 1)
		go func() {
			v, err := l.Decide(ctx, []Check{{Limit: k, Cost: 1, Nodes: 2}})
			assert.NoError(t, err)
			joined <- v.Checks[0]
		}()
		require.Eventually(t, func() bool { return testCounter(l.metrics.coalesced) == 1 }, 10*time.Second, time.Millisecond)
		cancel()
		require.Equal(t, SourceFallback, recv(t, joined).Source, "a caller that ends stops waiting: the fallback decides, as for a lead")
		st.open()
		require.Equal(t, SourceStore, recv(t, lead).Source)
		l.bg.Wait() // the batch, had it been sent
		require.EqualValues(t, 2, testCounter(l.metrics.storeDecided), "the pulse and the lead: a batch every owner left is not sent")
		require.EqualValues(t, 1, held(t, st), "the store holds the lead's unit only")
	})
}

// A joined check given up at its deadline with no sign of life counts as a
// failure for its shard's breaker, as its lead's call does: a frozen store
// stops making clients wait after BreakerFailures requests waited it out,
// not after that many calls (a hot key's requests travel few calls).
func TestJoinedGiveUpTripsBreaker(t *testing.T) {
	// A deadline long enough that the batch's own call, sent when the
	// lead gives up, fails a whole deadline after the joined check does.
	l, st, _ := newLifeLimiterWith(t, Config{Timeout: 500 * time.Millisecond, BreakerFailures: 2})
	lead := decideAsync(l, "slow-t") // never answered: no life
	require.Eventually(t, func() bool { return st.waiting.Load() == 1 }, 10*time.Second, time.Millisecond)
	joined := decideAsync(l, "slow-t")
	require.Eventually(t, func() bool { return testCounter(l.metrics.coalesced) == 1 }, 10*time.Second, time.Millisecond)
	require.Equal(t, SourceFallback, recv(t, lead).Source)
	require.Equal(t, SourceFallback, recv(t, joined).Source)
	// The lead's call is one failure; its batch's call, sent when the
	// lead gave up, fails a deadline (500 ms) later.
	shard := l.breakers.get(l.store.Shard(lim("slow-t", limit.SlidingLog, 10, time.Minute)))
	require.Equal(t, breakerOpen, breakerState(shard.state.Load()), "the joined check's give-up is the second failure")
}
