// Package limiter makes rate-limit decisions: a Limit names what is counted and
// how, a Store counts it, and a Decision says how much of a request's cost was
// admitted and when to come back.
//
// Two stores share one set of semantics: RedisStore runs the atomic Lua scripts
// of package lua against standalone Redis, a Cluster or a Sentinel group, and
// MemoryStore runs the same algorithms over process memory (single-node mode and
// the local fallback). Every algorithm admits part of a cost when only part
// fits, so concurrent requests for one key can be coalesced into one call.
//
// Limits of one request live in different Redis slots and cannot be atomic
// together; Decide takes them in one round trip per node and, when any of them
// denies, refunds what the others took.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Check is one limit of a client request, as the edge asks it.
type Check struct {
	Limit Limit
	Cost  int64
	// Shadow checks count but never deny, and are never cached as over limit.
	Shadow bool
	// Nodes is how many edge nodes share this limit; when Redis cannot be
	// asked, the local fallback admits this node's share of what the store
	// last reported left, remaining/Nodes (decideLocally). 0 means 1.
	Nodes int
	// Tolerance > 0 leases the check (fixed_window and token_bucket only):
	// the edge decides from an allowance carved from the store in batches,
	// and together with every other edge admits at most (1 + Tolerance)
	// times the exact bound per window (lease.go). In
	// [limit.MinTolerance, limit.MaxTolerance].
	Tolerance float64
	// Peek looks without counting: the check answers whether Cost units
	// would be admitted now (Decision.Allowed), what remains and when the
	// limit resets, and takes nothing — in the store, the fallback or the
	// over-limit cache (peek.go). Not with Tolerance or Global, nor for
	// the algorithms that keep members (sliding log, concurrency).
	Peek bool
	// Global counts the check once across every region (fixed_window, with
	// a Tolerance): its key's home region holds the count and the others
	// lease from it in the background (global.go).
	Global bool
}

// Source says where a check was decided.
type Source uint8

// The sources, also the values of the metrics' reason label.
const (
	SourceStore     Source = iota // the primary store (Redis, or memory in single-node mode)
	SourcePrefilter               // the over-limit cache: denied without a call
	SourceFallback                // the local fallback: the store failed or its breaker is open
	SourceOpen                    // fail-open: the store failed and nothing was enforced
	SourceSkipped                 // not evaluated: another limit had already denied
	SourceLease                   // a leased check, from the edge's allowance without a call
	numSources
)

var sourceNames = [numSources]string{"store", "prefilter", "fallback", "open", "skipped", "lease"}

func (s Source) String() string { return sourceNames[s] }

// Verdict is the answer for one client request.
type Verdict struct {
	// Allowed is false when any non-shadow check denied.
	Allowed bool
	// Checks has one decision per check, in order.
	Checks []Decision
}

// FailMode is what the limiter does when its store cannot answer.
type FailMode string

// The fail modes.
const (
	FailFallback FailMode = "fallback" // decide from local memory with limit / nodes
	FailOpen     FailMode = "open"     // admit without counting
	FailClosed   FailMode = "closed"   // refuse: Decide returns ErrUnavailable
)

// ParseFailMode accepts fallback, open or closed; "" is fallback.
func ParseFailMode(s string) (FailMode, error) {
	switch m := FailMode(s); m {
	case "":
		return FailFallback, nil
	case FailFallback, FailOpen, FailClosed:
		return m, nil
	}
	return "", fmt.Errorf("unknown fail mode %q (want fallback, open or closed)", s)
}

// ErrUnavailable is returned by Decide in FailClosed mode when the store
// could not decide.
var ErrUnavailable = errors.New("rate limit store unavailable")

