package shedder

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// watchedClient is a waiter's client for the tests: it leaves when told,
// counts the times it was asked, and notes being asked after its wait
// ended (the request has moved on: its connection may be another's).
type watchedClient struct {
	left, ended atomic.Bool
	asked       atomic.Int64
	late        atomic.Int64
}

func (c *watchedClient) gone() bool {
	c.asked.Add(1)
	if c.ended.Load() {
		c.late.Add(1)
	}
	return c.left.Load()
}

// TestHostQueueLeaversGiveTheirPlaces: of 20 requests waiting in one
// host's queue, the 10 whose clients leave are out of it within a few
// checks (the queue, its metric and max_queued count them no more), the
// 10 that stay keep their places and are admitted first come first served
// as places free, no client is asked after its wait ended, and nothing is
// left watching once nobody waits.
func TestHostQueueLeaversGiveTheirPlaces(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 100), now)
	const n = 20
	clients := make([]*watchedClient, n)
	results := make([]<-chan waitResult, n)
	for i := range n {
		clients[i] = &watchedClient{}
		results[i] = wait(context.Background(), h, now, "a", clients[i].gone)
		queuedReaches(t, h, i+1)
	}
	// A sentinel waiting in b's queue shows the checks going on.
	bl := take(h, now, "b", TierRead, 1)
	require.Len(t, bl, 1, "b at its share")
	sentinel := &watchedClient{}
	sentinelDone := wait(context.Background(), h, now, "b", sentinel.gone)
	queuedReaches(t, h, n+1)

	for i := 0; i < n; i += 2 {
		clients[i].left.Store(true)
	}
	for i := 0; i < n; i += 2 {
		r := <-results[i]
		clients[i].ended.Store(true)
		require.ErrorIs(t, r.err, ErrGone, "waiter %d", i)
		require.Less(t, r.took, 10*time.Second, "gone before its timeout")
	}
	require.Equal(t, n/2+1, h.Queued(), "the leavers' places are given up")
	require.EqualValues(t, n/2, h.waits[waitGone].Load())

	// The stayers are admitted in their order, one place at a time.
	lease := a[0]
	for i := 1; i < n; i += 2 {
		lease.Release()
		r := <-results[i]
		clients[i].ended.Store(true)
		require.NoError(t, r.err, "waiter %d", i)
		lease = r.lease
		for j := i + 2; j < n; j += 2 {
			select {
			case r := <-results[j]:
				t.Fatalf("waiter %d ended (%v) before waiter %d's place", j, r.err, i)
			default:
			}
		}
	}
	lease.Release()

	// Two more passes over the waiters: none asks a client whose wait ended.
	passes := sentinel.asked.Load() + 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, proc.PollEvery(ctx, time.Millisecond, "two more passes", func(context.Context) error {
		if got := sentinel.asked.Load(); got < passes {
			return fmt.Errorf("the sentinel asked %d times", got)
		}
		return nil
	}))
	for i, c := range clients {
		require.Zero(t, c.late.Load(), "client %d asked after its wait", i)
	}
	sentinel.left.Store(true)
	require.ErrorIs(t, (<-sentinelDone).err, ErrGone)
	bl[0].Release()
	a[1].Release()
	require.Zero(t, h.Queued())
	h.watch.mu.Lock()
	defer h.watch.mu.Unlock()
	require.Empty(t, h.watch.waiters, "nobody waits: nothing watched")
	require.Nil(t, h.watch.stop, "nobody waits: the watch's goroutine stops")
}

// TestGoneWatchNeverAsksAfterRemove: a waiter that stops waiting while a
// pass is under way (taken into the pass, not yet asked) is not asked:
// its request has moved on, and its connection may be another request's.
func TestGoneWatchNeverAsksAfterRemove(t *testing.T) {
	var g goneWatch
	asking, resume := make(chan struct{}), make(chan struct{})
	passed := make(chan struct{}, 1)
	var calls atomic.Int32
	first := g.add(func() bool {
		if calls.Add(1) == 1 {
			asking <- struct{}{} // the first pass is on the first waiter
			<-resume
		} else {
			select {
			case passed <- struct{}{}: // a later pass: the first one is over
			default:
			}
		}
		return false
	}, time.Time{}, time.Now())
	var second watchedClient
	w2 := g.add(second.gone, time.Time{}, time.Now())
	<-asking
	g.remove(w2) // ends while the pass holds it
	second.ended.Store(true)
	close(resume)
	<-passed
	g.remove(first)
	require.Zero(t, second.late.Load(), "asked after it stopped waiting")
}

// TestGoneWatchRemoveWaitsForTheAsk: a waiter that stops waiting while its
// client is being asked returns only once the ask is over, so gone never
// runs past the wait.
func TestGoneWatchRemoveWaitsForTheAsk(t *testing.T) {
	var g goneWatch
	asking, resume := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	var asked atomic.Bool
	w := g.add(func() bool {
		if once.CompareAndSwap(false, true) {
			asking <- struct{}{}
			<-resume
			asked.Store(true)
		}
		return false
	}, time.Time{}, time.Now())
	<-asking
	removed := make(chan bool, 1)
	go func() {
		g.remove(w)
		removed <- asked.Load()
	}()
	select {
	case <-removed:
		t.Fatal("remove returned while the client was being asked")
	case <-time.After(100 * time.Millisecond): // a remove that does not wait returns long before
	}
	close(resume)
	require.True(t, <-removed, "remove returned before the ask was over")
}

// TestGoneWatchAsksInTurn: with more waiters than goneAskPerPass, a pass
// asks goneAskPerPass of them, taking up where the last one stopped, so
// that every waiter is asked in each turn of ceil(waiters /
// goneAskPerPass) passes and none twice before all have been asked once.
func TestGoneWatchAsksInTurn(t *testing.T) {
	const waiters = 2*goneAskPerPass + goneAskPerPass/3
	turn := (waiters + goneAskPerPass - 1) / goneAskPerPass
	var g goneWatch
	clients := make([]watchedClient, waiters)
	// After each pass, how often each client was asked: every pass is
	// reported (the watch waits for the test to take it), however late a
	// busy machine runs the test, until done.
	passes, done := make(chan []int64), make(chan struct{})
	g.tick = func(time.Time) {
		asked := make([]int64, waiters)
		for i := range clients {
			asked[i] = clients[i].asked.Load()
		}
		select {
		case passes <- asked:
		case <-done:
		}
	}
	ws := make([]*goneWaiter, waiters)
	for i := range clients {
		ws[i] = g.add(clients[i].gone, time.Time{}, time.Now())
	}
	// A pass under way while the waiters came in saw only some of them:
	// the passes counted start after the next one ends.
	<-passes
	base := <-passes
	for k := 1; k <= 2*turn; k++ {
		asked := <-passes
		var total, least, most int64 = 0, 1 << 62, 0
		for i, n := range asked {
			n -= base[i]
			total += n
			least, most = min(least, n), max(most, n)
		}
		require.EqualValues(t, k*goneAskPerPass, total, "pass %d: goneAskPerPass clients asked a pass", k)
		require.LessOrEqual(t, most-least, int64(1), "pass %d: a client asked twice before another once", k)
		require.GreaterOrEqual(t, least, int64(k/turn), "pass %d: every client asked in each turn of %d passes", k, turn)
	}
	close(done)
	for _, w := range ws {
		g.remove(w)
	}
}
