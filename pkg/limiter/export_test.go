package limiter

import (
	"context"
	"unsafe"
)

// LoneInFlight is how many lone calls and batches the store has in flight
// (tests wait for some before sending a call that must wait for a batch).
func (s *RedisStore) LoneInFlight() int64 {
	s.lanes.mu.RLock()
	defer s.lanes.mu.RUnlock()
	var n int64
	for _, l := range s.lanes.by {
		l.mu.Lock()
		n += int64(l.inflight)
		l.mu.Unlock()
	}
	return n
}

// LoneDirect is how many lone calls of a lane go straight to a connection at once.
const LoneDirect = loneDirect

// LaneBatches is how many batch calls the store's lanes sent and how many
// lone calls those carried.
func (s *RedisStore) LaneBatches() (batches, calls int64) {
	return s.lanes.batches.Load(), s.lanes.batched.Load()
}

// TakeBatched sends reqs' takes as one call of the batch script on the
// master client given (how a lane sends its queue) and returns each take's
// reply or error.
func (s *RedisStore) TakeBatched(ctx context.Context, master RedisClient, reqs []Request) ([][]int64, []error) {
	cs := make([]call, len(reqs))
	for i, r := range reqs {
		cs[i] = s.takeCall(r, s.ids.next())
	}
	out, errs := make([][]int64, len(reqs)), make([]error, len(reqs))
	for i, cmd := range s.batched(ctx, master, cs, nil) {
		out[i], errs[i] = cmd.Int64Slice()
	}
	return out, errs
}

// SetMaxLaneQueue changes how many calls a lane queues; the returned func
// restores it.
func SetMaxLaneQueue(n int) func() {
	old := maxLaneQueue
	maxLaneQueue = n
	return func() { maxLaneQueue = old }
}

// LaneQueued is how many calls wait in the store's lanes.
func (s *RedisStore) LaneQueued() int {
	s.lanes.mu.RLock()
	defer s.lanes.mu.RUnlock()
	n := 0
	for _, l := range s.lanes.by {
		l.mu.Lock()
		n += len(l.queue)
		l.mu.Unlock()
	}
	return n
}

// TakeMovesStack runs a Take of reqs on a goroutine of its own, as
// Limiter.take runs a store call, calling growStack first when grow is
// set, and reports whether the goroutine's stack was moved (grown and
// copied) during the Take.
func TakeMovesStack(ctx context.Context, s *RedisStore, reqs []Request, grow bool) (bool, error) {
	type result struct {
		moved bool
		err   error
	}
	done := make(chan result, 1)
	go func() {
		if grow {
			growStack()
		}
		var mark byte
		before := uintptr(unsafe.Pointer(&mark))
		_, err := s.Take(ctx, reqs)
		done <- result{uintptr(unsafe.Pointer(&mark)) != before, err}
	}()
	r := <-done
	return r.moved, r.err
}

// OnSoftClose calls f each time a connection closed with a reply owed is
// closed softly (softclose.go); the returned func undoes it.
func OnSoftClose(f func()) func() {
	softCloseSeam.Store(&f)
	return func() { softCloseSeam.Store(nil) }
}