// Config tunes a Limiter. Zero values take the defaults.
type Config struct {
	// StoreName labels decisions of the primary store in metrics ("redis").
	StoreName string
	// Timeout bounds one store round trip (default 250ms). A slow store is
	// waited for, so limits stay exact while it is merely slow; past the
	// timeout the check is decided by FailMode and the call counts towards
	// opening the breaker.
	Timeout time.Duration
	// FailMode is what to do when the store fails (default fallback).
	FailMode FailMode
	// CacheSize caps the over-limit cache (default 100,000 keys).
	CacheSize int
	// BreakerFailures consecutive failures open the breaker (default 5): a
	// failed call, or a check that joined a call in flight and gave up on
	// it (waitJoined); while open, checks skip the store and a single probe is let through
	// every BreakerCooldown (default 1s) until one succeeds.
	BreakerFailures int
	BreakerCooldown time.Duration
	// FallbackKeys caps the fallback memory store (default 1,000,000 keys).
	FallbackKeys int
	// Now is the limiter's clock (default time.Now): a rule test steps a
	// frozen one, so its decisions do not depend on how fast it runs.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.StoreName == "" {
		c.StoreName = "redis"
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.FailMode == "" {
		c.FailMode = FailFallback
	}
	if c.CacheSize <= 0 {
		c.CacheSize = 100_000
	}
	if c.BreakerFailures <= 0 {
		c.BreakerFailures = 5
	}
	if c.BreakerCooldown <= 0 {
		c.BreakerCooldown = time.Second
	}
	if c.FallbackKeys <= 0 {
		c.FallbackKeys = 1_000_000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// DefaultTimeout is the store deadline: far above a healthy call (well under
// a millisecond) and above the 100 ms a loaded Redis may take; past it a
// caller waits on only while the store shows it is alive (keepWaiting), so
// slowness alone does not send decisions to the fallback, and a frozen store
// costs the requests in flight during one deadline before the breaker opens.
const DefaultTimeout = 250 * time.Millisecond

// Limiter is what the edge calls: a store behind a local prefilter (over-limit
// cache and per-key coalescing), a circuit breaker and a local fallback.
type Limiter struct {
	cfg      Config
	store    Store
	fallback *MemoryStore
	ledger   *ledger
	cache    *overLimitCache
	flights  *flights
	// allowances are the leased checks' local allowances (lease.go).
	allowances *allowances
	breakers   *breakers
	metrics    *metrics
	health     health
	log        *slog.Logger
	now        func() time.Time
	deadline   sharedDeadline
	late       sharedDeadline // lateTimeout, for store calls on their own goroutine
	workers    *workers       // the goroutines store calls run on
	bg         sync.WaitGroup // background work: probes, batches sent after their leader, releases
	// releasing bounds the releases under way in the background.
	releasing chan struct{}
	// global decides Global checks (global.go); nil: as leased ones.
	global atomic.Pointer[Global]
	// acked are the releases Cluster masters acknowledged lately, sent
	// again if a failover moves their keys (release.go).
	acked ackedReleases
	// watch counts the store's signs of a master change and newShards the
	// masters seen for the first time: together the master generation
	// (masters.go).
	watch     masterWatcher
	newShards atomic.Uint64
	// idf reads who serves a shard, when the store can say (identity.go).
	idf identifier
	// shardSeen is set once the first master is seen (under the breakers'
	// lock): that one replaces none, so it is no sign of a change.
	shardSeen bool
	// started is when the limiter was made: an edge that has not heard
	// from the store since knows nothing of what others counted before.
	started time.Time
}

// Close gives back the allowance of leased checks the edge holds, then
// waits for the limiter's background work (breaker probes, coalesced
// batches in flight) to end; each is bounded by the store deadline.
func (l *Limiter) Close() {
	l.closeAllowances()
	l.bg.Wait()
	l.workers.stop()
}

// New builds a Limiter over store. reg may be nil.
func New(store Store, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Limiter, error) {
	cfg = cfg.withDefaults()
	if _, err := ParseFailMode(string(cfg.FailMode)); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{
		cfg:        cfg,
		store:      store,
		fallback:   NewMemoryStore(WithMaxKeys(cfg.FallbackKeys)),
		ledger:     newLedger(cfg.CacheSize),
		cache:      newOverLimitCache(cfg.CacheSize),
		flights:    newFlights(),
		allowances: newAllowances(cfg.CacheSize),
		log:        log,
		now:        cfg.Now,
		started:    cfg.Now(),
		deadline:   sharedDeadline{timeout: cfg.Timeout},
		releasing:  make(chan struct{}, maxReleasing),
		workers:    newWorkers(),
	}
	l.late = sharedDeadline{timeout: l.lateTimeout()}
	l.watch, _ = store.(masterWatcher)
	l.idf, _ = store.(identifier)
	snd, _ := store.(sender)
	m, err := newMetrics(reg, cfg.StoreName, func() int64 { return l.fallback.Evicted() }, l.Health, snd)
	if err != nil {
		return nil, err
	}
	l.metrics = m
	l.breakers = newBreakers(cfg.BreakerFailures, cfg.BreakerCooldown, func(shard string, s breakerState, open int, worst breakerState) {
		m.breakerState.WithLabelValues(shardLabel(shard)).Set(float64(s))
		m.breakersOpen.Set(float64(open))
		switch s {
		case breakerOpen:
			m.breakerOpens.Inc()
			log.Warn("rate limit store failing, deciding locally", "store", cfg.StoreName, "shard", shard, "fail_mode", cfg.FailMode)
		case breakerClosed:
			log.Info("rate limit store recovered", "store", cfg.StoreName, "shard", shard)
			l.resendMoved()
		}
	})
	l.breakers.onNew = func(shard string) {
		m.breakerState.WithLabelValues(shardLabel(shard)).Set(float64(breakerClosed))
		// A master not seen before: maybe a promoted replica. Not the
		// first one: no answer came before it, so none can be missing on
		// it, and calls racing to it are no calls a change overtook.
		if l.shardSeen {
			l.newShards.Add(1)
		}
		l.shardSeen = true
		l.resendMoved()
	}
	l.breakers.onGone = func(shard string) {
		m.breakerState.DeleteLabelValues(shardLabel(shard))
		open := 0
		for _, b := range l.breakers.m { // called with the breakers locked
			if breakerState(b.state.Load()) != breakerClosed {
				open++
			}
		}
		m.breakersOpen.Set(float64(open))
	}
	return l, nil
}

// Flush forgets every cached over-limit key: the rules changed, and a cached
// denial may belong to a limit that no longer exists or is now larger.
func (l *Limiter) Flush() { l.cache.flush() }

// pending is one check on its way to the store.
type pending struct {
	i     int
	check Check
	key   string // memKey(check.Limit)
	item  *item  // set when it joined another request's call
	b     *batch // the batch it joined
	alone bool   // leads a call outside the key's flight
	// wait, for a check that joined a remote store's call, is the store
	// deadline from when it joined (waitJoined).
	wait context.Context
	// rider is the request's rider: it goes with the first of its
	// checks' store calls (rider.go).
	rider *Rider
}

// Decide answers one client request: all its checks, all-or-nothing. A
// request denied by one check gives back what the others took.
func (l *Limiter) Decide(ctx context.Context, checks []Check) (Verdict, error) {
	return l.DecideRiding(ctx, checks, nil, nil)
}

// DecideRiding is Decide with r riding in the first store call its checks
// make (none when they are decided without one); r may be nil. The
// verdict's Checks are into[:len(checks)] when into has room (a caller
// deciding request after request reuses one buffer once it is done with
// the verdict), else a new slice; into may be nil.
func (l *Limiter) DecideRiding(ctx context.Context, checks []Check, r *Rider, into []Decision) (Verdict, error) {
	now := l.now()
	if err := validChecks(checks); err != nil {
		return Verdict{}, err
	}
	if cap(into) < len(checks) {
		into = make([]Decision, len(checks))
	}
	v := Verdict{Allowed: true, Checks: into[:len(checks)]}
	peeks := false
	for i, c := range checks {
		v.Checks[i] = Decision{Limit: c.Limit.Limit, Remaining: c.Limit.Limit, Source: SourceSkipped}
		peeks = peeks || c.Peek
	}
	var keyBuf [4]string
	if peeks {
		return l.decideWithPeeks(ctx, checks, memKeys(checks, keyBuf[:0]), r, v, now)
	}
	// 1. Over-limit cache: a denial known locally costs no call, and the
	// request is refused before anything is counted (or allocated: the
	// checks' memKeys are built after it).
	if l.prefiltered(checks, v.Checks, now) {
		v.Allowed = false
		return v, nil
	}
	keys := memKeys(checks, keyBuf[:0])
	// 2. Per-key coalescing: checks whose key has a call in flight join the
	// next call for that key; the others lead, in one pipeline.
	var leadBuf, leasedBuf [2]pending
	routed := l.route(checks, keys, routes{leads: leadBuf[:0], leased: leasedBuf[:0]}, r)
	if err := l.decideRouted(ctx, routed, v.Checks, now); err != nil {
		return Verdict{}, err
	}
	// 3. All-or-nothing.
	for i, c := range checks {
		if !c.Shadow && !v.Checks[i].Allowed {
			v.Allowed = false
		}
	}
	if !v.Allowed {
		l.refund(v.Checks, func(Decision) bool { return true })
	} else {
		// A shadow check that denied would, enforced, have counted nothing.
		l.refund(v.Checks, func(o Decision) bool { return !o.Allowed })
	}
	return v, nil
}

// validChecks reports the first check the limiter cannot decide.
func validChecks(checks []Check) error {
	for i, c := range checks {
		if err := (Request{Limit: c.Limit, Cost: c.Cost}).valid(); err != nil {
			return fmt.Errorf("check %d: %w", i, err)
		}
		// Each problem needs a tolerance, a global or a peek: a plain
		// check, nearly every one, asks none of them.
		if c.Tolerance == 0 && !c.Global && !c.Peek {
			continue
		}
		if err := errors.Join(c.leaseProblem(), c.globalProblem(), c.peekProblem()); err != nil {
			return fmt.Errorf("check %d: %w", i, err)
		}
	}
	return nil
}

// memKeys appends the checks' memKeys to keys.
func memKeys(checks []Check, keys []string) []string {
	for _, c := range checks {
		keys = append(keys, memKey(c.Limit))
	}
	return keys
}

// prefiltered reports whether the over-limit cache denies one of the
// checks, and records that denial in outs.
func (l *Limiter) prefiltered(checks []Check, outs []Decision, now time.Time) bool {
	for i, c := range checks {
		if c.Shadow || c.Limit.Algorithm.Spec().Held {
			continue
		}
		if d, ok := l.cache.get(c.Limit, c.Cost, now); ok {
			outs[i] = d.from(SourcePrefilter, nil)
			l.metrics.prefilterHits.Inc()
			l.metrics.record(SourcePrefilter, 1)
			return true
		}
	}
	return false
}

// routes are a request's checks by how they are decided: leading a call,
// joined to another request's call for their key, leased or global.
type routes struct {
	leads, joined, leased, global []pending
}

// route sorts the checks by how they are decided, appending to r's lists;
// a check whose key has a call in flight joins that key's next call. rd is
// the request's rider.
func (l *Limiter) route(checks []Check, keys []string, r routes, rd *Rider) routes {
	for i, c := range checks {
		p := pending{i: i, check: c, key: keys[i], rider: rd}
		if c.Global {
			r.global = append(r.global, p)
			continue
		}
		if c.Tolerance > 0 {
			r.leased = append(r.leased, p)
			continue
		}
		b, it, how := l.flights.join(c, keys[i])
		if how == follow {
			p.b, p.item = b, it
			if l.store.Remote() {
				p.wait = l.deadline.get()
			}
			r.joined = append(r.joined, p)
			l.metrics.coalesced.Inc()
			continue
		}
		p.alone = how == alone
		r.leads = append(r.leads, p)
	}
	return r
}

// decideRouted decides the routed checks into outs; on an error what they
// took is given back.
func (l *Limiter) decideRouted(ctx context.Context, r routes, outs []Decision, now time.Time) error {
	err := l.lead(ctx, r.leads, outs, now)
	if err == nil {
		err = l.decideLeased(ctx, r.leased, outs, now)
	}
	if err == nil && len(r.global) > 0 {
		err = l.decideGlobal(ctx, r.global, outs, now)
	}
	// Joined checks are settled by their batches regardless; wait so
	// that what they took is given back.
	if jerr := l.awaitJoined(ctx, r.joined, outs, now); err == nil {
		err = jerr
	}
	if err != nil {
		l.refund(outs, func(Decision) bool { return true })
	}
	return err
}

// Release gives back a request's concurrency slots once its response is done.
func (l *Limiter) Release(ctx context.Context, v Verdict) {
	if !v.Allowed {
		return
	}
	l.refund(v.Checks, func(o Decision) bool { return o.Lease.Limit.Algorithm.Spec().Held })
}

func (l *Limiter) refund(outs []Decision, want func(Decision) bool) {
	for s, leases := range l.takeBack(outs, want) {
		l.giveBack(s, leases)
	}
}

// takeBack marks the wanted outcomes' leases given back (once only) and
// does the local bookkeeping; it returns what each store must be told.
func (l *Limiter) takeBack(outs []Decision, want func(Decision) bool) map[Store][]Lease {
	var byStore map[Store][]Lease
	for i := range outs {
		o := &outs[i]
		if o.allow != nil && o.Lease.Units > 0 && want(*o) {
			o.allow.putBack(o.Lease.Units, o.epoch) // never told to the store
			o.Lease.Units = 0
			continue
		}
		if o.store == nil || o.Lease.Units <= 0 || !want(*o) {
			continue
		}
		if byStore == nil {
			byStore = map[Store][]Lease{}
		}
		byStore[o.store] = append(byStore[o.store], o.Lease)
		if o.store == Store(l.fallback) {
			l.ledger.paid(memKey(o.Lease.Limit), o.Lease.Units) // never counted by the store
		}
		o.Lease.Units = 0 // given back once only
	}
	return byStore
}

// giveBack tells s the leases are given back, once. Once s has them (or
// may have: a refund that failed may have run), a cached denial of their
// keys may fit sooner than it says, and is dropped (dropGivenBack).
func (l *Limiter) giveBack(s Store, leases []Lease) error {
	ctx, cancel := context.WithTimeout(context.Background(), l.refundTimeout())
	err := s.Refund(ctx, leases)
	cancel()
	l.dropGivenBack(leases)
	l.metrics.refunds.Add(float64(len(leases)))
	if err != nil {
		// The units stay counted until their window passes: a client
		// gets slightly less than its quota, never more.
		l.metrics.refundErrors.Inc()
		l.log.Warn("refund failed", "leases", len(leases), "err", err)
	}
	return err
}

// dropGivenBack drops the cached denials of the keys whose units the
// store has back (concurrency limits are never cached: releases skip
// this), and keeps out those of calls sent before now
// (overLimitCache.dropAfterGiveBack).
func (l *Limiter) dropGivenBack(leases []Lease) {
	now := l.now()
	for _, ls := range leases {
		if !ls.Limit.Algorithm.Spec().Held {
			l.cache.dropAfterGiveBack(ls.Limit, now)
		}
	}
}

// refundTimeout gives refunds more room than decisions: nobody waits on them
// and a lost refund under-admits until the window passes.
func (l *Limiter) refundTimeout() time.Duration { return max(10*l.cfg.Timeout, 100*time.Millisecond) }

// lead sends the leading checks in one Take (one round trip per node); now
// is when Decide began, no later than the call is sent.
func (l *Limiter) lead(ctx context.Context, leads []pending, outs []Decision, now time.Time) error {
	if len(leads) == 0 {
		return nil
	}
	var reqBuf [2]Request
	var keyBuf [2]string
	reqs, keys := reqBuf[:0], keyBuf[:0]
	for _, p := range leads {
		reqs = append(reqs, Request{Limit: p.check.Limit, Cost: p.check.Cost})
		keys = append(keys, p.key)
	}
	gen := l.cache.generation()
	sent := now
	var ds []Decision
	var errs []error
	if one := l.pooledCall(len(reqs)); one != nil {
		defer putOneCall(one)
		c := one.call()
		l.callWith(ctx, c, one, reqs, keys, sent, leads[0].rider)
		ds, errs = c.ds, c.errs
	} else {
		ds, errs = l.call(ctx, reqs, keys, sent, leads[0].rider)
	}
	var failed []int
	for j, p := range leads {
		if errs[j] == nil {
			d, held := ds[j].holdBack()
			outs[p.i] = d.from(SourceStore, l.store)
			l.metrics.record(SourceStore, 1)
			if !held {
				l.remember(p.check, d, p.check.Cost, sent, gen)
			}
		} else {
			failed = append(failed, j)
		}
		// The key's next batch, if any request joined meanwhile, goes now.
		if !p.alone {
			l.flights.done(p.key, l.sendLater)
		}
	}
	for _, j := range failed {
		o, err := l.degrade(leads[j].check, errs[j])
		if err != nil {
			return err
		}
		outs[leads[j].i] = o
	}
	return nil
}

// call asks the store, through the breakers, under the configured deadline.
// errs has one entry per request: errBreakerOpen for requests whose shard's
// breaker is open. Each shard (a Cluster master; the whole store otherwise)
// has its own breaker, so one dead master does not send the keys of the
// healthy ones to the fallback. keys are the requests' memKeys; now is no
// later than the call is sent; rd, if not nil, rides with it.
func (l *Limiter) call(ctx context.Context, reqs []Request, keys []string, now time.Time, rd *Rider) ([]Decision, []error) {
	c, one := newStoreCall(len(reqs))
	l.callWith(ctx, c, one, reqs, keys, now, rd)
	return c.ds, c.errs
}

// callWith is call in the working state c (with one, its single
// allocation, when it has one), which it fills.
func (l *Limiter) callWith(ctx context.Context, c storeCall, one *oneCall, reqs []Request, keys []string, now time.Time, rd *Rider) {
	gen := l.masterGen() // before anything is sent
	// The shards stay out of c: a slice of its own stays on the stack.
	var shards []*breaker
	if one != nil {
		shards = one.shards[:]
	} else {
		shards = make([]*breaker, len(reqs))
	}
	for i, r := range reqs {
		shards[i] = l.breakers.get(l.store.Shard(r.Limit))
		l.wantIdentity(shards[i], r.Limit, gen)
		if !l.admitToShard(shards[i], r.Limit, now) {
			c.errs[i] = errBreakerOpen
			continue
		}
		o := l.owed(r, keys[i], now) // first: it notes a sign of a master change
		r.post = l.afterChange(r.Limit, now) || l.unattributed(shards[i], r.Limit, now, gen)
		c.add(r, i, keys[i], o)
	}
	if len(c.send) == 0 {
		return
	}
	start := time.Now()
	// A memory store's answers stay here, on the stack.
	var gotBuf [2]Decision
	got, err := l.take(ctx, c.send, c.sent, shards, keys, now, rd, gotBuf[:0])
	l.metrics.storeDecided.Add(float64(len(c.send)))
	l.settleCall(c, reqs, keys, shards, got, err, now, gen)
	storeSeconds := l.metrics.storeOK
	if err != nil {
		storeSeconds = l.metrics.storeError
	}
	storeSeconds.Observe(time.Since(start).Seconds())
	l.judgeShards(c, shards, reqs)
}

// storeCall is call's working state: per request its answer and error;
// what is sent, and for each sent request the index of the caller's
// request (or replaying, restoring).
type storeCall struct {
	errs []error
	ds   []Decision
	send []Request
	sent []int
}

// newStoreCall makes call's state for n requests; for one, in a single
// allocation (returned too, for its shards).
func newStoreCall(n int) (storeCall, *oneCall) {
	if n == 1 { // most requests carry one limit: one allocation
		b := new(oneCall)
		return b.call(), b
	}
	return storeCall{
		errs: make([]error, n),
		ds:   make([]Decision, n),
		send: make([]Request, 0, n),
		sent: make([]int, 0, n),
	}, nil
}

// admitToShard reports whether a request may go to the shard behind b.
func (l *Limiter) admitToShard(b *breaker, lim Limit, now time.Time) bool {
	ok, probe := b.allow(now)
	if probe {
		// The probe is the limiter's own, in the background: no
		// client waits on a store that may still be frozen, and this
		// request is decided locally like the others while it runs.
		l.probe(b, lim)
		return false
	}
	return ok
}

// owedRequests is what the store is owed for a key, sent with its request.
type owedRequests struct {
	restore    Request
	hasRestore bool
	replays    []Request // a replay per lot of the fallback's admissions
}

// owed is what the store is owed with a request: first the restore of its
// answer before an outage (the store runs it before the rest), then what
// the fallback admitted while the store could not be asked, so the store
// counts both before deciding anew. Replayed units are counted, not
// spaced: their min_interval is dropped. Held limits (slots) owe nothing:
// a slot is given back, not replayed.
func (l *Limiter) owed(r Request, key string, now time.Time) owedRequests {
	var o owedRequests
	if r.Limit.Algorithm.Spec().Held {
		return o
	}
	l.checkMasters(key, now)
	if rem, at, until, by, ok := l.ledger.lendRestore(key, now); ok {
		o.restore = Request{Limit: r.Limit, Cost: r.Limit.Capacity() - rem, Restore: true, Remaining: rem, At: at, until: until, ident: by}
		o.restore.Limit.MinInterval = 0
		o.hasRestore = o.restore.Cost > 0
	}
	lots := l.ledger.lend(key, now)
	if len(lots) == 0 {
		return o
	}
	o.replays = make([]Request, len(lots))
	for j, lot := range lots {
		// Refused past the end of the window it was admitted in (the
		// store's clock): the next window owes nothing for it.
		rp := Request{Limit: r.Limit, Cost: lot.units, Need: 1, until: lot.until}
		rp.Limit.MinInterval = 0
		// Dated when its units were admitted, a window before the end
		// of the window they count in (answerUntil): counted as of now,
		// a sliding window or a bucket would hold them for as long as
		// the outage lasted after that. A fixed window counts them in
		// the window they were admitted in either way.
		rp.dated = r.Limit.Algorithm != limit.FixedWindow
		rp.post = l.afterChange(r.Limit, now)
		o.replays[j] = rp
	}
	return o
}

// add queues request i and what the store is owed with it. With a
// min_interval the replays go after the request, which a replay recorded
// "now" would otherwise deny.
func (c *storeCall) add(r Request, i int, key string, o owedRequests) {
	r.key, o.restore.key = key, key
	if o.hasRestore {
		c.send, c.sent = append(c.send, o.restore), append(c.sent, restoring)
	}
	after := r.Limit.MinInterval > 0
	if after {
		c.send, c.sent = append(c.send, r), append(c.sent, i)
	}
	for _, rp := range o.replays {
		rp.key = key
		c.send, c.sent = append(c.send, rp), append(c.sent, replaying)
	}
	if !after {
		c.send, c.sent = append(c.send, r), append(c.sent, i)
	}
}

// settleCall spreads a call's answers (got, err) over the caller's
// requests, gives back what its lost replies may have taken and settles
// what the store was owed. gen is the master generation the call was sent
// under.
func (l *Limiter) settleCall(c storeCall, reqs []Request, keys []string, shards []*breaker, got []Decision, err error, now time.Time, gen uint64) {
	perCall := takeErrs(err)
	answered := l.now()
	genNow := l.masterGen()
	l.giveBackUnsureOf(got, err)
	for j, i := range c.sent {
		e := err
		if perCall != nil {
			e = perCall[j]
		}
		if i < 0 {
			if !errors.Is(e, errGaveUp) { // else the call settles it when it ends
				l.settleOwed(c.send[j], i, answerOf(got, j), e)
			}
			continue
		}
		c.errs[i] = e
		if j < len(got) {
			c.ds[i] = got[j]
		}
		if e == nil && !reqs[i].Limit.Algorithm.Spec().Held {
			var by *storeIdent // a sign of a master change while the call was out: who answered is unknown
			switch {
			case c.send[j].post && c.ds[i].Lease.id != "": // a tallied take says who ran it
				by = &storeIdent{id: c.ds[i].Lease.id}
			case genNow == gen:
				by = shards[i].answeredBy(now, gen)
			}
			c.ds[i].unseen = l.ledger.observe(keys[i], c.ds[i].Remaining, answered, answerUntil(reqs[i].Limit, c.ds[i], now), gen, genNow, c.ds[i].Admitted, c.ds[i].Lease.tallied(), by)
		}
	}
}

// judgeShards tells each breaker how its shard did: it succeeded when none
// of its requests failed for a store reason (an invalid request says
// nothing about the store's health). Requests are few and so are their
// shards: a list, not a map.
func (l *Limiter) judgeShards(c storeCall, shards []*breaker, reqs []Request) {
	type shardResult struct {
		b      *breaker
		failed bool
	}
	var resBuf [4]shardResult
	results := resBuf[:0]
	var storeErr error
	for _, i := range c.sent {
		// A full lane is back-pressure from this edge's own queue, not a
		// sign the store fails: it neither trips a breaker nor counts as a
		// success (the call was not sent).
		if i < 0 || errors.Is(c.errs[i], ErrLaneFull) {
			continue
		}
		// A take refused because its window ended was answered.
		f := c.errs[i] != nil && !callerError(c.errs[i]) && !errors.Is(c.errs[i], errWindowEnded)
		if f {
			storeErr = cmpErr(storeErr, c.errs[i])
			lim := reqs[i].Limit             // a copy: reqs stay on their caller's stack
			shards[i].probeLimit.Store(&lim) // what a readiness check probes
		}
		k := slices.IndexFunc(results, func(r shardResult) bool { return r.b == shards[i] })
		if k < 0 {
			results = append(results, shardResult{shards[i], f})
		} else {
			results[k].failed = results[k].failed || f
		}
	}
	now := l.now() // one reading of the clock for the call's whole verdict
	for _, r := range results {
		if r.failed {
			r.b.failure(now)
		} else {
			r.b.answered.Store(now.UnixNano())
			r.b.success()
		}
	}
	l.observe(storeErr, now)
}

// take asks the store for send under the store deadline. A remote call
// runs on a goroutine of its own, bound by lateTimeout rather than by the
// deadline: the caller waits until the deadline, and longer only while the
// store shows it is alive (keepWaiting), and a call it gives up on is
// settled when its answer comes — what it took is given back and its replay
// paid — instead of being cut off once written (Redis would still run it,
// and count what the caller's fallback decided too). A call still queued in
// a lane when its caller gives up is taken out and never sent. sent maps
// send to the caller's requests (-1: a replay), shards the caller's
// requests to their shards' breakers; rd, if not nil, rides with the call.
func (l *Limiter) take(ctx context.Context, send []Request, sent []int, shards []*breaker, keys []string, now time.Time, rd *Rider, into []Decision) ([]Decision, error) {
	if !l.store.Remote() {
		if m, ok := l.store.(*MemoryStore); ok {
			return m.takeInto(send, into)
		}
		return l.store.Take(ctx, send)
	}
	// The store deadline is the shared one (a timer a millisecond, not
	// one a call); the caller's own end (ctx) is waited for beside it.
	wait := l.deadline.get()
	r := &run{done: make(chan struct{}), l: l, send: send, sent: sent, shards: shards, rd: rd}
	// The latest the caller may still wait: Redis refuses the call past it
	// (prepareTake). A call run after its caller gave up sooner is given
	// back when it answers (settleLate).
	r.latest, _ = wait.Deadline()
	r.latest = r.latest.Add((maxLifeWait - 1) * l.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(r.latest) {
		r.latest = d
	}
	r.ctx = runContext{Context: l.late.get(), values: ctx, wait: r}
	l.bg.Add(1)
	l.workers.runJob(r)
	cause := l.awaitAnswer(ctx, wait, r.done, func() bool { return l.keepWaiting(sent, shards, now) })
	if cause == nil || !r.state.CompareAndSwap(running, abandoned) {
		<-r.done // answered, or answered just now
		return r.got, r.err
	}
	r.giveUp(cause)
	return nil, fmt.Errorf("%w: %w", errGaveUp, cause)
}

// awaitAnswer waits for done as a store call's caller does: until wait's
// deadline, on while alive reports the store alive (looking again every
// lifeTick), and no longer than ctx. It returns nil once done is closed,
// else why it stopped waiting.
func (l *Limiter) awaitAnswer(ctx, wait context.Context, done <-chan struct{}, alive func() bool) error {
	tick := wait.Done()
	var timer *time.Timer
	var life <-chan time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-done:
			return nil
		case <-tick:
			tick = nil // closed: it would fire again and again
		case <-life:
		case <-ctx.Done(): // the caller's own end
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if alive() {
			if timer == nil {
				l.metrics.lifeWaits.Inc()
				timer = time.NewTimer(l.lifeTick())
			} else {
				timer.Reset(l.lifeTick())
			}
			life = timer.C
			continue
		}
		if err := wait.Err(); err != nil {
			return err
		}
		return context.DeadlineExceeded
	}
}

// maxLifeWait is how long a caller waits for a store that shows it is
// alive, in store deadlines: past it, the call is given up as a frozen
// one would be (and settled when it answers).
const maxLifeWait = 4

// lifeTick is how often a caller waiting past the deadline looks again for
// the store's evidence of life, and how recent that evidence must be.
func (l *Limiter) lifeTick() time.Duration { return max(l.cfg.Timeout/2, time.Millisecond) }

// keepWaiting reports whether a caller whose call was sent at now and is
// past its deadline waits on: every shard it went to answered a call of
// this edge within the last lifeTick (a store that is merely slow — a
// queue, a fork, a fsync — keeps answering, so the call's answer is on its
// way), and the call has waited less than maxLifeWait deadlines. A frozen
// or dead store answers nothing: its callers give up at the deadline, as
// before.
func (l *Limiter) keepWaiting(sent []int, shards []*breaker, sentAt time.Time) bool {
	return waitsOnLife(l.now(), sentAt, l.cfg.Timeout, func(yield func(int64) bool) {
		for _, i := range sent {
			if i >= 0 && !yield(shards[i].answered.Load()) {
				return
			}
		}
	})
}

// waitsOnLife is keepWaiting's rule, on values: at now, a call sent at
// sentAt under deadline timeout waits on while it has waited less than
// maxLifeWait deadlines and each of answers (unix ns; 0: never) is no older
// than timeout/2 (at least 1 ms).
func waitsOnLife(now, sentAt time.Time, timeout time.Duration, answers func(yield func(int64) bool)) bool {
	if now.Sub(sentAt) >= maxLifeWait*timeout {
		return false
	}
	recent := max(timeout/2, time.Millisecond)
	alive, any := true, false
	answers(func(at int64) bool {
		any = true
		if at == 0 || now.Sub(time.Unix(0, at)) > recent {
			alive = false
		}
		return alive
	})
	return any && alive
}

// markAnswered records that the shards of the sent requests answered now.
func (l *Limiter) markAnswered(sent []int, shards []*breaker) {
	at := l.now().UnixNano()
	for _, i := range sent {
		if i >= 0 {
			shards[i].answered.Store(at)
		}
	}
}

// storeTake is the store's Take, with rd riding if the store takes riders.
func (l *Limiter) storeTake(ctx context.Context, send []Request, rd *Rider) ([]Decision, error) {
	if rs, ok := l.store.(riderStore); ok && rd != nil {
		return rs.TakeRiding(ctx, send, rd)
	}
	return l.store.Take(ctx, send)
}

// giveBackUnsureOf removes what the failed takes of a call whose replies
// were lost may have added (Decision.Unsure).
func (l *Limiter) giveBackUnsureOf(got []Decision, err error) {
	if err == nil {
		return
	}
	var leases []Lease
	for _, d := range got {
		if d.Unsure && d.Lease.Units > 0 {
			leases = append(leases, d.Lease)
		}
	}
	if len(leases) > 0 {
		l.giveBackUnsure(leases)
	}
}

// errGaveUp is a store call its caller stopped waiting for at the deadline.
var errGaveUp = errors.New("store deadline passed")

// run is one store call on its own goroutine.
// It is also the caller's wait as the lanes see it (waitOf): done once the
// caller gives up, which a store showing life postpones past the deadline.
type run struct {
	state atomic.Int32 // running, answered or abandoned
	done  chan struct{}
	// mu guards quit (made when a lane first asks, closed when the caller
	// gives up: most calls never queue, and never make it) and cause.
	mu    sync.Mutex
	quit  chan struct{}
	cause error // why the caller gave up; nil while it waits
	// latest is the latest the caller may wait (maxLifeWait deadlines):
	// the call's deadline as the store sees it.
	latest time.Time
	got    []Decision
	err    error

	// The call, for the worker that runs it (work): one allocation with
	// the run, instead of a closure and a boxed context besides.
	l      *Limiter
	ctx    runContext
	send   []Request
	sent   []int
	shards []*breaker
	rd     *Rider
}

// work runs the store call on a worker, and settles it when its caller
// gave up on it meanwhile.
func (r *run) work() {
	l := r.l
	defer l.bg.Done()
	got, err := l.storeTake(&r.ctx, r.send, r.rd)
	r.got, r.err = got, err
	if r.state.CompareAndSwap(running, answered) {
		close(r.done)
		return
	}
	if err == nil {
		l.markAnswered(r.sent, r.shards)
	}
	l.settleLate(r.send, r.sent, got, err)
}

func (r *run) Deadline() (time.Time, bool) { return r.latest, true }
func (r *run) Value(any) any               { return nil }

func (r *run) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.quit == nil {
		r.quit = make(chan struct{})
		if r.cause != nil {
			close(r.quit)
		}
	}
	return r.quit
}

func (r *run) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cause
}

