package limiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Leased checks (Check.Tolerance > 0): the edge decides locally from an
// allowance it carves from the store in batches, instead of asking the store
// for every request. docs/guarantees.md ("Leased rules") states the
// invariant; in short:
//
//   - Carving is the algorithm's own atomic take with need 1: the script
//     admits up to the batch asked for, never more than fits, so what all
//     edges together hold and spend is bounded by what the store admitted,
//     whatever the number of edges or the attack rate.
//   - fixed_window carves from the quota grown by the tolerance,
//     limit + floor(limit × tolerance): an allowance is spent only within the
//     window it was carved in (it expires before the window ends), so at most
//     that many are admitted per window. The extra pays for the allowance
//     other edges hold unspent: an edge holds at most
//     floor(limit × tolerance / nodes) beyond the request it carves for, so
//     a client asking for no more than the limit is not denied because its
//     quota sits on another edge. Unspent allowance goes back to the window
//     when the edge stops using the key, and when the limiter closes.
//   - token_bucket carves tokens at the rule's own rate from a capacity
//     grown the same way, capacity + floor(capacity × tolerance) (the extra
//     pays for tokens held unspent, as above), and an allowance is spent
//     within H = tolerance × window of its carving, so any window admits at
//     most (capacity + limit) × (1 + tolerance): the exact bound grown by the
//     tolerance. Unspent tokens expire with H; they are not given back (a
//     GCRA state that has since caught up with the clock would credit them
//     twice).
//   - The store unreachable: what the edge holds is spent first (the store
//     counted it), then the check is decided like an exact one (fail mode;
//     the fallback enforces the carving limit / nodes).
//   - A busy key's next batch is carved ahead, by the check that leaves half
//     a batch or less, after its own decision: the key's lock is not held
//     during the call, so the other checks keep spending what is held
//     instead of queueing behind a round trip (the cost that took leased
//     rules below 0.9 of an edge without rules). What the edge holds, the
//     batch in flight included, stays within the bound above; a token_bucket
//     batch carved ahead keeps its own H, apart from the units before it.
//
// The sliding log and the sliding window counter are not leased: a unit
// carved now and spent later would be counted at the carving time, which
// for the log moves when it ages out (and min_interval could not be kept),
// and for the counter weighs it into the wrong window; neither is proved
// here. Concurrency holds a slot per request in flight, not a rate: there is
// nothing to spend ahead. leaky_bucket is not leased either (not tested).

// Leasable reports whether checks on an algorithm may be leased.
func Leasable(a Algorithm) bool { sp := a.Spec(); return sp != nil && sp.Leasable }

// leaseProblem reports why c cannot be leased; nil for an exact check.
func (c Check) leaseProblem() error {
	switch {
	case c.Tolerance == 0:
		return nil
	case !Leasable(c.Limit.Algorithm):
		return fmt.Errorf("%w: %s cannot be leased (fixed_window and token_bucket can)", ErrInvalidRequest, c.Limit.Algorithm)
	case !(c.Tolerance >= limit.MinTolerance && c.Tolerance <= limit.MaxTolerance):
		return fmt.Errorf("%w: tolerance must be in [%g, %g] (got %g)", ErrInvalidRequest, limit.MinTolerance, limit.MaxTolerance, c.Tolerance)
	}
	return nil
}

// carveLimit is the limit allowances of c are carved from: the quota
// (fixed_window) or the capacity (token_bucket) grown by the tolerance.
func carveLimit(c Check) Limit {
	l := c.Limit
	grow := func(n int64) int64 { return min(limit.MaxLimit, n+int64(math.Floor(float64(n)*c.Tolerance))) }
	switch l.Algorithm {
	case limit.FixedWindow:
		l.Limit = grow(l.Limit)
	case limit.TokenBucket:
		l.Burst = grow(l.Capacity())
	}
	return l
}

// leaseTerms are how one check's allowances are sized and kept.
type leaseTerms struct {
	// hold bounds how long a carved unit may be spent (token_bucket: H);
	// fixed_window units expire with their window instead.
	hold time.Duration
	// period is how long one batch should last: the adaptive size aims at
	// one carve per period for the key's rate on this edge.
	period time.Duration
	// most is the largest batch carved beyond the request's own cost.
	most int64
}

