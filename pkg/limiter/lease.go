package limiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
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
	// gone: taken out of the table (forget); a spender that found it
	// just before looks it up again.
	gone bool
	// ahead is closed when the batch being carved ahead (carveAhead) has
	// landed; nil when none is under way. aheadAfter: none is carved
	// ahead before it (the last one failed).
	ahead      chan struct{}
	aheadAfter time.Time
	// aheadErr is why the last batch carved ahead failed (nil: it
	// landed).
	aheadErr error
}

// allowances holds the edge's allowances, bounded: past max keys, checks
// of new keys are decided exactly. Finding a key's allowance takes no lock
// (every leased decision does it; a hot key's requests on every core would
// otherwise queue on one table lock).
type allowances struct {
	m             sync.Map // memKey → *allowance
	n             atomic.Int64
	max           int64
	start, closed sync.Once
	stop          chan struct{}
	// inline: every batch is carved by the request short of units (tests
	// of the batch sizes; never set otherwise).
	inline bool
}

func newAllowances(size int) *allowances {
	return &allowances{max: int64(size), stop: make(chan struct{})}
}

// held returns key's allowance, locked (nil when the table is full): never
// one forget has taken out of the table meanwhile.
func (as *allowances) held(key string) *allowance {
	for {
		a := as.get(key)
		if a == nil {
			return nil
		}
		a.mu.Lock()
		if !a.gone {
			return a
		}
		a.mu.Unlock()
	}
}

func (as *allowances) get(key string) *allowance {
	if a, ok := as.m.Load(key); ok {
		return a.(*allowance)
	}
	if as.n.Add(1) > as.max {
		as.n.Add(-1)
		return nil
	}
	a, loaded := as.m.LoadOrStore(key, &allowance{})
	if loaded {
		as.n.Add(-1)
	}
	return a.(*allowance)
}

// decideLeased answers leased checks from the edge's allowances, carving a
// new batch when one runs short. now is when Decide began.
func (l *Limiter) decideLeased(ctx context.Context, leased []pending, outs []Decision, now time.Time) error {
	for _, p := range leased {
		a := l.allowances.held(p.key)
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
		l.allowances.start.Do(func() {
			select {
			case <-l.allowances.stop: // closed
			default:
				l.bg.Go(l.sweep)
			}
		})
		o, err := l.spend(ctx, a, p, now)
		a.mu.Unlock()
		if err != nil {
			return err
		}
		outs[p.i] = o
	}
	return nil
}

// exact decides one leased check as an exact one.
func (l *Limiter) exact(ctx context.Context, p pending, now time.Time) (Decision, error) {
	p.check.Tolerance = 0
	outs := make([]Decision, p.i+1)
	p.alone = true
	if err := l.lead(ctx, []pending{p}, outs, now); err != nil {
		return Decision{}, err
	}
	return outs[p.i], nil
}

// spend takes the check's cost from a, carving first when a holds too
// little. Called with a locked.
func (l *Limiter) spend(ctx context.Context, a *allowance, p pending, now time.Time) (Decision, error) {
	c := p.check
	a.fit(c.Limit, now)
	source := SourceLease
	// Short of units while a batch is carved ahead: wait for it (and for
	// the next, should another spender have started one meanwhile) rather
	// than carve beside it.
	waited := false
	for wait := time.Duration(0); a.units < c.Cost && a.ahead != nil && wait < l.cfg.Timeout; {
		waited = true
		wait += l.awaitAhead(ctx, a, l.cfg.Timeout-wait)
		a.fit(c.Limit, now)
	}
	if a.units < c.Cost && waited && (a.ahead != nil || a.aheadErr != nil) {
		// The batch carved ahead failed or did not land within the
		// store's timeout: a carve of this request's own would wait as
		// long again. Decided as a failed carve is.
		cause := a.aheadErr
		if cause == nil {
			cause = fmt.Errorf("%w: the batch carved ahead did not land within %s", errGaveUp, l.cfg.Timeout)
		}
		return l.carveFailed(c, cause)
	}
	if a.units < c.Cost {
		d, decided, err := l.carve(ctx, a, p, now)
		if decided || err != nil {
			return d, err
		}
		source = SourceStore
	}
	a.units -= c.Cost
	a.used = now
	l.metrics.record(source, 1)
	l.carveAhead(a, p, now)
	return Decision{
		Admitted:   c.Cost,
		Allowed:    true,
		Limit:      c.Limit.Limit,
		Remaining:  min(c.Limit.Limit, a.left+a.units),
		ResetAfter: max(0, roundUpMs(a.reset.Sub(now))),
		Lease:      Lease{Limit: c.Limit, Units: c.Cost},
		Source:     source,
		allow:      a,
		epoch:      a.epoch,
	}, nil
}

