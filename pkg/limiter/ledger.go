package limiter

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ledger keeps, per key, what the local fallback needs to stay within the
// limit across a store outage, and what the store needs to hear when it
// answers again:
//
//   - the remaining quota the store last reported (seen), and until when that
//     answer speaks for the key's window (until): when the key falls back,
//     each of the N edges sharing it admits at most floor(remaining/N) of
//     it, less what the edge had admitted that the answer did not count
//     (unseen); an exact check whose key has no such answer gets no share
//     while other edges may have counted it (Limiter.decideLocally);
//   - the units the fallback admitted that the store has not counted (debt),
//     by the time they were admitted (lots): they ride along, as an extra
//     request per lot in the same round trip, with the key's next call once
//     the store answers, so a store that comes back — empty or not — knows
//     what was admitted while it was away, and when;
//   - whether the store's last answer is owed back as a restore (owed):
//     the fallback took its share of that answer's count up front, and the
//     store is asked to count at least what it had then — nothing when it
//     kept its state, everything when it came back empty; and when the
//     master serving the key may have changed (masters.go), the new one
//     is asked the same.
//
// It is bounded like the over-limit cache: a flood of random keys evicts
// entries, never grows it. Eviction takes an account that owes the store
// nothing when a small sample holds one (an evicted answer only costs the
// key its fallback share); an evicted debt is forgotten: up to one edge's
// share of one key admitted twice.
type ledger struct {
	seed   maphash.Seed
	perCap int
	owing  atomic.Int64 // debts and restores owed: calls skip the lookup while none is
	// swept is the master generation (Limiter.masterGen) every account
	// has been checked against; sweeping is set while a sweep runs.
	swept    atomic.Uint64
	sweeping atomic.Bool
	// changed is when a call last found the masters' generation moved
	// past swept (unix ns; 0: never): Limiter.afterChange.
	changed atomic.Int64
	shards  [64]ledgerShard
}

type ledgerShard struct {
	mu sync.Mutex
	m  map[string]*account
}

type account struct {
	remaining int64         // the store's last answer
	seen      time.Time     // when it was given
	span      time.Duration // it speaks for the key's window until seen + span
	fallback  bool          // the fallback holds state seeded for this outage
	gen       uint32        // the master generation of the last answer (its low bits)
	by        *storeIdent   // who gave the last answer, if known (identity.go)
	owed      *owedRestore  // an answer owed back as a restore; nil: none
	debt      int64         // fallback admissions the store has not counted: lots' sum
	lots      []debtLot     // debt by the end of the window each counts in, earliest first
	// lent is debt out on calls not settled yet (lend, landed): a call
	// its caller gave up on may run after a later call's answer, or be
	// refused and owe it again.
	lent int64
	// unseen is what this edge had admitted that its last answer may not
	// count: the debt still owed and lent on other calls when it came.
	// The fallback's share of that answer is short of it (seedUsed),
	// and so is the store's admission (Decision.holdBack).
	unseen int64
}

// debtLot is debt admitted at one time: units that count in the key's
// window until until (a fixed window's reset; a window after their
// admission otherwise). A replay is sent per lot, dated when its units
// were admitted, so the store counts each as long as its own admission
// does, no longer (clients would get less) and no shorter (more).
type debtLot struct {
	units int64
	until time.Time
}

// maxLots bounds an account's lots: past it, a new lot's units join the
// latest lot, which takes the later end of the two (counted longer than
// admitted: clients get less, never more).
const maxLots = 4

// owedRestore is an answer owed back to the store: remaining as of at,
// speaking for the key's window until until (a fixed window's reset: a
// restore run in the next window would charge it for the last one). Made
// only when one is owed, so an account stays in its small size class.
type owedRestore struct {
	remaining int64
	at, until time.Time
	by        *storeIdent // who gave it, if known
}

// until is when a's last answer stops speaking for the key's window.
func (a *account) until() time.Time { return a.seen.Add(a.span) }

// seedUsed is how many of the fallback's local units (limit/N) an outage
// takes up front from a's last answer: all but this node's share of what
// the answer left, floor(remaining/N), less what the node admitted that
// the answer does not count (unseen).
func (a *account) seedUsed(local, nodes int64) int64 {
	return max(0, local-max(0, a.remaining/nodes-a.unseen))
}

