package limiter

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A call delayed on its way to Redis (a slow link, a connection still being
// dialed, a lane's batch sent late) runs on Redis's clock: without a bound
// it runs after its caller has stopped waiting and decided the request in
// the fallback, and it records the request at the time it ran. A late give
// back removes what it took, but until then a sliding log's min_interval
// counts from that later time, and the client's next request, well spaced,
// is denied. So a take carries the latest Redis time at which it may still
// run — its caller's deadline on Redis's clock — and the script refuses to
// run past it, writing nothing (prelude.lua); the caller learns the call did
// not count from the refusal (errPastDeadline) and owes the store nothing
// for it. The deadline is the latest the caller may wait (up to
// maxLifeWait deadlines while the store shows signs of life), so a call
// whose caller gave up at the first one may still run until then, and
// holds a min_interval until its give-back lands
// (TestLateTakeHoldsMinIntervalUntilGivenBack).
//
// The deadline is mapped onto Redis's clock through an estimate of the
// offset between the clocks: a TIME read by the store, taken as
// redisTime − the edge's time when the reply arrived. That is never more
// than the true offset (the reply was read before it arrived), so the
// mapped deadline is never later than the caller's: a call that runs ran
// before its caller gave up. The estimate with the shortest round trip of
// the last clockKeep is kept, and none slower than clockMaxRTT (a slow
// reading makes a loose bound, which would refuse calls early),
// refreshed every clockRefresh in the background, and
// clockSkew is taken off for what clocks drift between readings and for
// the difference between a Cluster's nodes' clocks (one node's TIME stands
// for all; NTP keeps them within a few milliseconds). A node whose clock is
// behind by more than clockSkew lets a call run that much past its
// deadline (it is then given back when answered, as before); one ahead
// refuses calls that arrive that much before the deadline (decided by the
// fallback). Without an estimate (no TIME answered yet, or none for
// clockStale) calls carry no deadline.

const (
	clockRefresh = 5 * time.Second
	clockKeep    = 30 * time.Second
	clockStale   = time.Minute
	clockSkew    = 5 * time.Millisecond
	// clockMaxRTT bounds the round trip of a reading that is used: a
	// reading's bound is as loose as its round trip, and a loose one
	// refuses calls that run that much before their deadline (a loaded
	// edge or Redis, a slow link). Slower readings are dropped.
	clockMaxRTT = 20 * time.Millisecond
)

// redisClock is the store's estimate of Redis's clock.
type redisClock struct {
	est       atomic.Pointer[clockEstimate]
	measuring atomic.Bool
	tried     atomic.Int64 // unix ns of the last background reading
}

type clockEstimate struct {
	offset time.Duration // Redis's time − the edge's, at most the true offset
	rtt    time.Duration // of the TIME read it comes from
	at     time.Time     // when it was read (edge clock)
}

// errPastDeadline is a take Redis refused because it arrived after its
// caller's deadline: it wrote nothing.
var errPastDeadline = errors.New("refused past the caller's deadline")

// errWindowEnded is a take that would have run at or past its
// Request.until: it took nothing. The store answered; it did not fail.
var errWindowEnded = errors.New("the take's window ended before it ran")

// untilLatest bounds latest (0: none) by r.until, and reports whether
// until is the bound: a refusal then means the window ended.
func untilLatest(r Request, latest int64) (int64, bool) {
	if r.until.IsZero() {
		return latest, false
	}
	// The script refuses past latest (µs, inclusive): the last µs of
	// the window still runs in it.
	u := max(r.until.UnixMicro()-1, 1)
	if latest > 0 && latest < u {
		return latest, false
	}
	return u, true
}

// measure reads Redis's TIME once through c and keeps the estimate if it
// is tighter than the one kept, or that one is old.
func (rc *redisClock) measure(ctx context.Context, c RedisClient) error {
	cmd := redis.NewTimeCmd(ctx, "time")
	sent := time.Now()
	if err := c.Process(ctx, cmd); err != nil {
		return err
	}
	got := time.Now()
	e := &clockEstimate{offset: cmd.Val().Sub(got), rtt: got.Sub(sent), at: got}
	if e.rtt > clockMaxRTT {
		return nil
	}
	for {
		cur := rc.est.Load()
		if cur != nil && e.rtt > cur.rtt && got.Sub(cur.at) < clockKeep {
			return nil
		}
		if rc.est.CompareAndSwap(cur, e) {
			return nil
		}
	}
}

// latest is the latest time on Redis's clock (unix µs) at which a call its
// caller stops waiting for at deadline may run; 0 for no bound. It asks for
// a fresh estimate in the background when the one it has is due.
func (rc *redisClock) latest(deadline time.Time, c RedisClient) int64 {
	e := rc.est.Load()
	now := time.Now()
	if e == nil || now.Sub(e.at) >= clockRefresh {
		rc.refresh(c)
	}
	if e == nil || now.Sub(e.at) >= clockStale || deadline.IsZero() {
		return 0
	}
	return max(deadline.Add(e.offset-clockSkew).UnixMicro(), 1)
}

// onRedis is t, a time on the edge's clock, on Redis's, never earlier than
// it was there: the estimate's offset is at most the true one, and short of
// it by at most the reading's round trip; clockSkew covers drift and the
// other nodes of a Cluster. Zero (the call then runs at Redis's TIME)
// without a fresh estimate, or when that is not before Redis's time now.
func (rc *redisClock) onRedis(t time.Time) time.Time {
	e := rc.est.Load()
	now := time.Now()
	if e == nil || now.Sub(e.at) >= clockStale {
		return time.Time{}
	}
	at := t.Add(e.offset + e.rtt + clockSkew)
	if !at.Before(now.Add(e.offset)) {
		return time.Time{}
	}
	return at
}

// refresh measures in the background, one reading at a time and at most
// one a second.
func (rc *redisClock) refresh(c RedisClient) {
	now := time.Now().UnixNano()
	if last := rc.tried.Load(); now-last < int64(time.Second) || !rc.tried.CompareAndSwap(last, now) {
		return
	}
	if !rc.measuring.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer rc.measuring.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = rc.measure(ctx, c)
	}()
}

// withLatest is a take's ARGV with its deadline: now (ARGV[2]) is −latest.
func withLatest(args []any, latest int64) []any {
	if latest > 0 {
		args[1] = -latest
	}
	return args
}

// pastDeadline reports a script's refusal to run past its caller's deadline.
func pastDeadline(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(rerr.Error(), "edgeguard: past the caller's deadline")
}