// carve asks the store for a's next batch, enough for the check's cost. It
// reports decided when the check is decided without a's units: the store
// failed (the fail mode decides it), or the batch is still too small
// (denied). Called with a locked.
func (l *Limiter) carve(ctx context.Context, a *allowance, p pending, now time.Time) (d Decision, decided bool, err error) {
	c := p.check
	a.terms = termsOf(c)
	a.grow(now)
	want := c.Cost - a.units + a.size
	carve := carveLimit(c)
	gen := l.cache.generation()
	ds, errs := l.call(ctx, []Request{{Limit: carve, Cost: want, Need: 1}}, []string{p.key}, now, p.rider)
	if errs[0] != nil {
		o, err := l.carveFailed(c, errs[0])
		return o, true, err
	}
	d = ds[0]
	a.carved = now
	a.left, a.reset = d.Remaining, now.Add(d.ResetAfter)
	if d.Admitted > 0 {
		a.add(d, c, now)
	}
	l.metrics.leaseCarves.Inc()
	l.metrics.leaseCarved.Add(float64(d.Admitted))
	if a.units >= c.Cost {
		return Decision{}, false, nil
	}
	l.metrics.record(SourceStore, 1)
	d.Limit = c.Limit.Limit
	d.Remaining = min(c.Limit.Limit, a.units)
	d.Admitted, d.Allowed = 0, false
	d.Lease = Lease{Limit: carve}
	l.remember(c, d, 1, now, gen)
	return d.from(SourceStore, nil), true, nil
}

// carveAhead starts carving a's next batch in the background when a busy
// key's allowance is down to a quarter of a batch, so its requests find units
// waiting instead of one of them carving on its own time (and the others
// queueing behind it). A key is busy when its last batch was carved less
// than a period ago; a quiet key's next request carves for itself, as it
// would give back what was carved ahead. What a holds with the new batch
// stays within terms.most. Called with a locked.
func (l *Limiter) carveAhead(a *allowance, p pending, now time.Time) {
	if a.ahead != nil || a.units > a.size/4 || now.Before(a.aheadAfter) || l.allowances.inline {
		return
	}
	c := p.check
	a.terms = termsOf(c)
	if now.Sub(a.carved) >= a.terms.period {
		return
	}
	select {
	case <-l.allowances.stop: // closing
		return
	default:
	}
	a.grow(now)
	want := min(a.size, a.terms.most-a.units)
	if want < 1 {
		return
	}
	l.startAhead(a, c, p.key, want)
}

// startAhead carves want units for a in the background (carveAhead; its
// own function, so that what the goroutine holds is allocated only when
// one starts). Called with a locked.
func (l *Limiter) startAhead(a *allowance, c Check, key string, want int64) {
	done := make(chan struct{})
	a.ahead = done
	req := Request{Limit: carveLimit(c), Cost: want, Need: 1}
	l.bg.Go(func() {
		defer close(done)
		sent := l.now()
		ds, errs := l.call(context.Background(), []Request{req}, []string{key}, sent, nil)
		a.mu.Lock()
		defer a.mu.Unlock()
		a.ahead, a.aheadErr = nil, errs[0]
		if errs[0] != nil {
			// Requests waiting for it meet the fail mode; the next
			// request short of units carves for itself; none is carved
			// ahead for a period.
			a.aheadAfter = sent.Add(a.terms.period)
			return
		}
		d := ds[0]
		l.metrics.leaseCarves.Inc()
		l.metrics.leaseCarved.Add(float64(d.Admitted))
		a.carved = sent
		a.left, a.reset = d.Remaining, sent.Add(d.ResetAfter)
		if d.Admitted == 0 {
			return
		}
		if a.lim != c.Limit {
			// The key's limit changed meanwhile: these units belong to
			// the old one's carving (a fixed window's go back to it).
			d.Lease.Units = d.Admitted
			if d.Lease.Limit.Algorithm == limit.FixedWindow {
				l.returnLeased([]Lease{d.Lease})
			}
			return
		}
		// Units to spend: a denial this edge cached meanwhile (another
		// request's carve found the store exhausted) no longer holds.
		l.cache.drop(c.Limit)
		a.add(d, c, sent)
	})
}