func newLedger(size int) *ledger {
	lg := &ledger{seed: maphash.MakeSeed(), perCap: max(1, size/64)}
	for i := range lg.shards {
		lg.shards[i].m = make(map[string]*account)
	}
	return lg
}

// with runs fn on key's account, creating it when create is set.
func (lg *ledger) with(key string, create bool, fn func(*account)) {
	sh := &lg.shards[maphash.String(lg.seed, key)%uint64(len(lg.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a, ok := sh.m[key]
	if !ok {
		if !create {
			return
		}
		if len(sh.m) >= lg.perCap {
			lg.evict(sh)
		}
		a = &account{}
		sh.m[key] = a
	}
	fn(a)
}

// evict drops one account of a full shard: the first of a small sample
// (map order is random) that owes the store nothing, else the sample's
// last. Called locked.
func (lg *ledger) evict(sh *ledgerShard) {
	const scan = 8
	var victim string
	var va *account
	i := 0
	for k, v := range sh.m {
		victim, va = k, v
		if v.debt == 0 && v.owed == nil {
			break
		}
		if i++; i == scan {
			break
		}
	}
	if va == nil {
		return
	}
	if va.debt > 0 {
		lg.owing.Add(-1)
	}
	if va.owed != nil {
		lg.owing.Add(-1)
	}
	delete(sh.m, victim)
}

// len is the number of accounts held.
func (lg *ledger) len() int {
	n := 0
	for i := range lg.shards {
		sh := &lg.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// observe records the store's answer for a key, given at now and speaking
// for the key's window until until: the store decides it again, so the
// next outage seeds the fallback afresh. The call was sent under master
// generation sent and answered under gen: when a master may have changed
// meanwhile, the call may have run on a new master that lacked this edge's
// previous answer, so a restore is owed of that answer less what the call
// admitted (or of this answer, if it says less remains); of the previous
// answer alone when the call was tallied (a window's call made after
// a sign of the change: Request.post), as a restore adds the tally. by is
// who gave this answer, if known. It reports what this edge had admitted
// that the answer does not count (account.unseen).
func (lg *ledger) observe(key string, remaining int64, now, until time.Time, sent, gen uint64, admitted int64, tallied bool, by *storeIdent) (unseen int64) {
	lg.with(key, true, func(a *account) {
		if sent != gen && lg.active(a, now) {
			owe, owedBy := a.remaining-admitted, a.by
			switch {
			case tallied:
				// Made after a sign of the change, so tallied where it
				// ran (Request.post): a restore on the new master adds
				// what it took there to the answer before it, which
				// alone is owed.
				owe = a.remaining
			case remaining < owe:
				// This answer, from either master: who gave it is not
				// known, so a restore of it adds no tally (which it
				// may hold already).
				owe, owedBy = remaining, nil
			}
			lg.oweLocked(a, owe, a.seen, a.until(), owedBy)
		}
		a.remaining, a.seen, a.span, a.fallback, a.gen, a.by = remaining, now, until.Sub(now), false, uint32(gen), by
		// The call's own replays were settled before its answer is
		// observed (Limiter.settleCall) when the store ran them before
		// the request; what is owed or lent on other calls is not in it.
		a.unseen = a.debt + a.lent
		unseen = a.unseen
	})
	return unseen
}

// active reports whether a's last answer still speaks for its window at now.
func (lg *ledger) active(a *account, now time.Time) bool {
	return !a.seen.IsZero() && now.Before(a.until())
}

// oweLocked owes a restore of remaining as of at, good until until, given
// by the store with identity by (nil unknown); one owed already keeps the
// least remaining, the earliest time and the earliest end, and an identity
// only if both had the same. Called locked.
func (lg *ledger) oweLocked(a *account, remaining int64, at, until time.Time, by *storeIdent) {
	remaining = max(0, remaining)
	if o := a.owed; o != nil {
		o.remaining = min(o.remaining, remaining)
		if o.by.String() != by.String() {
			o.by = nil
		}
		if at.Before(o.at) {
			o.at = at
		}
		o.until = minTime(o.until, until)
		return
	}
	a.owed = &owedRestore{remaining: remaining, at: at, until: until, by: by}
	lg.owing.Add(1)
}

// markMoved owes key's restore of its last answer if a master may have
// changed (generation gen) since it was given and it still speaks for its
// window.
func (lg *ledger) markMoved(key string, gen uint64, now time.Time) {
	lg.with(key, false, func(a *account) { lg.moved(a, gen, now) })
}

// markAllMoved is markMoved for every account.
func (lg *ledger) markAllMoved(gen uint64, now time.Time) {
	for i := range lg.shards {
		sh := &lg.shards[i]
		sh.mu.Lock()
		for _, a := range sh.m {
			lg.moved(a, gen, now)
		}
		sh.mu.Unlock()
	}
}

func (lg *ledger) moved(a *account, gen uint64, now time.Time) {
	if a.gen == uint32(gen) {
		return
	}
	a.gen = uint32(gen)
	if lg.active(a, now) {
		lg.oweLocked(a, a.remaining, a.seen, a.until(), a.by)
	}
}

// knows reports whether the store's last answer for key still speaks for
// its window at now.
func (lg *ledger) knows(key string, now time.Time) bool {
	var ok bool
	lg.with(key, false, func(a *account) { ok = lg.active(a, now) })
	return ok
}

// oweAnswer owes key's last answer back to the store as a restore, if it
// still speaks for its window at now: an exact check the fallback denies
// takes no share of it, but a store that comes back empty relearns it.
func (lg *ledger) oweAnswer(key string, now time.Time) {
	lg.with(key, false, func(a *account) {
		if lg.active(a, now) {
			lg.oweLocked(a, a.remaining, a.seen, a.until(), a.by)
		}
	})
}

// seedFor says how many of the fallback's local units (limit/N) to take up
// front when the key first falls back: what the store's last answer says is
// already used, as of when it said so (at). It reports each call once per
// outage (fresh: the fallback's state of an earlier outage is superseded by
// the store's newer answer). A seeded outage owes the store a restore of
// that answer (lendRestore).
func (lg *ledger) seedFor(key string, local int64, nodes int64, now time.Time) (used int64, fresh bool, at time.Time) {
	lg.with(key, true, func(a *account) {
		if a.fallback {
			return
		}
		a.fallback, fresh = true, true
		if !lg.active(a, now) {
			return
		}
		at = a.seen
		used = a.seedUsed(local, nodes)
		if used > 0 {
			lg.oweLocked(a, a.remaining, a.seen, a.until(), a.by)
		}
	})
	return used, fresh, at
}

// peekSeed is seedFor read without a change: whether the fallback holds
// this outage's count for key (seeded), and if not, the units seedFor would
// take up front.
func (lg *ledger) peekSeed(key string, local int64, nodes int64, now time.Time) (used int64, seeded bool) {
	lg.with(key, false, func(a *account) {
		seeded = a.fallback
		if !seeded && lg.active(a, now) {
			used = a.seedUsed(local, nodes)
		}
	})
	return used, seeded
}

// lendRestore takes key's owed restore out to be sent at now: the
// remaining the store reported, when, and until when it speaks for the
// key's window. One whose window has ended by now is dropped: the store
// counts a new window, which owes nothing for the last. One that fails
// is owed again (oweRestore).
func (lg *ledger) lendRestore(key string, now time.Time) (remaining int64, at, until time.Time, by *storeIdent, ok bool) {
	if lg.owing.Load() == 0 {
		return 0, time.Time{}, time.Time{}, nil, false
	}
	lg.with(key, false, func(a *account) {
		if a.owed != nil {
			remaining, at, until, by = a.owed.remaining, a.owed.at, a.owed.until, a.owed.by
			ok = now.Before(until)
			a.owed = nil
			lg.owing.Add(-1)
		}
	})
	return remaining, at, until, by, ok
}

// oweRestore owes key's restore of remaining as of at, good until until,
// given by the store with identity by, again (a restore that failed).
func (lg *ledger) oweRestore(key string, remaining int64, at, until time.Time, by *storeIdent) {
	lg.with(key, false, func(a *account) { lg.oweLocked(a, remaining, at, until, by) })
}

// owe adds units the fallback admitted, counted in a window that ends at
// until (a fixed window's reset; a window after their admission
// otherwise), at now, as a lot of their own (addLot). The lots whose
// window ended by now are dropped first: the next window owes nothing for
// the last one. So are units owed again after their window ended (a
// replay that failed late).
func (lg *ledger) owe(key string, units int64, now, until time.Time) {
	if !now.Before(until) {
		return
	}
	lg.with(key, true, func(a *account) { lg.oweUnitsLocked(a, units, now, until) })
}

// oweUnitsLocked is owe, on a's account, with until after now. Called
// locked.
func (lg *ledger) oweUnitsLocked(a *account, units int64, now, until time.Time) {
	lg.dropEnded(a, now)
	if units <= 0 {
		return
	}
	if a.debt == 0 {
		lg.owing.Add(1)
	}
	a.debt += units
	a.addLot(units, until)
}

// landed ends a replay of units that lend took out: again of them are
// owed again (owe) as of now — those the store did not count, or all of
// them when the call failed (one that failed may have counted, and the
// store then counts them twice: clients get less, never more) — unless the
// window they count in ended by then.
func (lg *ledger) landed(key string, units, again int64, now, until time.Time) {
	owes := again > 0 && now.Before(until)
	lg.with(key, owes, func(a *account) {
		a.lent = max(0, a.lent-units)
		if owes {
			lg.oweUnitsLocked(a, again, now, until)
		}
	})
}

// addLot adds units counting until until to a's lots, in order of their
// ends: to the lot that ends then, else as a lot of their own while there
// are fewer than maxLots, else to the first lot that ends later, or
// (ending last) to the latest lot, which then ends at until. A unit is
// never dated earlier than it was admitted.
func (a *account) addLot(units int64, until time.Time) {
	i := 0
	for i < len(a.lots) && a.lots[i].until.Before(until) {
		i++
	}
	switch {
	case i < len(a.lots) && a.lots[i].until.Equal(until):
		a.lots[i].units += units
	case len(a.lots) < maxLots:
		a.lots = slices.Insert(a.lots, i, debtLot{units: units, until: until})
	case i < len(a.lots):
		a.lots[i].units += units
	default:
		last := &a.lots[len(a.lots)-1]
		last.units += units
		last.until = until
	}
}

// dropEnded drops a's lots whose window ended by now. Called locked.
func (lg *ledger) dropEnded(a *account, now time.Time) {
	n := 0
	for n < len(a.lots) && !now.Before(a.lots[n].until) {
		n++
	}
	if n > 0 {
		lg.settle(a, a.debt-sumLots(a.lots[n:]))
	}
}

func sumLots(lots []debtLot) int64 {
	var n int64
	for _, l := range lots {
		n += l.units
	}
	return n
}

// lend takes key's debt out to be replayed at now, lot by lot, each with
// the end of the window it counts in: the units admitted in a window that
// has not ended (older ones have left every algorithm's window; a fixed
// window's were counted in a window that is over). A replay in flight is
// not replayed again by another call; one that fails is owed again.
func (lg *ledger) lend(key string, now time.Time) (lots []debtLot) {
	if lg.owing.Load() == 0 {
		return nil
	}
	lg.with(key, false, func(a *account) {
		lg.dropEnded(a, now)
		if a.debt > 0 {
			lots = a.lots
			a.lots = nil
			a.lent += a.debt
			lg.settle(a, a.debt)
		}
	})
	return lots
}

// paid removes replayed (or refunded) units from key's debt.
func (lg *ledger) paid(key string, units int64) {
	lg.with(key, false, func(a *account) { lg.settle(a, units) })
}

// settle removes units from a's debt, from its earliest lots first (the
// units left are then dated no earlier than admitted). Called locked.
func (lg *ledger) settle(a *account, units int64) {
	if a.debt > 0 && a.debt <= units {
		lg.owing.Add(-1)
	}
	a.debt = max(0, a.debt-units)
	for units > 0 && len(a.lots) > 0 {
		l := &a.lots[0]
		take := min(units, l.units)
		l.units -= take
		units -= take
		if l.units == 0 {
			a.lots = a.lots[1:]
		}
	}
	if a.debt == 0 {
		a.lots = nil
	}
}
