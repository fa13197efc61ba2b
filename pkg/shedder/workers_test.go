package shedder

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// waitQueued polls until n requests are queued; queueing is the event
// under test, so polling it is deterministic, unlike sleeping.
func waitQueued(t *testing.T, w *Workers, n int) {
	t.Helper()
	err := proc.PollEvery(testenv.Within(t, 5*time.Second), 100*time.Microsecond, fmt.Sprintf("%d requests queued", n), func(context.Context) error {
		if q := w.queued(); q != n {
			return fmt.Errorf("%d queued", q)
		}
		return nil
	})
	require.NoError(t, err)
}

func TestWorkersCapUnderConcurrency(t *testing.T) {
	const capacity, goroutines, rounds = 4, 50, 20
	w := NewWorkers(capacity, goroutines, 10*time.Second)
	var running, peak atomic.Int64
	var wg sync.WaitGroup
	var failures atomic.Int64
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				release, err := w.Acquire(context.Background(), TierRead)
				if err != nil {
					failures.Add(1)
					continue
				}
				n := running.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				if w.Busy() > capacity {
					failures.Add(1)
				}
				for range 10 {
					runtime.Gosched()
				}
				running.Add(-1)
				release()
			}
		}()
	}
	wg.Wait()
	require.Zero(t, failures.Load())
	require.LessOrEqual(t, peak.Load(), int64(capacity))
	require.Equal(t, 0, w.Busy())
	require.Equal(t, 0, w.queued())
}

func TestWorkersQueueFull(t *testing.T) {
	w := NewWorkers(1, 1, 10*time.Second)
	release, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)

	got := acquireLater(w, TierRead)
	waitQueued(t, w, 1)

	_, err = w.Acquire(context.Background(), TierRead)
	require.ErrorIs(t, err, ErrQueueFull)

	release()
	require.NoError(t, <-got, "the queued request gets the released slot")
	require.Equal(t, 0, w.Busy())
}

func TestWorkersNoQueue(t *testing.T) {
	w := NewWorkers(1, 0, 0)
	release, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	_, err = w.Acquire(context.Background(), TierRead)
	require.ErrorIs(t, err, ErrQueueFull)
	release()
	release() // idempotent
	require.Equal(t, 0, w.Busy())
	release, err = w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	release()
}

func TestWorkersQueueTimeout(t *testing.T) {
	w := NewWorkers(1, 4, 5*time.Millisecond)
	release, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	defer release()
	_, err = w.Acquire(context.Background(), TierRead)
	require.ErrorIs(t, err, ErrQueueTimeout)
	require.Equal(t, 0, w.queued())
	require.Equal(t, 1, w.Busy())
}

func TestWorkersContextCancel(t *testing.T) {
	w := NewWorkers(1, 4, time.Minute)
	release, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	defer release()

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := w.Acquire(ctx, TierRead)
		got <- err
	}()
	waitQueued(t, w, 1)
	cancel()
	require.ErrorIs(t, <-got, context.Canceled)
	require.Equal(t, 0, w.queued())

	_, err = w.Acquire(ctx, TierRead)
	require.ErrorIs(t, err, context.Canceled)
}

func TestWorkersReleaseFreesSlot(t *testing.T) {
	w := NewWorkers(2, 0, 0)
	r1, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	r2, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	require.Equal(t, 2, w.Busy())
	require.Equal(t, 1.0, w.Utilization())
	_, err = w.Acquire(context.Background(), TierRead)
	require.ErrorIs(t, err, ErrQueueFull)
	r1()
	r1()
	require.Equal(t, 1, w.Busy())
	require.Equal(t, 0.5, w.Utilization())
	r3, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	r2()
	r3()
	require.Equal(t, 0, w.Busy())
}

func TestWorkersSetQueue(t *testing.T) {
	w := NewWorkers(1, 0, 0)
	require.ErrorIs(t, w.SetQueue(-1, -1), ErrInvalidConfig)
	require.NoError(t, w.SetQueue(1, time.Minute))
	release, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	got := acquireLater(w, TierRead)
	waitQueued(t, w, 1)
	release()
	require.NoError(t, <-got)
}

