package limiter

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Global checks (Check.Global): one quota counted across every region.
// docs/guarantees.md ("Global rules") states the invariant; in short:
//
//   - Each key has a home region, a rendezvous hash of the key over the
//     regions of the catalog (Home). The home's Redis holds the key's count
//     and nothing else does: every edge of every region is one holder that
//     carves allowance from it with the leased checks' own carve (the
//     algorithm's atomic take, need 1) and gives idle allowance back with
//     its refund. No second protocol.
//   - The home region's edges are leased edges of an ordinary leased check
//     on their own Redis (lease.go). The other regions' edges carve across
//     the link between regions, in the background only: a request is
//     decided from what the edge holds, from a small overdraft the next
//     carve pays for, or, when the home is unreachable, from the region's
//     static share floor(limit / regions), counted exactly in the region's
//     own Redis. A request never waits on another region.
//   - While the home answers, every unit admitted was carved from the
//     carve quota L + ⌊L·t/2⌋ or is overdraft, at most ⌊L·t/2⌋ unpaid over
//     all edges: admitted per window ≤ L·(1 + t). Cut off from the home, a
//     region admits at most its share beyond that.
//   - What a region admitted from its share, and overdraft, is debt of
//     the window it was admitted in (windows are aligned to the epoch, the
//     same at every store). The next carve from the home pays it first,
//     once (when the home comes back, the sweep carves for every key in
//     debt), with a take of its own bound to that window: the home runs it
//     only before the window ends on its own clock, else it takes nothing.
//     A debt is charged to its window or to none, never to a later one,
//     however late the carve lands; it is dropped when its window ends,
//     since the next window owes nothing for it.
//
// Only fixed_window is global (rules refuse the others): a unit carved is
// spent within the window it was carved in, which is what makes the
// overdraft and the share debts land in the right window.

// GlobalConfig tunes a Global. Zero values take the defaults.
type GlobalConfig struct {
	// Timeout bounds one call to another region's store (default 1 s).
	// Calls run in the background: it bounds how long a partition may go
	// unnoticed (the edge spends its allowance and overdraft meanwhile,
	// then denies), never a request.
	Timeout time.Duration
	// TableSize caps the keys whose allowance the edge holds from other
	// regions (default 100,000); checks of further keys are decided from
	// the static share.
	TableSize int
	// OnChange, if set, is called when a home region becomes unreachable
	// or reachable again (Unreachable says which are), on the goroutine
	// that noticed: it must not block.
	OnChange func()
}

func (c GlobalConfig) withDefaults() GlobalConfig {
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.TableSize <= 0 {
		c.TableSize = 100_000
	}
	return c
}

// Regions is the deployment as one edge sees it: its region, every
// region's name (the domain of the home hash) and the other regions'
// stores. Every edge of every region must be given the same Names (one
// catalog), or two regions may count a key at two homes.
type Regions struct {
	Local string
	Names []string
	// Stores are the other regions' stores, by name: a key homed in
	// Local is counted by the limiter's own store.
	Stores map[string]Store
}

// Home is key's home region among names: rendezvous hashing, so a region
// joining or leaving moves only the keys it wins or held.
func Home(names []string, key string) string {
	var best string
	var top uint64
	for _, n := range names {
		h := fnv.New64a()
		_, _ = h.Write([]byte(n))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(key))
		if s := mix(h.Sum64()); best == "" || s > top || s == top && n < best {
			best, top = n, s
		}
	}
	return best
}

// mix is splitmix64's finalizer: FNV's high bits alone vary too little
// between keys that differ in their last bytes.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Global holds what an edge leases from other regions for global checks.
// One per edge, shared by its Limiter (SetGlobal); Update gives it the
// regions, again whenever the catalog changes.
type Global struct {
	cfg   GlobalConfig
	log   *slog.Logger
	now   func() time.Time
	m     *globalMetrics
	state atomic.Pointer[globalState]

	mu    sync.Mutex
	table map[string]*away

	start, closed sync.Once
	stop          chan struct{}
	bg            sync.WaitGroup
}

