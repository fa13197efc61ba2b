package limiter

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Who answered. A restore (masters.go, ledger.go) asks the store to count
// at least what this edge's last answer said, in case the store lost it: a
// master restarted empty, or a promoted replica that lacked the last
// increments. A store that kept its state finds nothing missing, unless its
// count has fallen since by what was given back (a late call's units, a
// lease's unspent allowance): the restore then takes those units again, and
// clients get fewer than the limit.
//
// So each answer is noted with the identity of the store that gave it, when
// known: a Redis server's run_id and master_replid (lua.Identity). Neither
// comes back once changed (a restart draws a new run_id, a promotion a new
// replication id), so a server that has an answer's identity when the
// restore runs is the one that gave it, master all along: the batch script
// compares the two and takes nothing when they match. An identity unknown,
// or read before a sign of a master change, takes as before.

// identifier is a store that can say who serves a limit's keys.
type identifier interface {
	identity(ctx context.Context, l Limit) (string, error)
}

// storeIdent is a shard's identity as last read: id ("" unknown), read
// under master generation gen, and held by the shard since at least since
// (the end of the first read that gave it); tried is the generation the
// last read was tried under, which failed when it is not gen.
type storeIdent struct {
	id         string
	since      time.Time
	gen, tried uint64
	// failed is when the read under tried failed for a reason that may
	// pass (the store down, restarting or slow: not a reply refusing
	// INFO); zero otherwise.
	failed time.Time
}

// identRetry is how soon a read that failed for a reason that may pass is
// tried again, at the earliest (wantIdentity).
const identRetry = time.Second

// known reports whether id names who serves the shard under gen.
func (s *storeIdent) known(gen uint64) bool { return s.id != "" && s.gen == gen }

// String is the identity, "" when unknown (nil).
func (s *storeIdent) String() string {
	if s == nil {
		return ""
	}
	return s.id
}

// answeredBy is who gave b's answer to a call sent at sent (or later)
// under master generation gen, and answered under it too: b's identity
// when it was read before the call and no sign of a master change came
// between; nil otherwise.
func (b *breaker) answeredBy(sent time.Time, gen uint64) *storeIdent {
	id := b.ident.Load()
	if id == nil || id.id == "" || id.gen != gen || !id.since.Before(sent) {
		return nil
	}
	return id
}

// unattributed reports whether a tallied window's call (fixed or sliding) to b, sent at sent
// under master generation gen, is to say who ran it (Request.post, as a
// tallied take does): its answer could not be noted with b's identity
// otherwise (answeredBy), because no read of it under gen has ended
// before the call, while one is under way or about to be (wantIdentity).
// Without it, a restore of that answer would take what the store gave
// back since, a late call's units, even from the server that gave it: an
// edge's first answers after it starts, or after each sign of a master
// change, precede the identity read they start; and a read that failed
// for a reason that may pass is tried again only identRetry later. Not
// when the store refused the read, or could not say (the script's own
// read would fail too), nor for a store that cannot say who serves it.
func (l *Limiter) unattributed(b *breaker, lim Limit, sent time.Time, gen uint64) bool {
	if !lim.Algorithm.Spec().Tallied || l.idf == nil || !l.store.Remote() {
		return false
	}
	id := b.ident.Load()
	switch {
	case id == nil || id.tried != gen:
		return true // not read under gen yet
	case !id.known(gen):
		// The read under gen failed: until one tried again succeeds
		// when the store may say; never when it refused to.
		return !id.failed.IsZero()
	}
	return !id.since.Before(sent) // read, but not before the call
}

// wantIdentity reads the identity of b's shard, through lim's key, in the
// background when no read was tried under master generation gen (the
// current one): at a shard's first call, and after each sign of a master
// change; and again, identRetry after a read under gen failed for a
// reason that may pass.
func (l *Limiter) wantIdentity(b *breaker, lim Limit, gen uint64) {
	if l.idf == nil {
		return
	}
	if id := b.ident.Load(); id != nil && id.tried == gen && (id.known(gen) || id.failed.IsZero() || l.now().Sub(id.failed) < identRetry) {
		return
	}
	if !b.identing.CompareAndSwap(false, true) {
		return
	}
	l.bg.Go(func() {
		defer b.identing.Store(false)
		l.readIdentity(b, lim)
	})
}

// readIdentity reads the identity of b's shard through lim's key. A read
// before with the same id keeps its since. A read that fails keeps what was
// known, for the generation it was read under: it is not tried again before
// the next sign of a master change, or the next probe that finds the shard
// answering, or, when the store did not refuse it (a reply refusing INFO
// will refuse it again), identRetry later. (An identity stale or unknown
// only makes restores take as they would without it.)
func (l *Limiter) readIdentity(b *breaker, lim Limit) {
	if l.idf == nil {
		return
	}
	gen := l.masterGen()
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
	defer cancel()
	id, err := l.idf.identity(ctx, lim)
	at := l.now()
	next := &storeIdent{id: id, since: at, gen: gen, tried: gen}
	switch prev := b.ident.Load(); {
	case err != nil && prev != nil:
		next.id, next.since, next.gen = prev.id, prev.since, prev.gen
	case err != nil:
		next.id = ""
	case prev != nil && prev.id == id:
		next.since = prev.since
	}
	var refused redis.Error
	if err != nil && !errors.As(err, &refused) {
		next.failed = at
	}
	b.ident.Store(next)
}