func termsOf(c Check) leaseTerms {
	w := c.Limit.Window
	hold := w
	if c.Limit.Algorithm == limit.TokenBucket {
		hold = max(time.Millisecond, time.Duration(float64(w)*c.Tolerance).Truncate(time.Millisecond))
	}
	nodes := int64(max(c.Nodes, 1))
	return leaseTerms{
		hold:   hold,
		period: min(max(hold/4, minLeasePeriod), maxLeasePeriod),
		most:   max(1, int64(math.Floor(float64(c.Limit.Capacity())*c.Tolerance))/nodes),
	}
}

const (
	minLeasePeriod = 5 * time.Millisecond
	maxLeasePeriod = time.Second
	// sweepEvery is how often idle allowances are looked for.
	sweepEvery = 100 * time.Millisecond
)

// allowance is what one edge holds of one key.
type allowance struct {
	mu    sync.Mutex
	units int64 // carved, not yet spent
	// expires: units may be spent before it only (local clock, measured
	// from before the carving call was sent, so never later than the
	// store's own end of the window or hold).
	expires time.Time
	// next and nextExpires are a token_bucket batch carved ahead while
	// units of the one before were left: kept apart, with its own end, and
	// spent once those run out or expire.
	next        int64
	nextExpires time.Time
	// carving is closed when the carve in flight lands (nil: none is):
	// checks that find too little wait for it instead of calling too.
	carving chan struct{}
	// short: the last carve ahead got less than it asked for (the quota
	// is nearly spent): no more carving ahead until a carve for a check.
	short bool
	// epoch changes whenever units are dropped or given back: a refund of
	// units spent in an earlier epoch is not put back.
	epoch uint64
	from  Lease     // the store's lease of the units (fixed_window: its window)
	reset time.Time // when the store said the key is back to full
	left  int64     // the store's remaining at the last carve
	size  int64     // the next batch beyond the request's cost
	terms leaseTerms
	// lim is the check's limit the units were carved for: a check of the
	// same key with another limit (the behaviour layer tightens one
	// client's) starts afresh rather than spend what a larger one carved.
	lim Limit
	// carved and used: the last carve, the last spend.
	carved, used time.Time
}

// allowances holds the edge's allowances, bounded: past max keys, checks
// of new keys are decided exactly.
type allowances struct {
	mu            sync.Mutex
	m             map[string]*allowance
	max           int
	start, closed sync.Once
	stop          chan struct{}
	// ahead: a check that leaves half a batch or less carves the next one
	// (off only in tests that count carves made for checks).
	ahead bool
}

func newAllowances(size int) *allowances {
	return &allowances{m: map[string]*allowance{}, max: size, stop: make(chan struct{}), ahead: true}
}

func (as *allowances) get(key string) *allowance {
	as.mu.Lock()
	defer as.mu.Unlock()
	a, ok := as.m[key]
	if !ok {
		if len(as.m) >= as.max {
			return nil
		}
		a = &allowance{}
		as.m[key] = a
	}
	return a
}

// decideLeased answers leased checks from the edge's allowances, carving a
// new batch when one runs short. now is when Decide began.
func (l *Limiter) decideLeased(ctx context.Context, leased []pending, outs []Outcome, now time.Time) error {
	for _, p := range leased {
		a := l.allowances.get(p.key)
		if a == nil {
			// The table is full: decide this check exactly, against the
			// rule's own limit on the same key (stricter than carving).
			o, err := l.exact(ctx, p, now)
			if err != nil {
				return err
			}
			outs[p.i] = o
			continue
		}
		l.allowances.start.Do(l.startSweep)
		o, err := l.spend(ctx, a, p, now)
		if err != nil {
			return err
		}
		outs[p.i] = o
	}
	return nil
}

func (l *Limiter) startSweep() {
	select {
	case <-l.allowances.stop: // closed
	default:
		l.bg.Go(l.sweep)
	}
}