func TestNewWorkersPanicsOnNonsense(t *testing.T) {
	require.Panics(t, func() { NewWorkers(0, 1, time.Second) })
	require.Panics(t, func() { NewWorkers(1, -1, time.Second) })
}

// The queue is ordered by tier: a freed slot goes to the highest tier
// waiting; a full queue turns away its lowest-tier waiter for a higher
// sheddable tier; critical requests wait in places of their own.
func TestWorkersPriorityQueue(t *testing.T) {
	w := NewWorkers(1, 2, 5*time.Second)
	hold, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)

	type result struct {
		tier Tier
		err  error
	}
	results := make(chan result, 4)
	wait := func(tier Tier) {
		release, err := w.Acquire(context.Background(), tier)
		results <- result{tier, err} // sent before the release: results come in the order of admission
		if err == nil {
			release()
		}
	}
	go wait(TierTest)
	waitQueued(t, w, 1)
	go wait(TierWrite)
	waitQueued(t, w, 2)

	// The sheddable places are full; a critical request takes its own and
	// turns nobody away.
	go wait(TierCritical)
	waitQueued(t, w, 3)
	select {
	case r := <-results:
		t.Fatalf("a waiter answered when critical joined the queue: %v %v", r.tier, r.err)
	default:
	}

	// A read turns the test waiter away.
	go wait(TierRead)
	r := <-results
	require.Equal(t, TierTest, r.tier)
	require.ErrorIs(t, r.err, ErrQueueFull)
	waitQueued(t, w, 3)

	// A test request cannot turn away anything of its tier or above.
	_, err = w.Acquire(context.Background(), TierTest)
	require.ErrorIs(t, err, ErrQueueFull)

	hold() // critical first, although write and read queued earlier
	for _, want := range []Tier{TierCritical, TierWrite, TierRead} {
		r = <-results
		require.Equal(t, want, r.tier)
		require.NoError(t, r.err)
	}
}

// Critical places are as many as the workers, apart from queue_size.
func TestWorkersCriticalPlaces(t *testing.T) {
	w := NewWorkers(2, 1, time.Minute)
	var holds []func()
	for range 2 {
		release, err := w.Acquire(context.Background(), TierRead)
		require.NoError(t, err)
		holds = append(holds, release)
	}
	// Two critical waiters fill their places; the read still finds the
	// sheddable one.
	errs := make(chan error, 3)
	for i, tier := range []Tier{TierCritical, TierCritical, TierRead} {
		go func() {
			release, err := w.Acquire(context.Background(), tier)
			if err == nil {
				release()
			}
			errs <- err
		}()
		waitQueued(t, w, i+1)
	}
	_, err := w.Acquire(context.Background(), TierCritical)
	require.ErrorIs(t, err, ErrQueueFull, "a third critical waiter finds its places (2 workers) taken")
	for _, release := range holds {
		release()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	require.Equal(t, 0, w.Busy())
}

// Critical requests wait their own, longer bound: a read queued beside a
// critical request times out at the queue timeout while the critical one
// keeps waiting and gets the next slot.
func TestWorkersCriticalWaitsLonger(t *testing.T) {
	w := NewWorkers(1, 4, 5*time.Millisecond)
	require.NoError(t, w.SetCriticalTimeout(time.Minute))
	require.ErrorIs(t, w.SetCriticalTimeout(-1), ErrInvalidConfig)
	hold, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)

	critical := acquireLater(w, TierCritical)
	waitQueued(t, w, 1)
	for _, tier := range []Tier{TierTest, TierRead, TierWrite} {
		_, err = w.Acquire(context.Background(), tier)
		require.ErrorIs(t, err, ErrQueueTimeout, "%s waits queue_timeout", tier)
	}
	require.Equal(t, 1, w.queued(), "the critical request outwaited them")
	select {
	case err := <-critical:
		t.Fatalf("critical request answered before a slot freed: %v", err)
	default:
	}
	hold()
	require.NoError(t, <-critical)
	require.Equal(t, 0, w.Busy())
}