// giveUp ends the caller's wait, for cause (not nil).
func (r *run) giveUp(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cause = cause
	if r.quit != nil {
		close(r.quit)
	}
}

const (
	running int32 = iota
	answered
	abandoned
)

// runContext is a store call's context: its own deadline (lateTimeout),
// the caller's values, and the caller's deadline as the moment it stops
// waiting (lanes take a call still queued then out of their queue).
type runContext struct {
	context.Context
	values, wait context.Context
}

type waitKey struct{}

func (c runContext) Value(key any) any {
	if key == (waitKey{}) {
		return c.wait
	}
	return c.values.Value(key)
}

// waitOf is the context whose end means the caller stopped waiting for a
// call made under ctx: ctx itself unless the limiter runs the call on its own.
func waitOf(ctx context.Context) context.Context {
	if w, ok := ctx.Value(waitKey{}).(context.Context); ok {
		return w
	}
	return ctx
}

// lateTimeout bounds a store call its caller gave up on: long enough for a
// paused or slow store to answer, so what the call took is given back; a
// call still unanswered then may have counted (clients get less, never more).
func (l *Limiter) lateTimeout() time.Duration { return l.refundTimeout() }

// settleLate is what a store call whose caller gave up leaves behind once
// answered: the units its requests took go back to the store (the caller's
// fallback decided them) and its replays are settled. Members (concurrency
// slots, sliding-log units) are removed by id, so their give-back is retried
// in the background as a release is: tried once, a give-back the link drops
// just after the late answer came in left a slot held until its TTL. A
// counter's refund subtracts and one that failed may have run: it is tried
// once (clients get less, never more).
func (l *Limiter) settleLate(send []Request, sent []int, got []Decision, err error) {
	l.giveBackUnsureOf(got, err)
	perCall := takeErrs(err)
	var byID, counted []Lease
	for j := range send {
		e := err
		if perCall != nil {
			e = perCall[j]
		}
		if sent[j] < 0 {
			l.settleOwed(send[j], sent[j], answerOf(got, j), e)
			continue
		}
		if e != nil || j >= len(got) || got[j].Lease.Units <= 0 {
			continue
		}
		if ls := got[j].Lease; ls.Limit.Algorithm.Spec().Members {
			byID = append(byID, ls)
		} else {
			counted = append(counted, ls)
		}
	}
	l.metrics.lateCalls.Inc()
	l.metrics.lateGivenBack.Add(float64(len(byID) + len(counted)))
	if len(counted) > 0 {
		_ = l.giveBack(l.store, counted)
	}
	if len(byID) > 0 {
		// On this late call's own background work, after the counters'
		// refund (which its retries must not hold up): not bound by
		// maxReleasing, so a burst of releases never drops it untried.
		l.releaseWithRetry(l.store, byID)
	}
}