// exact decides one leased check as an exact one.
func (l *Limiter) exact(ctx context.Context, p pending, now time.Time) (Outcome, error) {
	p.check.Tolerance = 0
	outs := make([]Outcome, p.i+1)
	p.alone = true
	if err := l.lead(ctx, []pending{p}, outs, now); err != nil {
		return Outcome{}, err
	}
	return outs[p.i], nil
}

// spend takes the check's cost from a. With too little held it waits for
// the carve in flight, or carves itself (carveFor); a check that leaves
// half a batch or less carves the next batch after its own decision
// (carveAhead), so the checks after it find units instead of waiting for
// the store.
func (l *Limiter) spend(ctx context.Context, a *allowance, p pending, now time.Time) (Outcome, error) {
	c := p.check
	a.mu.Lock()
	for {
		a.refresh(c, now)
		if a.units >= c.Cost {
			o := a.take(c, now, SourceLease)
			ahead := l.allowances.ahead && a.wantsAhead()
			var landed chan struct{}
			if ahead {
				landed = make(chan struct{})
				a.carving = landed
			}
			a.mu.Unlock()
			l.metrics.record(SourceLease, 1)
			if ahead {
				l.carveAhead(ctx, a, p, now, landed)
			}
			return o, nil
		}
		if a.carving == nil {
			return l.carveFor(ctx, a, p, now) // unlocks a
		}
		landed := a.carving
		a.mu.Unlock()
		<-landed // bounded by the store's deadline
		a.mu.Lock()
	}
}

// refresh drops what a holds that c may not spend: units of another
// limit, expired units; a batch carved ahead takes over from units too few
// for c or expired.
func (a *allowance) refresh(c Check, now time.Time) {
	if a.lim != c.Limit {
		a.drop()
		a.lim = c.Limit
		return
	}
	if a.next > 0 && (a.units < c.Cost || a.expired(now)) {
		// A remainder smaller than the cost is dropped with its epoch.
		a.units, a.expires = a.next, a.nextExpires
		a.next, a.nextExpires = 0, time.Time{}
		a.epoch++
	}
	if a.expired(now) {
		a.drop()
	}
}

func (a *allowance) expired(now time.Time) bool {
	return !a.expires.IsZero() && !now.Before(a.expires)
}

// take spends c's cost from a's units (a holds enough).
func (a *allowance) take(c Check, now time.Time, source Source) Outcome {
	a.units -= c.Cost
	a.used = now
	return Outcome{
		Decision: Decision{
			Admitted:   c.Cost,
			Allowed:    true,
			Limit:      c.Limit.Limit,
			Remaining:  min(c.Limit.Limit, a.left+a.units+a.next),
			ResetAfter: max(0, roundUpMs(a.reset.Sub(now))),
			Lease:      Lease{Limit: c.Limit, Units: c.Cost},
		},
		Source: source,
		allow:  a,
		epoch:  a.epoch,
	}
}

// wantsAhead says whether the next batch should be carved now: a busy key
// (batches of more than one) holding half a batch or less, with no batch
// carved ahead already, no carve in flight, and the quota not short.
func (a *allowance) wantsAhead() bool {
	return a.carving == nil && !a.short && a.next == 0 && a.size > 1 && a.units <= a.size/2
}