// Without a critical bound (or a shorter one) critical requests wait the
// queue timeout like every tier.
func TestWorkersCriticalWaitsAtLeastQueueTimeout(t *testing.T) {
	for _, critical := range []time.Duration{0, time.Millisecond} {
		t.Run(critical.String(), func(t *testing.T) {
			w := NewWorkers(1, 4, 20*time.Millisecond)
			require.NoError(t, w.SetCriticalTimeout(critical))
			hold, err := w.Acquire(context.Background(), TierRead)
			require.NoError(t, err)
			defer hold()
			start := time.Now()
			_, err = w.Acquire(context.Background(), TierCritical)
			require.ErrorIs(t, err, ErrQueueTimeout)
			require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
		})
	}
}

// A Shedder's settings drive the attached workers' critical bound, live.
func TestShedderSetsCriticalTimeout(t *testing.T) {
	cfg := DefaultConfig()
	cfg.QueueSize, cfg.QueueTimeout, cfg.CriticalQueueTimeout = 4, time.Millisecond, MaxCriticalQueueTimeout
	s, err := New(cfg, nil)
	require.NoError(t, err)
	w := NewWorkers(1, 0, 0)
	s.AttachWorkers(w)
	hold, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)

	critical := acquireLater(w, TierCritical)
	waitQueued(t, w, 1)
	_, err = w.Acquire(context.Background(), TierWrite)
	require.ErrorIs(t, err, ErrQueueTimeout)
	require.Equal(t, 1, w.queued(), "critical waits critical_queue_timeout from AttachWorkers")
	hold()
	require.NoError(t, <-critical)

	cfg.CriticalQueueTimeout = 0
	require.NoError(t, s.Update(cfg))
	hold, err = w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	defer hold()
	_, err = w.Acquire(context.Background(), TierCritical)
	require.ErrorIs(t, err, ErrQueueTimeout, "Update set it back to queue_timeout")
}

// acquireLater takes a slot of tier on a goroutine (it queues while the
// workers are busy), gives it back at once, and reports Acquire's error.
func acquireLater(w *Workers, tier Tier) <-chan error {
	got := make(chan error, 1)
	go func() {
		release, err := w.Acquire(context.Background(), tier)
		if err == nil {
			release()
		}
		got <- err
	}()
	return got
}

// A waiter whose client has gone leaves the queue and never gets a slot;
// one granted a slot just as its client left gives the slot back.
func TestAcquireUnlessClientGone(t *testing.T) {
	t.Run("leaves the queue", func(t *testing.T) {
		w := NewWorkers(1, 4, MaxCriticalQueueTimeout)
		hold, err := w.Acquire(context.Background(), TierRead)
		require.NoError(t, err)
		defer hold()
		var left atomic.Bool
		got := make(chan error, 1)
		go func() {
			release, err := w.AcquireUnless(context.Background(), TierCritical, left.Load)
			if err == nil {
				release()
			}
			got <- err
		}()
		waitQueued(t, w, 1)
		left.Store(true)
		require.ErrorIs(t, <-got, ErrGone)
		require.Equal(t, 0, w.queued())
	})
	t.Run("no slot is lost to a gone waiter", func(t *testing.T) {
		w := NewWorkers(1, 4, MaxCriticalQueueTimeout)
		hold, err := w.Acquire(context.Background(), TierRead)
		require.NoError(t, err)
		var left atomic.Bool
		left.Store(true) // seen at a poll or at the grant, whichever comes first: either way no slot is lost
		gone := func() bool { return left.Load() }
		got := make(chan error, 1)
		go func() {
			_, err := w.AcquireUnless(context.Background(), TierCritical, gone)
			got <- err
		}()
		waitQueued(t, w, 1)
		next := acquireLater(w, TierRead)
		waitQueued(t, w, 2)
		hold()
		require.ErrorIs(t, <-got, ErrGone)
		require.NoError(t, <-next, "the slot the gone waiter gave back")
		// Every slot is free again.
		r, err := w.Acquire(context.Background(), TierRead)
		require.NoError(t, err)
		r()
	})
}