// A call's requests that are not a caller's (call's sent): what the store
// is owed.
const (
	replaying = -1 // the fallback's admissions
	restoring = -2 // the store's last answer before an outage
)

// settleOwed records how a replay of the fallback's admissions or a restore
// ended (d: the store's answer to it): done, or owed again (a replay that
// failed may still have counted: the store then counts it twice, and
// clients get less, never more). A replay owed again after its window
// ended is dropped (ledger.owe), as of when the call ended, not when it
// was sent. A replay counts only what fits under the limit: the units it
// could not count are owed again, so that room that opens later in their
// window (units a late call took and gives back, a window that slides)
// goes to them before anyone else.
func (l *Limiter) settleOwed(r Request, kind int, d Decision, err error) {
	switch {
	case err == nil && kind == replaying:
		counted := min(max(d.Admitted, 0), r.Cost)
		l.ledger.landed(memKey(r.Limit), r.Cost, r.Cost-counted, l.now(), r.until)
		l.metrics.replayed.Add(float64(counted))
	case err == nil:
		l.metrics.restores.Inc()
	case kind == replaying:
		again := r.Cost
		if errors.Is(err, errWindowEnded) {
			again = 0
		}
		l.ledger.landed(memKey(r.Limit), r.Cost, again, l.now(), r.until)
	default:
		l.ledger.oweRestore(memKey(r.Limit), r.Remaining, r.At, r.until, r.ident)
	}
}

