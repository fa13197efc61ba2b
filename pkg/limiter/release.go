package limiter

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
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
	byStore := l.takeBack(v.Checks, func(o Decision) bool { return o.Lease.Limit.Algorithm.Spec().Held })
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
		sentTo := l.mastersOf(s, leases)
		err := l.giveBack(s, leases)
		if err == nil {
			l.ackedBy(s, leases, sentTo)
		}
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

// Releases a Cluster master acknowledged, sent again after a failover.
// Replication is asynchronous: a master can acknowledge a release and be
// failed over before its replica has it (frozen just after the reply, or
// thawed after the failover and answering the commands queued meanwhile
// before it learns it lost its slots). The promoted replica then still
// holds the slot, until its TTL. A release removes members by id and
// removing them twice is harmless, so the limiter keeps, for releaseResendFor,
// each acknowledged release with the master it was sent to, and sends it
// again, once, when its key is served by another master: at once if that is
// already so when the acknowledgement arrives, else when the limiter sees a
// master it did not know (a promoted replica) or a master's breaker closes.
// Outside a Cluster (one master; Shard is "") nothing is kept.

const (
	// releaseResendFor covers a failover: a master unreachable for the
	// cluster's node timeout (15 s by default), then its replica's
	// election and the edge's slot map reload.
	releaseResendFor = 30 * time.Second
	// maxAcked bounds the releases kept; the oldest go first.
	maxAcked = 1 << 15
)

// ackedReleases are the releases kept for a resend, oldest first.
type ackedReleases struct {
	mu   sync.Mutex
	list []ackedRelease
	n    atomic.Int64 // len(list), read without the lock on the request path
}

type ackedRelease struct {
	s      Store
	lease  Lease
	master string    // the master it was sent to (Store.Shard)
	at     time.Time // when it was acknowledged
}

// mastersOf names the master each held lease's release goes to (nil
// outside a Cluster).
func (l *Limiter) mastersOf(s Store, leases []Lease) []string {
	if !s.Remote() {
		return nil
	}
	var out []string
	for i, ls := range leases {
		m := s.Shard(ls.Limit)
		if m == "" {
			continue
		}
		if out == nil {
			out = make([]string, len(leases))
		}
		out[i] = m
	}
	return out
}

// ackedBy keeps the leases whose release masters acknowledged, or sends
// again at once those whose key another master serves already.
func (l *Limiter) ackedBy(s Store, leases []Lease, masters []string) {
	if masters == nil {
		return
	}
	now := time.Now()
	var moved []Lease
	keep := make([]ackedRelease, 0, len(leases))
	for i, ls := range leases {
		if masters[i] == "" || !ls.Limit.Algorithm.Spec().Held {
			continue
		}
		if m := s.Shard(ls.Limit); m != "" && m != masters[i] {
			moved = append(moved, ls)
			continue
		}
		keep = append(keep, ackedRelease{s: s, lease: ls, master: masters[i], at: now})
	}
	l.acked.mu.Lock()
	l.acked.list = append(l.acked.list, keep...)
	l.acked.pruneLocked(now)
	l.acked.mu.Unlock()
	if len(moved) > 0 {
		l.metrics.releasesResent.Add(float64(len(moved)))
		l.releaseWithRetry(s, moved) // on the release's own background work
	}
}

// pruneLocked drops what is too old to matter or past the bound.
func (a *ackedReleases) pruneLocked(now time.Time) {
	i := 0
	for i < len(a.list) && (now.Sub(a.list[i].at) > releaseResendFor || len(a.list)-i > maxAcked) {
		i++
	}
	if i > 0 {
		a.list = append(a.list[:0], a.list[i:]...)
	}
	a.n.Store(int64(len(a.list)))
}

// resendMoved sends again, in the background, the kept releases whose key
// another master serves now. It runs on the request path (a breaker's
// callbacks) and takes no lock there.
func (l *Limiter) resendMoved() {
	if l.acked.n.Load() == 0 {
		return
	}
	l.releaseInBackground(func() {
		now := time.Now()
		moved := map[Store][]Lease{}
		l.acked.mu.Lock()
		l.acked.pruneLocked(now)
		kept := l.acked.list[:0]
		for _, a := range l.acked.list {
			if m := a.s.Shard(a.lease.Limit); m != "" && m != a.master {
				moved[a.s] = append(moved[a.s], a.lease)
				continue
			}
			kept = append(kept, a)
		}
		clear(l.acked.list[len(kept):])
		l.acked.list = kept
		l.acked.n.Store(int64(len(kept)))
		l.acked.mu.Unlock()
		for s, leases := range moved {
			l.metrics.releasesResent.Add(float64(len(leases)))
			l.releaseWithRetry(s, leases)
		}
	})
}
