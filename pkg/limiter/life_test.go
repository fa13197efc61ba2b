package limiter

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
	gate   chan struct{}
	opened sync.Once
}

// open lets the calls at the gate through.
func (s *gatedStore) open() { s.opened.Do(func() { close(s.gate) }) }

func (s *gatedStore) Remote() bool { return true }

func (s *gatedStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	for _, r := range reqs {
		if strings.HasPrefix(r.Limit.Key, "slow") {
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
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &gatedStore{MemoryStore: NewMemoryStore(WithClock(clock.now)), gate: make(chan struct{})}
	l, err := New(st, Config{Timeout: 20 * time.Millisecond, BreakerFailures: 100}, prometheus.NewRegistry(), nil)
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