// answerOf is got's j-th answer, if the call gave one.
func answerOf(got []Decision, j int) Decision {
	if j < len(got) {
		return got[j]
	}
	return Decision{}
}

// oneCall holds call's working slices for a single request (and a replay
// of what the fallback admitted for it).
type oneCall struct {
	errs   [1]error
	ds     [1]Decision
	shards [1]*breaker
	send   [2]Request
	sent   [2]int
}

// call is a call's working state in b.
func (b *oneCall) call() storeCall {
	return storeCall{errs: b.errs[:], ds: b.ds[:], send: b.send[:0], sent: b.sent[:0]}
}

// oneCalls keeps the state of single-request calls to a store that
// answers in the caller's goroutine (the memory store). Nothing holds
// such a call's state once its caller has read the answers, so it is
// reused instead of left to the collector: about 600 bytes a decision.
// A remote store's call state is never pooled: a call whose caller gave
// up runs on in the background and settles from its state later.
var oneCalls = sync.Pool{New: func() any { return new(oneCall) }}

// pooledCall is a cleared state from oneCalls for a call of n requests,
// or nil when such a call's state must not be reused (several requests, or
// a remote store).
func (l *Limiter) pooledCall(n int) *oneCall {
	if n != 1 || l.store.Remote() {
		return nil
	}
	b := oneCalls.Get().(*oneCall)
	*b = oneCall{}
	return b
}