type globalState struct {
	local string
	names []string
	homes map[string]*home // the other regions
}

// home is another region, as a home of keys.
type home struct {
	name string
	// lim asks the region's store under the Global's deadline; its
	// breaker never opens (down is this region's breaker).
	lim     *Limiter
	down    atomic.Bool
	probing atomic.Bool
	// warmed: the link was readied ahead of the first carve (warm).
	warmed atomic.Bool
	// returning: a give-back to this home is under way (in the
	// background); the sweep keeps the next ones until it ends.
	returning atomic.Bool
}

// away is an edge's allowance of a key homed in another region.
type away struct {
	allowance
	home  string
	check Check // the carving check (key, limit, tolerance, holders)
	// debt is what the edge admitted that no carve paid for yet:
	// overdraft, and decisions from the share while the home was
	// unreachable, all in the window that ends at debtUntil. It is
	// dropped then, and paid only before then (settle).
	debt      int64
	debtUntil time.Time
	refilling bool
	// exhausted: the home had nothing left; no carve, no overdraft until.
	exhausted time.Time
}

// NewGlobal builds a Global with no other region yet (every key homed
// here). reg may be nil.
func NewGlobal(cfg GlobalConfig, reg prometheus.Registerer, log *slog.Logger) (*Global, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newGlobalMetrics(reg)
	if err != nil {
		return nil, err
	}
	g := &Global{cfg: cfg.withDefaults(), log: log, now: time.Now, m: m, table: map[string]*away{}, stop: make(chan struct{})}
	g.state.Store(&globalState{})
	return g, nil
}