// carveFor carves for a check that a cannot pay (a locked; unlocked on
// return), and decides the check from what the carve brought.
func (l *Limiter) carveFor(ctx context.Context, a *allowance, p pending, now time.Time) (Outcome, error) {
	c := p.check
	a.terms = termsOf(c)
	a.grow(now)
	want := c.Cost - a.units + a.size
	landed := make(chan struct{})
	a.carving = landed
	a.mu.Unlock()
	carve := carveLimit(c)
	gen := l.cache.generation()
	ds, errs := l.call(ctx, []Request{{Limit: carve, Cost: want, Need: 1}}, []string{p.key}, now)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.carving = nil
	close(landed)
	if errs[0] != nil {
		// What a held is spent (the store counted it); past it the
		// check is decided like an exact one, on the carving limit.
		o, err := l.degrade(Check{Limit: carve, Cost: c.Cost, Shadow: c.Shadow, Nodes: c.Nodes}, errs[0])
		o.Decision.Limit = c.Limit.Limit
		return o, err
	}
	d := ds[0]
	a.short = d.Admitted < want
	a.land(c, d, now, false)
	l.metrics.leaseCarves.Inc()
	l.metrics.leaseCarved.Add(float64(d.Admitted))
	if a.units < c.Cost {
		l.metrics.record(SourceStore, 1)
		d.Limit = c.Limit.Limit
		d.Remaining = min(c.Limit.Limit, a.units)
		d.Admitted, d.Allowed = 0, false
		d.Lease = Lease{Limit: carve}
		l.remember(c, d, 1, now, gen)
		return Outcome{Decision: d, Source: SourceStore}, nil
	}
	l.metrics.record(SourceStore, 1)
	return a.take(c, now, SourceStore), nil
}

// carveAhead carves a's next batch after a check was decided from units
// held; a.carving is landed, closed when the carve lands. A failed carve
// is not an error of the check: the next check short of units carves
// again (and is decided by the fail mode if that fails too).
func (l *Limiter) carveAhead(ctx context.Context, a *allowance, p pending, now time.Time, landed chan struct{}) {
	c := p.check
	a.mu.Lock()
	a.terms = termsOf(c)
	a.grow(now)
	// A whole batch (one carve a period, as when carving at need), within
	// the most an edge may hold.
	want := min(a.size, a.terms.most-a.units-a.next)
	a.mu.Unlock()
	var ds []Decision
	var errs []error
	if want > 0 {
		ds, errs = l.call(ctx, []Request{{Limit: carveLimit(c), Cost: want, Need: 1}}, []string{p.key}, now)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.carving = nil
	close(landed)
	if want <= 0 || errs[0] != nil || a.lim != c.Limit {
		return // nothing asked, the store failed, or another limit took over
	}
	d := ds[0]
	a.short = d.Admitted < want
	a.land(c, d, now, true)
	l.metrics.leaseCarves.Inc()
	l.metrics.leaseCarved.Add(float64(d.Admitted))
}

// land adds what a carve sent at now brought to a. Units carved ahead of a
// token_bucket batch still held wait apart (they end later); fixed_window
// units of one window end together.
func (a *allowance) land(c Check, d Decision, now time.Time, ahead bool) {
	a.carved = now
	a.left, a.reset = d.Remaining, now.Add(d.ResetAfter)
	if d.Admitted <= 0 {
		return
	}
	if d.Lease.state != a.from.state {
		// Another window (fixed_window): the old one's units end
		// with it, and so do refunds of units spent from them.
		a.drop()
	}
	expires := now.Add(a.terms.hold)
	if c.Limit.Algorithm == limit.FixedWindow {
		// The script's reset is whole milliseconds, rounded up.
		expires = now.Add(d.ResetAfter - time.Millisecond)
	}
	a.from = d.Lease
	if ahead && a.units > 0 && c.Limit.Algorithm != limit.FixedWindow {
		a.next, a.nextExpires = d.Admitted, expires
		return
	}
	if a.units == 0 || expires.Before(a.expires) {
		// Units left from an earlier batch keep their own end:
		// the batches end together, at the earlier one.
		a.expires = expires
	}
	a.units += d.Admitted
}

// grow sizes the next batch from how soon the last one ran out: twice as
// large when it lasted less than half a period, half when more than two,
// so a quiet edge holds little and a busy one calls about once a period.
func (a *allowance) grow(now time.Time) {
	gap := now.Sub(a.carved)
	switch {
	case a.carved.IsZero() || a.size < 1:
		a.size = 1
	case gap < a.terms.period/2:
		a.size *= 2
	case gap > 2*a.terms.period:
		a.size /= 2
	}
	a.size = min(max(a.size, 1), a.terms.most)
}

// drop forgets the units a holds (expired, or given back): a refund of a
// unit spent before is not put back either.
func (a *allowance) drop() {
	a.units, a.next = 0, 0
	a.expires, a.nextExpires = time.Time{}, time.Time{}
	a.epoch++
}

// putBack returns units a request took but did not use (another check of
// the request denied), unless they were dropped meanwhile.
func (a *allowance) putBack(units int64, epoch uint64) {
	a.mu.Lock()
	if a.epoch == epoch {
		a.units += units
	}
	a.mu.Unlock()
}

// sweep gives back idle allowances until the limiter closes.
func (l *Limiter) sweep() {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-l.allowances.stop:
			return
		case <-t.C:
			l.ReturnIdle(l.now())
		}
	}
}

