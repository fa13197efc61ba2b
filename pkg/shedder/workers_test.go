package shedder

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitQueued spins (yielding) until n requests are queued; queueing is the
// event under test, so polling it is deterministic, unlike sleeping.
func waitQueued(t *testing.T, w *Workers, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return w.queued() == n }, 5*time.Second, 100*time.Microsecond)
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

	got := make(chan error, 1)
	go func() {
		r, err := w.Acquire(context.Background(), TierRead)
		if err == nil {
			r()
		}
		got <- err
	}()
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
	got := make(chan error, 1)
	go func() {
		r, err := w.Acquire(context.Background(), TierRead)
		if err == nil {
			r()
		}
		got <- err
	}()
	waitQueued(t, w, 1)
	release()
	require.NoError(t, <-got)
}

func TestNewWorkersPanicsOnNonsense(t *testing.T) {
	require.Panics(t, func() { NewWorkers(0, 1, time.Second) })
	require.Panics(t, func() { NewWorkers(1, -1, time.Second) })
}

// A full queue is ordered by tier: a freed slot goes to the highest tier
// waiting, and a higher tier turns away the lowest-tier waiter.
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
		results <- result{tier, err}
		if err == nil {
			time.Sleep(10 * time.Millisecond)
			release()
		}
	}
	go wait(TierTest)
	require.Eventually(t, func() bool { return w.queued() == 1 }, time.Second, time.Millisecond)
	go wait(TierWrite)
	require.Eventually(t, func() bool { return w.queued() == 2 }, time.Second, time.Millisecond)

	// Queue full: a critical request turns the test waiter away.
	go wait(TierCritical)
	r := <-results
	require.Equal(t, TierTest, r.tier)
	require.ErrorIs(t, r.err, ErrQueueFull)
	require.Eventually(t, func() bool { return w.queued() == 2 }, time.Second, time.Millisecond)

	// A read cannot turn away anything of its tier or above.
	_, err = w.Acquire(context.Background(), TierRead)
	require.ErrorIs(t, err, ErrQueueFull)

	hold() // critical first, although write queued earlier
	r = <-results
	require.Equal(t, TierCritical, r.tier)
	require.NoError(t, r.err)
	r = <-results
	require.Equal(t, TierWrite, r.tier)
	require.NoError(t, r.err)
}