// Update gives the Global the deployment's regions. Allowance held from a
// region whose entry changed is given back first (its keys may have
// another home now). The stores stay the caller's to close, after Update
// returns.
func (g *Global) Update(r Regions) error {
	names := slices.Clone(r.Names)
	slices.Sort(names)
	names = slices.Compact(names)
	if r.Local == "" || !slices.Contains(names, r.Local) {
		return fmt.Errorf("global regions: this edge's region %q is not among %q", r.Local, names)
	}
	st := &globalState{local: r.Local, names: names, homes: map[string]*home{}}
	var errs []error
	for _, n := range names {
		if n == r.Local {
			continue
		}
		s := r.Stores[n]
		if s == nil {
			errs = append(errs, fmt.Errorf("global regions: no store for region %q", n))
			continue
		}
		lim, err := New(s, Config{StoreName: "global", Timeout: g.cfg.Timeout, BreakerFailures: math.MaxInt32}, nil, g.log)
		if err != nil {
			return err
		}
		st.homes[n] = &home{name: n, lim: lim}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	old := g.state.Swap(st)
	g.returnWhere(old, func(*away) bool { return true })
	for _, h := range old.homes {
		h.lim.Close()
		g.m.unreachable.DeleteLabelValues(h.name)
	}
	for _, h := range st.homes {
		g.m.unreachable.WithLabelValues(h.name).Set(0)
		// Each home's counters exist from the catalog on, at 0 until they
		// move (kept across catalog changes: a counter never restarts).
		g.m.carved.WithLabelValues(h.name)
		g.m.returned.WithLabelValues(h.name)
		g.m.settled.WithLabelValues(h.name)
		if w, ok := h.lim.store.(warmer); ok && g.running() {
			g.bg.Go(func() { g.warm(h, w) })
		}
	}
	g.start.Do(func() {
		select {
		case <-g.stop:
		default:
			g.bg.Go(g.sweep)
		}
	})
	return nil
}

// warmer is a store that can ready itself for its first calls
// (RedisStore.Warm).
type warmer interface {
	Warm(ctx context.Context, conns int) error
}

const (
	// warmFor bounds a warm-up, in the Global's deadlines: it takes about
	// ten round trips of the link, most one after another.
	warmFor = 10
	// warmConns is how many connections a warm-up readies in each pool:
	// a carve, and the clock reading sent beside the first (redisclock.go:
	// until an estimate is kept, which over a link slower than
	// clockMaxRTT none is).
	warmConns = 2
)

// probeLimit is what a probe of a home asks about (nothing is counted).
var probeLimit = Limit{Key: "g:probe", Algorithm: limit.FixedWindow, Limit: 1, Window: time.Second}

// warm readies the link to home h before its first carve, in the
// background. Cold, the first carve pays the dial, the greeting (HELLO,
// CLIENT SETINFO) and a NOSCRIPT before its own call: four round trips or
// more, while the edge admits on overdraft and then denies (at 20
// requests a second an edge, across 110 ms round trips, about 10
// requests: a whole overdraft at t = 0.1 and L = 400). Warmed, it pays
// one. A failure is logged and costs only that: the carve dials as
// before, and a home that does not answer is found by it.
func (g *Global) warm(h *home, w warmer) {
	ctx, cancel := context.WithTimeout(context.Background(), warmFor*g.cfg.Timeout)
	defer cancel()
	go func() {
		select {
		case <-g.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := w.Warm(ctx, warmConns); err != nil {
		// Unless the Global closed, or the catalog moved on (the old
		// store's client is closed under it).
		if g.running() && g.state.Load().homes[h.name] == h {
			g.log.Warn("global rules: could not ready the link to a home region; its first carve will dial", "region", h.name, "err", err)
		}
		return
	}
	h.warmed.Store(true)
}

// Warmed reports whether the link to region, a home of keys, was readied
// ahead of its first carve (Update warms each home's store in the
// background; false for a store that cannot be warmed, or not yet).
func (g *Global) Warmed(region string) bool {
	h := g.state.Load().homes[region]
	return h != nil && h.warmed.Load()
}

// Unreachable lists the regions this edge cannot reach as homes: their
// keys are decided from the static share until they answer again.
func (g *Global) Unreachable() []string {
	var out []string
	for n, h := range g.state.Load().homes {
		if h.down.Load() {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Close stops the sweep, gives back what the edge holds and waits for the
// calls under way.
func (g *Global) Close() {
	g.closed.Do(func() {
		close(g.stop)
		g.start.Do(func() {}) // no sweep after this
		g.bg.Wait()
		st := g.state.Load()
		g.returnWhere(st, func(*away) bool { return true })
		g.bg.Wait()
		for _, h := range st.homes {
			h.lim.Close()
		}
	})
}

// running reports whether background work may start.
func (g *Global) running() bool {
	select {
	case <-g.stop:
		return false
	default:
		return true
	}
}

// SetGlobal makes the limiter decide global checks with g (nil: a global
// check is decided as a leased check of this region).
func (l *Limiter) SetGlobal(g *Global) { l.global.Store(g) }

// globalProblem reports why c cannot be a global check.
func (c Check) globalProblem() error {
	switch {
	case !c.Global:
		return nil
	case c.Tolerance == 0:
		return fmt.Errorf("%w: a global check is leased: it needs a tolerance", ErrInvalidRequest)
	case c.Limit.Algorithm != limit.FixedWindow:
		return fmt.Errorf("%w: %s cannot be global (fixed_window can)", ErrInvalidRequest, c.Limit.Algorithm)
	}
	return nil
}

// carving is the check every holder of a global key carves with: the key
// in its own namespace, half the tolerance for allowance held unspent (the
// other half is the overdraft's), every edge of every region a holder.
func carving(c Check, regions int) Check {
	c.Limit.Key = "g:" + c.Limit.Key
	c.Tolerance /= 2
	c.Nodes = max(c.Nodes, 1) * max(regions, 1)
	return c
}

// overdraft is what one edge outside the key's home may admit before a
// carve pays for it: ⌊L·t/2⌋ shared by the edges of the other regions.
func overdraft(orig Check, regions int) int64 {
	others := int64(max(orig.Nodes, 1)) * int64(max(regions-1, 1))
	return int64(math.Floor(float64(orig.Limit.Limit)*orig.Tolerance/2)) / others
}

// decideGlobal answers global checks; now is when Decide began.
func (l *Limiter) decideGlobal(ctx context.Context, ps []pending, outs []Decision, now time.Time) error {
	g := l.global.Load()
	for _, p := range ps {
		orig := p.check
		st := &globalState{}
		if g != nil {
			st = g.state.Load()
		}
		c := carving(orig, len(st.names))
		p.check, p.key = c, memKey(c.Limit)
		h := Home(st.names, orig.Limit.Key)
		if g == nil || h == st.local || h == "" {
			// Homed here: a leased check on this region's store, with
			// its denials cached as a leased check's are.
			if !c.Shadow {
				if d, ok := l.cache.get(c.Limit, c.Cost, now); ok {
					d.Limit = orig.Limit.Limit
					outs[p.i] = d.from(SourcePrefilter, nil)
					l.metrics.prefilterHits.Inc()
					l.metrics.record(SourcePrefilter, 1)
					g.count(st.local, "home")
					continue
				}
			}
			if err := l.decideLeased(ctx, []pending{p}, outs, now); err != nil {
				return err
			}
			g.count(st.local, "home")
			continue
		}
		o, err := l.spendAway(ctx, g, st, st.homes[h], orig, p, now)
		if err != nil {
			return err
		}
		outs[p.i] = o
	}
	return nil
}

// count records a global decision (g may be nil: no regions known).
func (g *Global) count(home, from string) {
	if g != nil {
		g.m.decisions.WithLabelValues(home, from).Inc()
	}
}

// get returns key's allowance, nil when the table is full.
func (g *Global) get(key string, h *home, c Check) *away {
	g.mu.Lock()
	defer g.mu.Unlock()
	a, ok := g.table[key]
	if !ok {
		if len(g.table) >= g.cfg.TableSize {
			return nil
		}
		a = &away{home: h.name, check: c}
		g.table[key] = a
	}
	return a
}

// spendAway decides a check homed in another region without waiting on it.
func (l *Limiter) spendAway(ctx context.Context, g *Global, st *globalState, h *home, orig Check, p pending, now time.Time) (Decision, error) {
	c := p.check
	a := g.get(p.key, h, c)
	if a == nil {
		return l.fromShare(ctx, g, st, h, nil, orig, p, now)
	}
	a.mu.Lock()
	if a.home != h.name || !a.expires.IsZero() && !now.Before(a.expires) || a.lim != c.Limit {
		a.drop()
		a.lim, a.home = c.Limit, h.name
	}
	a.check = c
	if !a.debtUntil.IsZero() && !now.Before(a.debtUntil) {
		a.debt, a.debtUntil = 0, time.Time{}
	}
	up := !h.down.Load()
	if a.units >= c.Cost {
		o := g.spendUnits(h, a, up, c, orig, p.key, now)
		a.mu.Unlock()
		l.metrics.record(SourceLease, 1)
		g.count(h.name, "allowance")
		return o, nil
	}
	if !up {
		a.mu.Unlock()
		return l.fromShare(ctx, g, st, h, a, orig, p, now)
	}
	defer a.mu.Unlock()
	l.metrics.record(SourceLease, 1)
	return g.outOfAllowance(st, h, a, c, orig, p.key, now), nil
}

// spendUnits admits c from a's units, and carves more ahead of need when
// half are spent. Called with a locked.
func (g *Global) spendUnits(h *home, a *away, up bool, c, orig Check, key string, now time.Time) Decision {
	a.units -= c.Cost
	a.used = now
	if up && !a.refilling && a.units <= a.size/2 && !now.Before(a.exhausted) {
		g.refill(h, a, key, now) // ahead of need: the next requests find units
	}
	return Decision{
		Admitted: c.Cost, Allowed: true, Limit: orig.Limit.Limit,
		Remaining:  min(orig.Limit.Limit, a.left+a.units),
		ResetAfter: max(0, roundUpMs(a.reset.Sub(now))),
		Lease:      Lease{Limit: c.Limit, Units: c.Cost},
		Source:     SourceLease, allow: &a.allowance, epoch: a.epoch,
	}
}

// outOfAllowance decides c when a has too few units and its home answers:
// denied while the home's window is exhausted, else a carve starts and c
// is admitted on overdraft while it fits. Called with a locked.
func (g *Global) outOfAllowance(st *globalState, h *home, a *away, c, orig Check, key string, now time.Time) Decision {
	if now.Before(a.exhausted) {
		g.count(h.name, "denied")
		retry := roundUpMs(a.exhausted.Sub(now))
		return Decision{Limit: orig.Limit.Limit, RetryAfter: retry, ResetAfter: retry, Source: SourceLease}
	}
	if !a.refilling {
		g.refill(h, a, key, now)
	}
	if a.debt+c.Cost <= overdraft(orig, len(st.names)) {
		a.owe(c.Cost, now, c.Limit.Window)
		a.used = now
		g.count(h.name, "overdraft")
		return Decision{Admitted: c.Cost, Allowed: true, Limit: orig.Limit.Limit, Remaining: 0, ResetAfter: max(0, roundUpMs(a.reset.Sub(now))), Source: SourceLease}
	}
	// Out of allowance and overdraft, a carve under way: deny for about
	// the time a carve takes.
	g.count(h.name, "denied")
	retry := max(time.Second, g.cfg.Timeout)
	return Decision{Limit: orig.Limit.Limit, RetryAfter: retry, ResetAfter: retry, Source: SourceLease}
}

// fromShare decides a check whose home is unreachable from this region's
// static share, floor(limit / regions), counted exactly in this region's
// own store (its fail mode applies if that fails too). What it admits is
// debt, paid to the home once it answers again.
func (l *Limiter) fromShare(ctx context.Context, g *Global, st *globalState, h *home, a *away, orig Check, p pending, now time.Time) (Decision, error) {
	sl := orig.Limit
	sl.Key = "s:" + orig.Limit.Key
	sl.Limit = orig.Limit.Limit / int64(max(len(st.names), 1))
	g.count(h.name, "share")
	if sl.Limit < 1 {
		l.metrics.record(SourceStore, 1)
		retry := max(time.Second, g.cfg.Timeout)
		return Decision{Limit: orig.Limit.Limit, RetryAfter: retry, ResetAfter: retry, Source: SourceStore}, nil
	}
	sc := Check{Limit: sl, Cost: orig.Cost, Shadow: orig.Shadow, Nodes: orig.Nodes}
	o, err := l.exact(ctx, pending{i: p.i, check: sc, key: memKey(sl), rider: p.rider}, now)
	if err != nil {
		return Decision{}, err
	}
	if a != nil && o.Admitted > 0 {
		a.mu.Lock()
		a.owe(o.Admitted, now, orig.Limit.Window)
		a.used = now
		a.mu.Unlock()
	}
	o.Limit = orig.Limit.Limit
	return o, nil
}

// windowEnd is the end of the fixed window of length w that now falls in:
// windows are aligned to the epoch, in whole milliseconds, as the scripts
// count them.
func windowEnd(now time.Time, w time.Duration) time.Time {
	ms, wms := now.UnixMilli(), max(w.Milliseconds(), 1)
	return time.UnixMilli(ms - ms%wms + wms)
}

// owe adds n units admitted at now to a's debt. A debt is one window's:
// an earlier window's debt is dropped (that window is over), and units
// admitted in a window before the debt's (a decision that began earlier
// and ended later) are not owed, their window being over too. Called with
// a locked.
func (a *away) owe(n int64, now time.Time, w time.Duration) {
	end := windowEnd(now, w)
	switch {
	case end.Before(a.debtUntil):
		return
	case end.After(a.debtUntil):
		a.debt, a.debtUntil = 0, end
	}
	a.debt += n
}

// refill carves for a in the background: its debt first, then the next
// batch. The debt is a take of its own, bound to the debt's window
// (Request.until): landing after that window's end at the home, it takes
// nothing, and the debt is dropped. Called with a locked.
func (g *Global) refill(h *home, a *away, key string, now time.Time) {
	if !g.running() {
		return
	}
	c := a.check
	a.refilling = true
	a.terms = termsOf(c)
	a.grow(now)
	carve := carveLimit(c)
	reqs := []Request{{Limit: carve, Cost: a.size, Need: 1}}
	keys := []string{key}
	owed, until := a.debt, a.debtUntil
	if owed > 0 {
		reqs = append([]Request{{Limit: carve, Cost: owed, Need: 1, until: until}}, reqs...)
		keys = append(keys, key)
	}
	g.bg.Go(func() {
		sent := g.now()
		ds, errs := h.lim.call(context.Background(), reqs, keys, sent, nil)
		a.mu.Lock()
		defer a.mu.Unlock()
		a.refilling = false
		if owed > 0 {
			g.settle(h, a, ds[0], errs[0], until)
			ds, errs = ds[1:], errs[1:]
		}
		if err := errs[0]; err != nil {
			g.m.calls.WithLabelValues(h.name, "error").Inc()
			g.markDown(h, err)
			return
		}
		g.m.calls.WithLabelValues(h.name, "ok").Inc()
		g.markUp(h)
		d := ds[0]
		a.carved = sent
		a.left, a.reset = d.Remaining, sent.Add(d.ResetAfter)
		g.m.carved.WithLabelValues(h.name).Add(float64(d.Admitted))
		if d.Admitted == 0 {
			a.exhausted = sent.Add(d.RetryAfter)
			return
		}
		if d.Lease.state != a.from.state {
			a.drop() // another window: the old one's units end with it
		}
		n := d.Admitted
		if a.debt > 0 && d.Lease.state == a.debtUntil.Add(-c.Limit.Window).UnixMilli() {
			// Debt made while the call was out, in the window these
			// units were carved in: they pay it first.
			pay := min(n, a.debt)
			a.debt -= pay
			n -= pay
			g.m.settled.WithLabelValues(h.name).Add(float64(pay))
		}
		if n > 0 {
			// The script's reset is whole milliseconds, rounded up; the
			// units end before the window does, whatever the link's delay.
			expires := sent.Add(d.ResetAfter - time.Millisecond)
			if a.units == 0 || expires.Before(a.expires) {
				a.expires = expires
			}
			a.units += n
			a.from = d.Lease
		}
	})
}

// settle applies the answer (d, err) of a take paying a's debt of the
// window ending at until. Called with a locked.
func (g *Global) settle(h *home, a *away, d Decision, err error, until time.Time) {
	same := a.debtUntil.Equal(until) // else that debt was dropped meanwhile
	switch {
	case errors.Is(err, errWindowEnded):
		// The window ended at the home before the take ran: the next
		// window owes nothing for it.
		if same {
			a.debt, a.debtUntil = 0, time.Time{}
		}
	case err != nil:
		// Failed (the carve beside it says why): still owed, while its
		// window lasts.
	default:
		g.m.carved.WithLabelValues(h.name).Add(float64(d.Admitted))
		g.m.settled.WithLabelValues(h.name).Add(float64(d.Admitted))
		if same {
			a.debt -= min(d.Admitted, a.debt)
			if a.debt == 0 {
				a.debtUntil = time.Time{}
			}
		}
	}
}

func (g *Global) markDown(h *home, err error) {
	if h.down.CompareAndSwap(false, true) {
		g.m.unreachable.WithLabelValues(h.name).Set(1)
		g.log.Warn("global rules: home region unreachable, deciding its keys from the static share", "region", h.name, "err", err)
		if g.cfg.OnChange != nil {
			g.cfg.OnChange()
		}
	}
}

func (g *Global) markUp(h *home) {
	if h.down.CompareAndSwap(true, false) {
		g.m.unreachable.WithLabelValues(h.name).Set(0)
		g.log.Info("global rules: home region reachable again, settling debts", "region", h.name)
		if g.cfg.OnChange != nil {
			g.cfg.OnChange()
		}
	}
}

// sweep, every 100 ms until Close: probes unreachable homes, settles
// debts with reachable ones, gives idle allowance back and updates the
// gauges.
func (g *Global) sweep() {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			g.Sweep(g.now())
		}
	}
}

// Sweep does one round of the background work at now.
func (g *Global) Sweep(now time.Time) {
	st := g.state.Load()
	g.probeDown(st)
	outstanding, debt, exhausted := map[string]int64{}, map[string]int64{}, map[string]int64{}
	g.returnWhere(st, func(a *away) bool {
		h := st.homes[a.home]
		if h == nil {
			return true
		}
		// While the home's last give-back is under way (a slow link),
		// this one waits for a later sweep, still counted as held.
		give := g.settleAway(h, a, now) && !h.returning.Load()
		if !give {
			outstanding[a.home] += a.units
		}
		debt[a.home] += a.debt
		if now.Before(a.exhausted) {
			// No carve is asked before then, and the debt ends with the
			// home's window (debtUntil): it is never paid.
			exhausted[a.home] += a.debt
		}
		return give
	})
	for _, h := range st.homes {
		g.m.outstanding.WithLabelValues(h.name).Set(float64(outstanding[h.name]))
		g.m.debt.WithLabelValues(h.name).Set(float64(debt[h.name]))
		g.m.debtExhausted.WithLabelValues(h.name).Set(float64(exhausted[h.name]))
	}
}

// probeDown asks each home marked down, in the background, whether it
// answers again.
func (g *Global) probeDown(st *globalState) {
	for _, h := range st.homes {
		if h.down.Load() && h.probing.CompareAndSwap(false, true) && g.running() {
			g.bg.Go(func() {
				defer h.probing.Store(false)
				ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
				defer cancel()
				if h.lim.store.Probe(ctx, probeLimit) == nil {
					g.markUp(h)
				}
			})
		}
	}
}

// settleAway clears a's debt once its window passed, or settles it with
// a carve, and reports whether a's allowance goes back to its home h:
// unused for two periods, or expired. Called with a locked.
func (g *Global) settleAway(h *home, a *away, now time.Time) bool {
	if !a.debtUntil.IsZero() && !now.Before(a.debtUntil) {
		a.debt, a.debtUntil = 0, time.Time{}
	}
	if a.debt > 0 && !a.refilling && !h.down.Load() && !now.Before(a.exhausted) {
		g.refill(h, a, memKey(a.check.Limit), now) // settles the debt
	}
	last := a.used
	if a.carved.After(last) {
		last = a.carved
	}
	return now.Sub(last) >= 2*a.terms.period || !a.expires.IsZero() && !now.Before(a.expires)
}

// returnWhere gives back the units of the allowances pick chooses (to
// their window at the home, while it lasts) and forgets allowances with
// nothing left: no units, no debt, no carve under way.
func (g *Global) returnWhere(st *globalState, pick func(*away) bool) {
	now := g.now()
	g.mu.Lock()
	keys := make([]string, 0, len(g.table))
	all := make([]*away, 0, len(g.table))
	for k, a := range g.table {
		keys, all = append(keys, k), append(all, a)
	}
	g.mu.Unlock()
	back := map[*home][]Lease{}
	var gone []string
	for i, a := range all {
		if !a.mu.TryLock() {
			continue
		}
		if pick(a) && a.units > 0 {
			if h := st.homes[a.home]; h != nil && now.Before(a.expires) && !h.down.Load() {
				ls := a.from
				ls.Units = a.units
				back[h] = append(back[h], ls)
			}
			a.drop()
			a.size = 1
		}
		if a.idle() {
			gone = append(gone, keys[i])
		}
		a.mu.Unlock()
	}
	g.forget(gone)
	g.giveBackAway(back)
}

// idle reports whether a holds nothing: no units, no debt, no carve under
// way. Called with a locked.
func (a *away) idle() bool { return a.units == 0 && a.debt == 0 && !a.refilling }

// forget drops the keys' allowances that are still idle.
func (g *Global) forget(keys []string) {
	if len(keys) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range keys {
		if a := g.table[k]; a != nil && a.mu.TryLock() {
			if a.idle() {
				delete(g.table, k)
			}
			a.mu.Unlock()
		}
	}
}

// giveBackAway gives the allowances in back to their homes: while the
// Global runs, in the background, one give-back per home at a time, so a
// home that answers slowly (a give-back may wait 10× the store deadline)
// holds neither the sweep's gauges, probes and debts nor the other homes'
// returns; at Close, before returning.
func (g *Global) giveBackAway(back map[*home][]Lease) {
	for h, leases := range back {
		var units int64
		for _, ls := range leases {
			units += ls.Units
		}
		g.m.returned.WithLabelValues(h.name).Add(float64(units))
		give := func() {
			if err := h.lim.giveBack(h.lim.store, leases); err != nil {
				g.log.Warn("global rules: giving back allowance failed", "region", h.name, "keys", len(leases), "err", err)
			}
		}
		if !g.running() {
			give()
			continue
		}
		h.returning.Store(true)
		g.bg.Go(func() {
			defer h.returning.Store(false)
			give()
		})
	}
}

// globalMetrics are the Global's, labelled by home region (the catalog's
// names: bounded).
type globalMetrics struct {
	decisions                 *prometheus.CounterVec // home, from
	calls                     *prometheus.CounterVec // home, result
	carved, returned, settled *prometheus.CounterVec // home
	outstanding, debt         *prometheus.GaugeVec   // home
	debtExhausted             *prometheus.GaugeVec   // home
	unreachable               *prometheus.GaugeVec   // home
}

func newGlobalMetrics(reg prometheus.Registerer) (*globalMetrics, error) {
	m := &globalMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_limiter_global_decisions_total",
			Help: "Global-rule checks by the key's home region and what decided them: home (the key is homed in this region: a leased check on its own Redis), allowance (units leased from the home), overdraft (admitted ahead of the next lease, paid by it), share (the home unreachable: this region's static share, floor(limit / regions)), denied.",
		}, []string{"home", "from"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_limiter_global_lease_calls_total",
			Help: "Calls to another region's Redis leasing allowance for global rules (in the background, never on a request's path), by home region and result (ok, error).",
		}, []string{"home", "result"}),
		carved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_limiter_global_leased_units_total",
			Help: "Units leased from another region's Redis for global rules (debts paid included).",
		}, []string{"home"}),
		returned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_limiter_global_returned_units_total",
			Help: "Units of global-rule allowance given back unspent to their home region.",
		}, []string{"home"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_limiter_global_settled_units_total",
			Help: "Debt paid to a home region: units admitted on overdraft or from the static share, charged to the home by a later lease within the window they were admitted in.",
		}, []string{"home"}),
		outstanding: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_limiter_global_outstanding_units",
			Help: "Units this edge holds leased from each home region, unspent.",
		}, []string{"home"}),
		debt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_limiter_global_debt_units",
			Help: "Units this edge admitted for keys of each home region that no lease has paid yet (overdraft, static share).",
		}, []string{"home"}),
		debtExhausted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_limiter_global_debt_exhausted_units",
			Help: "Of edgeguard_limiter_global_debt_units, the units on keys whose home region had nothing left at the last lease: no lease is asked for them before that window ends at the home, and their debt ends with it, unpaid (admitted past what the home's window counted, within the bounds of docs/guarantees.md). The rest of the debt is still to be paid.",
		}, []string{"home"}),
		unreachable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_limiter_global_fallback_share",
			Help: "1 while a home region is unreachable from this edge and its keys are decided from the static share floor(limit / regions); 0 otherwise.",
		}, []string{"home"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.decisions, m.calls, m.carved, m.returned, m.settled, m.outstanding, m.debt, m.debtExhausted, m.unreachable} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
