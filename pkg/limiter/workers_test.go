package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// Calls one after another run on the worker the first one started (a call
// handed over just before the worker is back waiting may start a second
// one), and workers left idle end.
func TestWorkersKeepTheirGoroutine(t *testing.T) {
	w := newWorkers()
	const calls = 200
	ran := 0
	for range calls {
		done := make(chan struct{})
		w.run(func() {
			ran++
			close(done)
		})
		<-done
	}
	require.Equal(t, calls, ran)
	require.LessOrEqual(t, int(w.running.Load()), 10, "workers started for %d calls made one after another", calls)
	waitNoWorkers(t, w)
}

// Calls that all wait at once each get a goroutine, the kept workers
// bounded by maxWorkers: a call never waits for a worker to be free.
func TestWorkersNeverQueueACall(t *testing.T) {
	w := newWorkers()
	const calls = maxWorkers + 50
	var started sync.WaitGroup
	started.Add(calls)
	release := make(chan struct{})
	var ended sync.WaitGroup
	ended.Add(calls)
	for range calls {
		w.run(func() {
			defer ended.Done()
			started.Done()
			<-release
		})
	}
	started.Wait() // every call runs while all the others still wait
	require.Equal(t, int32(maxWorkers), w.running.Load())
	close(release)
	ended.Wait()
	waitNoWorkers(t, w)
}

// Stopped workers end without waiting to be idle long, and a call run
// afterwards still runs.
func TestWorkersStop(t *testing.T) {
	w := newWorkers()
	w.idle = time.Hour // only stop can end them
	for range 3 {
		done := make(chan struct{})
		w.run(func() { close(done) })
		<-done
	}
	w.stop()
	waitNoWorkers(t, w)
	done := make(chan struct{})
	w.run(func() { close(done) })
	<-done
	waitNoWorkers(t, w)
	w.stop() // twice is fine
}

// A closed limiter leaves no worker waiting.
func TestClosedLimiterKeepsNoWorkers(t *testing.T) {
	l, err := New(NewMemoryStore(), Config{}, nil, nil)
	require.NoError(t, err)
	l.workers.idle = time.Hour
	l.workers.run(func() {})
	l.Close()
	waitNoWorkers(t, l.workers)
}

// The zero value runs every call on a goroutine of its own.
func TestWorkersZeroValue(t *testing.T) {
	var w workers
	done := make(chan struct{})
	w.run(func() { close(done) })
	<-done
	waitNoWorkers(t, &w)
	w.stop()
}

func waitNoWorkers(t *testing.T, w *workers) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, proc.PollEvery(ctx, 10*time.Millisecond, "idle workers to end", func(context.Context) error {
		if n := w.running.Load(); n != 0 {
			return fmt.Errorf("%d workers running", n)
		}
		return nil
	}))
}
