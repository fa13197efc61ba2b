package limiter

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// HealthState is how well the Limiter can decide, as readiness reports it.
type HealthState uint8

// The health states.
const (
	// Healthy: the store answers (or was never asked yet and nothing failed).
	Healthy HealthState = iota
	// Degraded: the store fails for some or all keys; their checks are
	// decided by the fail mode (fallback: locally, limit/N per node; open:
	// admitted unchecked). The node still serves.
	Degraded
	// Unavailable: the store fails and the fail mode is closed, so the
	// checks it cannot decide are refused (503).
	Unavailable
)

var healthNames = [...]string{"healthy", "degraded", "unavailable"}

func (s HealthState) String() string { return healthNames[s] }

// The classes of store failure: the reason of a degraded Health and the
// class label of edgeguard_limiter_store_errors_total. Bounded.
const (
	ReasonTimeout     = "timeout"     // no answer within the deadline (slow or frozen)
	ReasonUnreachable = "unreachable" // connection refused, reset or closed
	ReasonCredentials = "credentials" // WRONGPASS, NOAUTH or NOPERM: a misconfiguration no retry fixes
	ReasonError       = "error"       // any other error reply (OOM, LOADING, CLUSTERDOWN, ...)
)

var reasons = []string{ReasonTimeout, ReasonUnreachable, ReasonCredentials, ReasonError}

// Health is the Limiter's answer to "can you decide?".
type Health struct {
	State HealthState
	// Reason classifies the failure (one of the Reason constants); "" when
	// healthy.
	Reason string
	// Detail is the last store error, for people.
	Detail string
	// Since is when the store started failing.
	Since time.Time
	// OpenShards counts the store shards whose breaker is not closed.
	OpenShards int
	// FailMode is what the Limiter does with checks the store cannot decide.
	FailMode FailMode
}

// ClassifyStoreError names the class of a store failure.
func ClassifyStoreError(err error) string {
	var nerr net.Error
	switch {
	case redis.IsAuthError(err) || redis.IsPermissionError(err):
		return ReasonCredentials
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout():
		return ReasonTimeout
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return ReasonError
	}
	return ReasonUnreachable
}

// errorLogEvery is how often a store that keeps failing is logged again:
// rejected credentials, above all, must not run in fallback silently.
const errorLogEvery = 30 * time.Second

// health follows the store's failures between breaker transitions: the
// last failure's class, cleared by the next success.
type health struct {
	failing atomic.Bool // lock-free fast path for successes

	mu     sync.Mutex
	class  string    // the current failure's class; "" once a call succeeded
	last   string    // the last failure's class, kept after successes (a shard's breaker may still be open)
	detail string    // its error text
	since  time.Time // when the current failure started
	logged time.Time // when it was last logged

	checking atomic.Bool  // a readiness check of the store is in flight
	checked  atomic.Int64 // unix ns of the last one
}

// observe records the outcome of a store call or probe.
func (l *Limiter) observe(err error, now time.Time) {
	h := &l.health
	if err == nil {
		if !h.failing.Load() {
			return
		}
		h.mu.Lock()
		was, since := h.class, h.since
		h.class = ""
		h.failing.Store(false)
		h.mu.Unlock()
		if was != "" {
			l.log.Info("rate limit store answers again", "store", l.cfg.StoreName, "failed_for", now.Sub(since).Round(time.Millisecond), "reason", was)
		}
		return
	}
	class := ClassifyStoreError(err)
	l.metrics.storeErrors.WithLabelValues(class).Inc()
	h.mu.Lock()
	if h.class == "" {
		h.since = now
	}
	h.class, h.last, h.detail = class, class, err.Error()
	h.failing.Store(true)
	log := now.Sub(h.logged) >= errorLogEvery
	if log {
		h.logged = now
	}
	since := h.since
	h.mu.Unlock()
	if !log {
		return
	}
	if class == ReasonCredentials {
		l.log.Error("rate limit store rejects our credentials: fix the store URL's user/password or the ACL; until then checks are decided by the fail mode",
			"store", l.cfg.StoreName, "fail_mode", l.cfg.FailMode, "failing_for", now.Sub(since).Round(time.Second), "err", err)
		return
	}
	l.log.Warn("rate limit store failing", "store", l.cfg.StoreName, "reason", class, "fail_mode", l.cfg.FailMode, "failing_for", now.Sub(since).Round(time.Second), "err", err)
}

// StoreFailed records a failure met outside a decision (the edge's script
// load at start), so readiness knows of a store that is down before the
// first request arrives.
func (l *Limiter) StoreFailed(err error) {
	if err != nil {
		l.observe(err, l.now())
	}
}

// Health reports whether the store decides. It is cheap (readiness checks
// call it) and never waits on the store; while the store fails it starts,
// at most once per breaker cooldown, a check in the background, so a node
// that gets no traffic (a load balancer took it out) still learns that the
// store is back.
func (l *Limiter) Health() Health {
	out := Health{FailMode: l.cfg.FailMode}
	if !l.store.Remote() {
		return out
	}
	now := l.now()
	out.OpenShards = l.kick(now)
	h := &l.health
	h.mu.Lock()
	class, last, detail, since := h.class, h.last, h.detail, h.since
	h.mu.Unlock()
	if class == "" && out.OpenShards == 0 {
		return out
	}
	out.Reason, out.Detail, out.Since = class, detail, since
	if class == "" {
		out.Reason, out.Since = last, time.Time{}
	}
	if out.Reason == "" {
		out.Reason = ReasonUnreachable
	}
	out.State = Degraded
	if l.cfg.FailMode == FailClosed {
		out.State = Unavailable
	}
	return out
}

// kick probes, in the background, the shards whose breaker waits for a
// probe that no request arrives to trigger, and the store itself when its
// last answer was a failure and nothing asked it since. It returns how many
// breakers are not closed.
func (l *Limiter) kick(now time.Time) int {
	open := 0
	for _, b := range l.breakers.notClosed() {
		open++
		lim := b.probeLimit.Load()
		if lim == nil {
			continue
		}
		if _, probe := b.allow(now); probe {
			l.probe(b, *lim)
		}
	}
	h := &l.health
	if open > 0 || !h.failing.Load() || now.UnixNano()-h.checked.Load() < int64(l.cfg.BreakerCooldown) || !h.checking.CompareAndSwap(false, true) {
		return open
	}
	h.checked.Store(now.UnixNano())
	l.bg.Go(func() {
		defer h.checking.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
		defer cancel()
		l.observe(l.store.Probe(ctx, Limit{Key: "readyz"}), l.now())
	})
	return open
}

// notClosed lists the breakers that are open or half-open.
func (bs *breakers) notClosed() []*breaker {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var out []*breaker
	for _, b := range bs.m {
		if breakerState(b.state.Load()) != breakerClosed {
			out = append(out, b)
		}
	}
	return out
}