// putOneCall hands b back to oneCalls once its caller is done with the
// answers in it.
func putOneCall(b *oneCall) { oneCalls.Put(b) }

// probe asks whether the shard holding lim's key answers again, without
// counting anything. A Cluster master may have been replaced while the
// breaker was open: the slot map is read again first, so keys re-home to
// the promoted replica (a new shard with its own, closed breaker) instead of
// waiting for the periodic reload.
func (l *Limiter) probe(b *breaker, lim Limit) {
	l.store.Refresh()
	if l.store.Remote() {
		l.metrics.refreshes.Inc()
	}
	l.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
		defer cancel()
		err := l.store.Probe(ctx, lim)
		l.observe(err, l.now())
		if err != nil {
			b.failure(l.now())
			return
		}
		b.answered.Store(l.now().UnixNano())
		// Who answers now, before the calls that follow (their answers
		// are noted with it): the same store as before the outage, or
		// another (identity.go).
		l.readIdentity(b, lim)
		b.success()
	})
}

// callerError is an error in the request itself, not the store's.
func callerError(err error) bool {
	return errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrUnknownAlgorithm)
}

var errBreakerOpen = errors.New("circuit breaker open")

// degrade decides a check the store could not, per the fail mode.
func (l *Limiter) degrade(c Check, cause error) (Decision, error) {
	if callerError(cause) {
		return Decision{}, cause
	}
	reason := "error"
	switch {
	case errors.Is(cause, errBreakerOpen):
		reason = "breaker_open"
	case errors.Is(cause, ErrLaneFull):
		reason = "lane_full"
	}
	l.metrics.fallbacks.WithLabelValues(reason).Inc()
	switch l.cfg.FailMode {
	case FailOpen:
		l.metrics.record(SourceOpen, 1)
		return Decision{Admitted: c.Cost, Allowed: true, Limit: c.Limit.Limit, Remaining: c.Limit.Limit, Source: SourceOpen}, nil
	case FailClosed:
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	return l.decideLocally(c)
}

// decideLocally decides c in the fallback with this node's share of what
// the store had left: each of the N nodes sharing the limit admits
// floor(remaining/N) of the remaining quota the store last reported for
// the key in its window (seedFallback), and floor(limit/N) when the store
// has counted nothing in the window for anyone, so together they admit at
// most the limit. An exact check (neither leased nor a concurrency limit)
// shared by several nodes gets no share while the store answered this
// node within the window (unknownInWindow): the others may have counted
// after this node's last answer, and no share of it is safe. A limit
// below N leaves a node no share either. Without a share the node denies
// until the store answers again.
func (l *Limiter) decideLocally(c Check) (Decision, error) {
	local := c.Limit
	nodes := int64(max(c.Nodes, 1))
	local.Limit = c.Limit.Limit / nodes
	local.Burst = c.Limit.Burst / nodes
	key := memKey(c.Limit)
	now := l.now()
	unknown := local.Limit >= 1 && (c.Limit.Burst == 0 || local.Burst >= 1) && l.unknownInWindow(c, key, now)
	if unknown {
		l.metrics.unknown.Inc()
		// The store may come back empty (a restart): it relearns its
		// count from this edge's last answer (a restore, sent first).
		l.ledger.oweAnswer(key, now)
	}
	if local.Limit < 1 || (c.Limit.Burst > 0 && local.Burst < 1) || unknown {
		l.metrics.record(SourceFallback, 1)
		retry := max(l.cfg.BreakerCooldown, time.Second)
		return Decision{Limit: c.Limit.Limit, RetryAfter: retry, ResetAfter: retry, Lease: Lease{Limit: local}, Source: SourceFallback}, nil
	}
	if !local.Algorithm.Spec().Held {
		l.seedFallback(key, local, nodes, now)
	}
	ds, err := l.fallback.Take(context.Background(), []Request{{Limit: local, Cost: c.Cost}})
	if err != nil {
		return Decision{}, err
	}
	if ds[0].Admitted > 0 && !local.Algorithm.Spec().Held {
		l.ledger.owe(key, ds[0].Admitted, now, answerUntil(c.Limit, ds[0], now))
	}
	l.metrics.record(SourceFallback, 1)
	return ds[0].from(SourceFallback, l.fallback), nil
}

// seedFallback starts an outage's local count from the store's last
// answer, which says how much of this window is used: this node takes its
// share of that up front, once per outage. The answer itself is owed back
// to the store as a restore, sent first once it answers again: a store
// that comes back empty relearns what it had counted, one that kept its
// state takes nothing (replaying the share as units would count it twice,
// and at every flap again).
func (l *Limiter) seedFallback(key string, local Limit, nodes int64, now time.Time) {
	used, fresh, at := l.ledger.seedFor(key, local.Capacity(), nodes, now)
	if fresh {
		l.fallback.forget(local) // an earlier outage's count: in the store's answer now
	}
	if used > 0 {
		// Seeded as of the store's answer, not now: a min_interval
		// counts from the client's last real request, and the seed
		// must not take the place of the request being decided.
		_, _ = l.fallback.Take(context.Background(), []Request{{Limit: local, Cost: used, Need: 1, At: at}})
	}
}

// unknownInWindow reports whether c is an exact check the fallback must
// not decide: the store node holding its key (its shard) answered this
// node within the key's window (silentFor; since the node started, if it
// never did), so other nodes may have counted the key after this node's
// last answer — shares of answers the nodes got at different moments add
// up to more than the store had left. A shard that has not answered this
// node for that long, and has been failing it through that window and
// still is (downThroughWindow), has counted nothing in the window for
// anyone (when it is down for every node), and each node's floor(limit/N)
// keeps the window to the limit. A node alone (Nodes ≤ 1) decides its
// share of its own last answer, which is the store's whole count.
func (l *Limiter) unknownInWindow(c Check, key string, now time.Time) bool {
	if c.Tolerance > 0 || c.Global || c.Limit.Algorithm.Spec().Held {
		return false
	}
	alone := c.Nodes <= 1 // no other node counts the key
	if alone && l.ledger.knows(key, now) {
		return false // its last answer is the store's whole count
	}
	b := l.breakers.get(l.store.Shard(c.Limit))
	last := b.answered.Load()
	if last == 0 {
		if alone {
			return false
		}
		last = l.started.UnixNano()
	}
	if now.Sub(time.Unix(0, last)) < silentFor(c.Limit) {
		return true
	}
	return !alone && !l.downThroughWindow(b, c.Limit, now)
}

// downThroughWindow reports whether the shard behind b is down for this
// node now and has been through lim's window, which is what makes the
// shares of floor(limit/N) safe: a store that answered nobody in the
// window counted nothing in it. Not having been answered is not enough:
// a node whose breaker stayed open while the store came back, or that
// sent the shard nothing for a while, has no answer and no recent failure
// either, while the other nodes count on the store. So the shard must
// have failed this node since a window ago (its first failure after its
// last answer), and again within a store deadline (and a breaker
// cooldown, the probes' pace, if that is shorter). When that last failure
// is older, the breaker's probe goes now rather than at the end of its
// cooldown (once: a probe in flight is not doubled), and the check gets no
// share until it fails again: a store that is back closes the breaker
// instead, and its count decides.
func (l *Limiter) downThroughWindow(b *breaker, lim Limit, now time.Time) bool {
	down := b.downSince.Load()
	if down == 0 || down < b.answered.Load() || now.Sub(time.Unix(0, down)) < silentFor(lim) {
		return false
	}
	if now.Sub(time.Unix(0, b.failedAt.Load())) <= min(l.cfg.Timeout, l.cfg.BreakerCooldown) {
		return true
	}
	if b.probeEarly() {
		l.probe(b, lim)
	}
	return false
}

// silentFor is how long a store must not have answered for it to have
// counted nothing that still weighs on lim's window: a window, and two for
// a sliding window, whose estimate weighs the fixed window before the
// current one.
func silentFor(lim Limit) time.Duration {
	if lim.Algorithm == limit.SlidingWindow {
		return 2 * lim.Window
	}
	return lim.Window
}

// answerUntil is until when the store's answer d for lim, to a call sent
// at sent, speaks for the key's window: a window later (every algorithm
// has forgotten what it had counted then), and for a fixed window no
// later than its reset (the next window starts from nothing, and the
// answer says nothing of what is counted in it). The reset is counted
// from when the call was sent, no later than the store ran it.
func answerUntil(lim Limit, d Decision, sent time.Time) time.Time {
	until := sent.Add(lim.Window)
	if lim.Algorithm == limit.FixedWindow && d.ResetAfter > 0 {
		until = minTime(until, sent.Add(d.ResetAfter))
	}
	return until
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// remember caches a store's denial of a cacheable check: the key is denied
// locally until the time a retry could fit, counted from when the call was
// sent (the store's clock read no earlier), so the cache never denies what
// the store would allow.
// need is the cost the store computed the retry time for.
func (l *Limiter) remember(c Check, d Decision, need int64, sent time.Time, gen uint64) {
	if d.Allowed || c.Shadow || c.Limit.Algorithm.Spec().Held || d.RetryAfter <= 0 {
		return
	}
	l.cache.put(c.Limit, need, d, sent, gen)
}

// awaitJoined decides the checks that joined another request's call (now:
// when they joined), each by its batch or, past its wait, by the fallback.
func (l *Limiter) awaitJoined(ctx context.Context, joined []pending, outs []Decision, now time.Time) error {
	var first error
	for _, p := range joined {
		if werr := l.waitJoined(ctx, p, now); werr != nil {
			o, err := l.degrade(p.check, werr)
			if err != nil {
				first = cmpErr(first, err)
				continue
			}
			outs[p.i] = o
			continue
		}
		outs[p.i] = p.item.out
	}
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// sharedDeadline hands the calls that start within the same millisecond
// (a sixteenth of Timeout, if that is shorter) one context with the store
// deadline: a timer per millisecond instead of one per call. A call's
// deadline is then at most that share shorter than Timeout.
type sharedDeadline struct {
	timeout time.Duration
	cur     atomic.Pointer[deadlineCtx]
}

type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // never called early: the timer ends it
	from   int64              // unix ns it was made
}

func (d *sharedDeadline) get() context.Context {
	now := time.Now()
	n := now.UnixNano()
	share := min(int64(time.Millisecond), int64(d.timeout/16))
	if c := d.cur.Load(); c != nil && n >= c.from && n-c.from < share {
		return c.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(d.timeout))
	d.cur.Store(&deadlineCtx{ctx: ctx, cancel: cancel, from: n})
	return ctx
}

// takeErrs is a TakeError's per-request errors (nil for any other error).
func takeErrs(err error) []error {
	if err == nil {
		return nil
	}
	var te *TakeError
	if errors.As(err, &te) {
		return te.Errs
	}
	return nil
}