// ReturnIdle gives back what the edge holds of keys it has not used for two
// periods (fixed_window: to the window they were carved from; token_bucket
// allowances expire instead) and forgets those keys, so a quiet key costs
// nothing and the next batch starts small. The limiter calls it every
// 100 ms once a leased check was decided.
func (l *Limiter) ReturnIdle(now time.Time) {
	l.returnWhere(now, func(a *allowance) (give, forget bool) {
		last := a.used
		if a.carved.After(last) {
			last = a.carved
		}
		idle := now.Sub(last) >= 2*a.terms.period
		return idle || a.expired(now), idle
	})
}

// returnAll gives back everything the edge holds (Close).
func (l *Limiter) returnAll() {
	l.returnWhere(l.now(), func(*allowance) (bool, bool) { return true, true })
}

// returnWhere gives back the units of the allowances pick chooses, tells
// the store, and forgets the keys pick says to once they hold nothing.
// Allowances in use (locked, or with a carve in flight) are left for the
// next sweep.
func (l *Limiter) returnWhere(now time.Time, pick func(*allowance) (give, forget bool)) {
	keys, all := l.allowances.snapshot()
	var back []Lease
	var gone []string
	for i, a := range all {
		if !a.mu.TryLock() {
			continue
		}
		if a.carving == nil {
			give, forget := pick(a)
			if ls, ok := a.giveUp(give, now); ok {
				back = append(back, ls)
			}
			if forget && a.units == 0 {
				gone = append(gone, keys[i])
			}
		}
		a.mu.Unlock()
	}
	l.allowances.forget(gone)
	if len(back) == 0 {
		return
	}
	var units int64
	for _, ls := range back {
		units += ls.Units
	}
	l.metrics.leaseReturned.Add(float64(units))
	if err := l.giveBack(l.store, back); err != nil {
		l.log.Warn("giving back leased allowance failed", "keys", len(back), "err", err)
	}
}

// snapshot lists the keys and allowances held, so that they are visited
// without the table's lock.
func (as *allowances) snapshot() ([]string, []*allowance) {
	as.mu.Lock()
	defer as.mu.Unlock()
	keys := make([]string, 0, len(as.m))
	all := make([]*allowance, 0, len(as.m))
	for k, a := range as.m {
		keys, all = append(keys, k), append(all, a)
	}
	return keys, all
}

// giveUp drops what a holds when give is set (a locked); ok says the units
// go back to the store: fixed_window units whose window is still open.
func (a *allowance) giveUp(give bool, now time.Time) (ls Lease, ok bool) {
	if !give || a.units+a.next <= 0 {
		return Lease{}, false
	}
	if a.from.Limit.Algorithm == limit.FixedWindow && now.Before(a.expires) {
		ls, ok = a.from, true
		ls.Units = a.units
	}
	a.drop()
	a.size = 1 // the key went quiet here: start small again
	return ls, ok
}

// forget deletes the keys whose allowances still hold nothing.
func (as *allowances) forget(keys []string) {
	if len(keys) == 0 {
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, k := range keys {
		if a := as.m[k]; a != nil && a.mu.TryLock() {
			if a.units == 0 && a.carving == nil {
				delete(as.m, k)
			}
			a.mu.Unlock()
		}
	}
}

// closeAllowances stops the sweep and gives back what the edge holds.
func (l *Limiter) closeAllowances() {
	l.allowances.closed.Do(func() {
		close(l.allowances.stop)
		l.returnAll()
	})
}