// awaitAhead waits, with a unlocked, for the batch being carved ahead to
// land, at most most; it returns how long it waited (most when ctx ended).
// Called with a locked; returns so.
func (l *Limiter) awaitAhead(ctx context.Context, a *allowance, most time.Duration) time.Duration {
	done := a.ahead
	a.mu.Unlock()
	start := time.Now()
	t := time.NewTimer(most)
	waited := most
	select {
	case <-done:
		waited = time.Since(start)
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()
	a.mu.Lock()
	return waited
}

// carveFailed decides c when carving for it failed: what the allowance
// held is spent (the store counted it); past it the check is decided like
// an exact one, on the carving limit.
func (l *Limiter) carveFailed(c Check, cause error) (Decision, error) {
	o, err := l.degrade(Check{Limit: carveLimit(c), Cost: c.Cost, Shadow: c.Shadow, Nodes: c.Nodes, Tolerance: c.Tolerance, Global: c.Global}, cause)
	o.Limit = c.Limit.Limit
	return o, err
}

// fit drops what a holds when it expired by now or was carved for another
// limit than lim, and keeps lim. Called with a locked.
func (a *allowance) fit(lim Limit, now time.Time) {
	if !a.expires.IsZero() && !now.Before(a.expires) || a.lim != lim {
		a.drop()
		a.lim = lim
	}
}

// add puts a carved batch d into a. Called with a locked.
func (a *allowance) add(d Decision, c Check, now time.Time) {
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
	if a.units == 0 || expires.Before(a.expires) {
		// Units left from an earlier batch keep their own end:
		// the batches end together, at the earlier one.
		a.expires = expires
	}
	a.units += d.Admitted
	a.from = d.Lease
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
	a.units = 0
	a.expires = time.Time{}
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
		return idle || !a.expires.IsZero() && !now.Before(a.expires), idle
	})
}

// returnAll gives back everything the edge holds (Close).
func (l *Limiter) returnAll() {
	l.returnWhere(l.now(), func(*allowance) (bool, bool) { return true, true })
}

// returnWhere gives back the units of the allowances pick says to give
// (give), and forgets those it says to forget once they hold none. An
// allowance being carved is in use: it is left alone.
func (l *Limiter) returnWhere(now time.Time, pick func(*allowance) (give, forget bool)) {
	keys, all := l.allowances.list()
	var back []Lease
	var gone []string
	for i, a := range all {
		if !a.mu.TryLock() { // carving: in use
			continue
		}
		give, forget := pick(a)
		if give && a.units > 0 {
			if ls, ok := a.giveUp(now); ok {
				back = append(back, ls)
			}
		}
		if forget && a.units == 0 {
			gone = append(gone, keys[i])
		}
		a.mu.Unlock()
	}
	l.allowances.forget(gone)
	l.returnLeased(back)
}

// list is every allowance and its key.
func (as *allowances) list() ([]string, []*allowance) {
	n := as.n.Load()
	keys, all := make([]string, 0, n), make([]*allowance, 0, n)
	as.m.Range(func(k, a any) bool {
		keys, all = append(keys, k.(string)), append(all, a.(*allowance))
		return true
	})
	return keys, all
}

// giveUp drops a's units, and returns the lease that gives them back to
// the store: a fixed window's, while its window lasts (a token bucket's
// units expire instead). Called with a locked.
func (a *allowance) giveUp(now time.Time) (Lease, bool) {
	ls, ok := a.from, false
	if a.from.Limit.Algorithm == limit.FixedWindow && now.Before(a.expires) {
		ls.Units, ok = a.units, true
	}
	a.drop()
	a.size = 1 // the key went quiet here: start small again
	return ls, ok
}

// forget removes the keys whose allowances still hold nothing.
func (as *allowances) forget(keys []string) {
	for _, k := range keys {
		v, ok := as.m.Load(k)
		if !ok {
			continue
		}
		if a := v.(*allowance); a.mu.TryLock() {
			if a.units == 0 && a.ahead == nil && as.m.CompareAndDelete(k, a) {
				a.gone = true
				as.n.Add(-1)
			}
			a.mu.Unlock()
		}
	}
}

// returnLeased gives the leases back to the store.
func (l *Limiter) returnLeased(back []Lease) {
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

// closeAllowances stops the sweep and carving ahead, lets the batches
// under way land, and gives back what the edge holds.
func (l *Limiter) closeAllowances() {
	l.allowances.closed.Do(func() {
		close(l.allowances.stop)
		l.bg.Wait()
		l.returnAll()
	})
}
