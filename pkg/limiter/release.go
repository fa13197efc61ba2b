package limiter

import (
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Releases in the background: a response must never wait for Redis to
// hear that its concurrency slot is free (with Redis paused, a response
// whose origin took 500 ms used to leave after the full refund timeout),
// and a release that fails must not leave the slot held until its TTL
// when Redis comes back a moment later.

const (
	// maxReleasing bounds the releases retried at once; past it a release
	// is dropped (counted) and its slot expires with its TTL.
	maxReleasing = 4096
	// releaseRetryFor bounds how long a failed release is retried.
	releaseRetryFor = 10 * time.Second
	// releaseBackoff is the first wait between tries; it doubles up to a
	// second.
	releaseBackoff = 50 * time.Millisecond
)

// ReleaseAsync gives back a request's concurrency slots without waiting:
// the local bookkeeping is done at once, the store is told in the
// background, and a failed try is retried with backoff for up to 10 s
// (edgeguard_limiter_release_retries_total), so a Redis blip does not hold
// the slot until its TTL. Close waits for releases under way.
func (l *Limiter) ReleaseAsync(v Verdict) {
	if !v.Allowed {
		return
	}
	byStore := l.takeBack(v.Checks, func(o Outcome) bool { return o.Lease.Limit.Algorithm.Spec().Held })
	if len(byStore) == 0 {
		return
	}
	// Process memory (the embedded store, the fallback) is told at once:
	// no I/O to wait for, and a client's next request must find its slot
	// free (a background release could still be pending when it arrives).
	for s, leases := range byStore {
		if _, local := s.(*MemoryStore); local {
			_ = l.giveBack(s, leases)
			delete(byStore, s)
		}
	}
	if len(byStore) == 0 {
		return
	}
	l.releaseInBackground(func() {
		for s, leases := range byStore {
			l.releaseWithRetry(s, leases)
		}
	})
}

// releaseInBackground runs release on the limiter's background work, at most
// maxReleasing at once; past that it is dropped (counted) and its units
// expire with their TTL.
func (l *Limiter) releaseInBackground(release func()) bool {
	select {
	case l.releasing <- struct{}{}:
	default:
		l.metrics.releasesDropped.Inc()
		return false
	}
	l.bg.Go(func() {
		defer func() { <-l.releasing }()
		release()
	})
	return true
}

func (l *Limiter) releaseWithRetry(s Store, leases []Lease) {
	deadline := time.Now().Add(releaseRetryFor)
	wait := releaseBackoff
	for {
		err := l.giveBack(s, leases)
		if err == nil || callerError(err) || !time.Now().Add(wait).Before(deadline) {
			return
		}
		l.metrics.releaseRetries.Inc()
		time.Sleep(wait) // a background retry's backoff, not a test's wait
		wait = min(2*wait, time.Second)
	}
}

// giveBackUnsure gives back, in the background and retried like a release,
// the members a take may have added though its reply was lost (see
// RedisStore.Take): removing members by their id is harmless when the take
// never ran.
func (l *Limiter) giveBackUnsure(leases []Lease) {
	if l.releaseInBackground(func() { l.releaseWithRetry(l.store, leases) }) {
		l.metrics.unsure.Add(float64(len(leases)))
	}
}

// maybeRan reports whether a call that failed with err may still have run
// in Redis: its connection failed, or its deadline passed, after it may have
// been written. A reply from Redis (a script error, NOSCRIPT, BUSY), a call
// never sent (a full lane, a caller that left while it was queued, a failed
// dial, an exhausted pool) ran nothing.
func maybeRan(err error) bool {
	var rerr redis.Error
	if err == nil || errors.As(err, &rerr) || errors.Is(err, ErrLaneFull) || errors.Is(err, errNotSent) {
		return false
	}
	var op *net.OpError
	return !errors.Is(err, redis.ErrPoolTimeout) && !(errors.As(err, &op) && op.Op == "dial")
}
