package shedder

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPoolLimitFixed(t *testing.T) {
	require.Nil(t, NewPoolLimit(PoolLimitConfig{}), "no limit set: none")
	p := NewPoolLimit(PoolLimitConfig{Limit: 2})
	now := time.Unix(1000, 0)
	ctx := context.Background()
	r1, err := p.Acquire(ctx, now, TierRead, nil)
	require.NoError(t, err)
	r2, err := p.Acquire(ctx, now, TierWrite, nil)
	require.NoError(t, err)
	_, err = p.Acquire(ctx, now, TierWrite, nil)
	require.ErrorIs(t, err, ErrQueueFull, "past the limit with no queue: refused at once")
	// Critical is never refused by a pool's limit and takes no slot.
	rc, err := p.Acquire(ctx, now, TierCritical, nil)
	require.NoError(t, err)
	require.Equal(t, 3, p.InFlight())
	rc(now, time.Millisecond, true)
	_, err = p.Acquire(ctx, now, TierRead, nil)
	require.ErrorIs(t, err, ErrQueueFull, "the critical request's end frees no slot it did not take")
	r1(now, time.Millisecond, true)
	r3, err := p.Acquire(ctx, now, TierRead, nil)
	require.NoError(t, err)
	r2(now, time.Millisecond, true)
	r3(now, time.Millisecond, true)
	require.Zero(t, p.InFlight())
}

func TestPoolLimitQueue(t *testing.T) {
	p := NewPoolLimit(PoolLimitConfig{Limit: 1, Queue: 1, QueueTimeout: time.Minute})
	now := time.Unix(1000, 0)
	ctx := context.Background()
	r1, err := p.Acquire(ctx, now, TierRead, nil)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		r, err := p.Acquire(ctx, now, TierRead, nil)
		if err == nil {
			r(now, time.Millisecond, true)
		}
		got <- err
	}()
	require.Eventually(t, func() bool { return p.Queued() == 1 }, 10*time.Second, time.Millisecond)
	_, err = p.Acquire(ctx, now, TierRead, nil)
	require.ErrorIs(t, err, ErrQueueFull, "one place in the queue, taken")
	r1(now, time.Millisecond, true)
	require.NoError(t, <-got, "the waiter got the slot its predecessor gave back")
	require.Zero(t, p.InFlight())

	// A waiter whose client left gives up its place.
	r1, err = p.Acquire(ctx, now, TierRead, nil)
	require.NoError(t, err)
	_, err = p.Acquire(ctx, now, TierRead, func() bool { return true })
	require.ErrorIs(t, err, ErrGone)
	r1(now, time.Millisecond, true)

	short := NewPoolLimit(PoolLimitConfig{Limit: 1, Queue: 1, QueueTimeout: time.Millisecond})
	r1, err = short.Acquire(ctx, now, TierRead, nil)
	require.NoError(t, err)
	_, err = short.Acquire(ctx, now, TierRead, nil)
	require.ErrorIs(t, err, ErrQueueTimeout)
	r1(now, time.Millisecond, true)
}

func TestPoolLimitAdaptiveFollowsLatency(t *testing.T) {
	p := NewPoolLimit(PoolLimitConfig{Limit: 64, Adaptive: true, MinLimit: 2, InitialLimit: 16})
	require.Equal(t, 16, p.Limit())
	now := time.Unix(1000, 0)
	ctx := context.Background()
	// step runs a window: as many exchanges at once as the limit lets in
	// (the origin is kept busy), each answered at latency rtt.
	step := func(rtt time.Duration) {
		var held []func(time.Time, time.Duration, bool)
		for range p.Limit() {
			r, err := p.Acquire(ctx, now, TierRead, nil)
			require.NoError(t, err)
			held = append(held, r)
		}
		for _, r := range held {
			r(now, rtt, true)
		}
		now = now.Add(150 * time.Millisecond)
	}
	for range 10 {
		step(10 * time.Millisecond) // no queue: the limit grows
	}
	high := p.Limit()
	require.Greater(t, high, 16)
	require.LessOrEqual(t, high, 64)
	for range 10 {
		step(100 * time.Millisecond) // the origin queues: it shrinks
	}
	low := p.Limit()
	require.Less(t, low, high)
	require.GreaterOrEqual(t, low, 2)
	// The slots hold the learned limit.
	var held []func(time.Time, time.Duration, bool)
	for {
		r, err := p.Acquire(ctx, now, TierRead, nil)
		if err != nil {
			require.ErrorIs(t, err, ErrQueueFull)
			break
		}
		held = append(held, r)
		require.LessOrEqual(t, len(held), 64)
	}
	require.Len(t, held, low)
	for _, r := range held {
		r(now, 100*time.Millisecond, true)
	}
}

func TestPoolLimitConfigValidate(t *testing.T) {
	require.NoError(t, PoolLimitConfig{}.Validate())
	require.NoError(t, PoolLimitConfig{Limit: 8, Adaptive: true, MinLimit: 2, Queue: 4, QueueTimeout: time.Second}.Validate())
	err := PoolLimitConfig{Limit: -1, Adaptive: true, MinLimit: -2, InitialLimit: -1, Queue: -1, QueueTimeout: -time.Second}.Validate()
	require.Error(t, err)
	for _, field := range []string{"limit:", "adaptive needs a limit", "min_limit:", "initial_limit:", "queue:", "queue_timeout:"} {
		require.Contains(t, err.Error(), field)
	}
}

func TestWorkersSetCapacity(t *testing.T) {
	w := NewWorkers(1, 4, time.Minute)
	ctx := context.Background()
	r1, err := w.Acquire(ctx, TierRead)
	require.NoError(t, err)
	got := make(chan func(), 2)
	for range 2 {
		go func() {
			r, err := w.Acquire(ctx, TierRead)
			if err == nil {
				got <- r
			}
		}()
	}
	require.Eventually(t, func() bool { return w.Queued() == 2 }, 10*time.Second, time.Millisecond)
	w.SetCapacity(3) // both waiters get the new slots at once
	ra, rb := <-got, <-got
	require.Equal(t, 3, w.Busy())
	w.SetCapacity(1) // a smaller cap takes effect as requests end
	r1()
	ra()
	require.Equal(t, 1, w.Busy())
	// A critical request queues behind the cap of 1 and takes the slot rb
	// frees (waiting for it, not for its queue timeout of a minute).
	rc := make(chan func(), 1)
	go func() {
		r, err := w.Acquire(ctx, TierCritical)
		if err != nil {
			r = nil
		}
		rc <- r
	}()
	require.Eventually(t, func() bool { return w.Queued() == 1 }, 10*time.Second, time.Millisecond)
	require.Equal(t, 1, w.Busy())
	rb()
	r := <-rc
	require.NotNil(t, r, "the queued critical request gets the freed slot")
	require.Equal(t, 1, w.Busy())
	r()
	require.Zero(t, w.Busy()+w.Queued())
}
