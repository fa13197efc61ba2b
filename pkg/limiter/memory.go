package limiter

import (
	"context"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// MemoryStore runs the algorithms over process memory: the whole store of a
// single-node edge, and the local fallback when Redis cannot be asked. Its
// size is capped: when a shard is full, expired keys go first, then arbitrary
// ones, so a flood of random keys cannot grow it without bound (an evicted key
// forgets its count, which errs towards admitting).
type MemoryStore struct {
	now     func() time.Time
	seed    maphash.Seed
	shards  [memoryShards]memoryShard
	perCap  int
	ids     *idSource
	evicted atomic.Int64
	// restarts counts the store's restarts (tests'): its identity.
	restarts atomic.Uint64
	// tallies mirror tally.lua's tally for a test's store standing
	// in for Redis (Request.post, which the limiter sets only for remote
	// stores): units admitted by tallied takes, per key, identity and
	// window start.
	tallyMu sync.Mutex
	tallies map[tallyKey]int64
}

type tallyKey struct {
	key, ident string
	ws         int64
}

// tally adds units to the tally of key's window ws under the store's
// current identity, and returns what it holds.
func (s *MemoryStore) tally(key string, ws, units int64) int64 {
	s.tallyMu.Lock()
	defer s.tallyMu.Unlock()
	k := tallyKey{key, s.ident(), ws}
	if units != 0 {
		if s.tallies == nil {
			s.tallies = map[tallyKey]int64{}
		}
		s.tallies[k] += units
	}
	return s.tallies[k]
}

const memoryShards = 64

type memoryShard struct {
	mu   sync.Mutex
	keys map[string]*limit.State
}

// MemoryOption configures a MemoryStore.
type MemoryOption func(*MemoryStore)

// WithClock sets the time used for requests without an explicit At.
func WithClock(now func() time.Time) MemoryOption { return func(s *MemoryStore) { s.now = now } }

// WithMaxKeys caps the number of keys held (default 1,000,000).
func WithMaxKeys(n int) MemoryOption {
	return func(s *MemoryStore) { s.perCap = max(1, n/memoryShards) }
}

// NewMemoryStore returns an empty store.
func NewMemoryStore(opts ...MemoryOption) *MemoryStore {
	s := &MemoryStore{now: time.Now, seed: maphash.MakeSeed(), perCap: 1_000_000 / memoryShards, ids: newIDSource()}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].keys = make(map[string]*limit.State)
	}
	return s
}

var _ Store = (*MemoryStore)(nil)

// Len is the number of keys held.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].keys)
		s.shards[i].mu.Unlock()
	}
	return n
}

// Evicted is the number of live keys evicted to respect the size cap.
func (s *MemoryStore) Evicted() int64 { return s.evicted.Load() }

// memKey keeps algorithms apart, as the Redis key names do.
func memKey(l Limit) string { return strconv.Itoa(int(l.Algorithm)) + l.Key }

// requestKey is r's memKey: the one the limiter built for it when it is
// that (checked, at the cost of a comparison instead of an allocation).
func requestKey(r Request) string {
	k, alg := r.key, strconv.Itoa(int(r.Limit.Algorithm))
	if len(k) == len(alg)+len(r.Limit.Key) && k[:len(alg)] == alg && k[len(alg):] == r.Limit.Key {
		return k
	}
	return memKey(r.Limit)
}

// Take implements Store.
func (s *MemoryStore) Take(_ context.Context, reqs []Request) ([]Decision, error) {
	return s.takeInto(reqs, nil)
}

// takeInto is Take, its answers in out when it holds len(reqs) of them.
func (s *MemoryStore) takeInto(reqs []Request, out []Decision) ([]Decision, error) {
	if cap(out) < len(reqs) {
		out = make([]Decision, len(reqs))
	}
	out = out[:len(reqs)]
	clear(out) // a request that fails answers a zero Decision
	var errs []error
	for i, r := range reqs {
		if err := r.valid(); err != nil {
			errs = setErr(errs, len(reqs), i, err)
			continue
		}
		at := r.At
		if at.IsZero() && r.dated {
			at = r.admitted() // the memory store's clock is the limiter's
		}
		a := s.args(r.Limit, at)
		if !r.until.IsZero() && a.Now >= r.until.UnixMicro() {
			errs = setErr(errs, len(reqs), i, errWindowEnded)
			continue
		}
		a.Cost, a.Need = r.Cost, r.need()
		if r.Limit.Algorithm.Spec().Members {
			a.ID = s.ids.next()
		}
		if r.Peek {
			a.Cost, a.Need = 0, 1
		}
		if r.Restore { // as the batch script does: read, then take what is missing
			a.Cost, a.Need = 0, 1
			out[i] = s.take(r, a)
			missing := out[i].Remaining - r.Remaining
			if r.ident.String() != "" && r.ident.String() != s.ident() && r.Limit.Algorithm.Spec().Tallied {
				missing += s.tally(memKey(r.Limit), out[i].Lease.state, 0) // another server's answer: the tally on top
			}
			if missing = min(r.Cost, missing); missing > 0 && (r.ident == nil || r.ident.id != s.ident()) {
				a.Cost = missing
				out[i] = s.take(r, a)
			}
			continue
		}
		out[i] = s.take(r, a)
		if r.post && !r.Peek && r.Limit.Algorithm.Spec().Tallied { // as tally.lua tallies
			out[i].Lease.id = s.ident()
			s.tally(memKey(r.Limit), out[i].Lease.state, out[i].Admitted)
		}
	}
	if errs != nil {
		return out, &TakeError{Errs: errs}
	}
	return out, nil
}

func setErr(errs []error, n, i int, err error) []error {
	if errs == nil {
		errs = make([]error, n)
	}
	errs[i] = err
	return errs
}

func (s *MemoryStore) args(l Limit, at time.Time) limit.Args {
	dated := !at.IsZero()
	if !dated {
		at = s.now()
	}
	a := limit.ArgsFor(l, at.UnixMicro())
	a.Dated = dated
	return a
}

func (s *MemoryStore) take(r Request, a limit.Args) Decision {
	key := requestKey(r)
	sh := &s.shards[maphash.String(s.seed, key)%memoryShards]
	sh.mu.Lock()
	st, present := sh.keys[key]
	if present && st.Expired(a.Now) {
		present = false
	}
	if !present {
		st = &limit.State{}
	}
	o := r.Limit.Algorithm.Spec().Take(st, a, present)
	if o.Admitted > 0 {
		s.store(sh, key, st, a.Now)
	}
	sh.mu.Unlock()
	return decision(r, a.ID, o)
}

// forget drops l's state: the fallback's count from an earlier outage,
// which the store's newer answer has taken in.
func (s *MemoryStore) forget(l Limit) {
	key := memKey(l)
	sh := &s.shards[maphash.String(s.seed, key)%memoryShards]
	sh.mu.Lock()
	delete(sh.keys, key)
	sh.mu.Unlock()
}

// ident is the store's identity, as a Redis server's run_id and
// master_replid: it changes when a test restarts the store.
func (s *MemoryStore) ident() string { return "memory:" + strconv.FormatUint(s.restarts.Load(), 10) }

// identity implements identifier.
func (s *MemoryStore) identity(context.Context, Limit) (string, error) { return s.ident(), nil }

// store puts st under key, evicting to stay under the cap. Called locked.
func (s *MemoryStore) store(sh *memoryShard, key string, st *limit.State, now int64) {
	if _, ok := sh.keys[key]; !ok && len(sh.keys) >= s.perCap {
		const scan = 8 // map order is random: a small sample finds expired keys
		var victim string
		i := 0
		for k, v := range sh.keys {
			if v.Expired(now) {
				delete(sh.keys, k)
				victim = ""
				break
			}
			victim = k
			if i++; i == scan {
				break
			}
		}
		if victim != "" {
			delete(sh.keys, victim)
			s.evicted.Add(1)
		}
	}
	sh.keys[key] = st
}

func decision(r Request, id string, o limit.Result) Decision {
	if r.Peek {
		// Nothing taken: allowed when Cost would be admitted now.
		return Decision{
			Allowed:    o.Remaining >= r.Cost,
			Limit:      r.Limit.Limit,
			Remaining:  o.Remaining,
			ResetAfter: time.Duration(o.ResetMs) * time.Millisecond,
			Lease:      Lease{Limit: r.Limit},
		}
	}
	return Decision{
		Admitted:   o.Admitted,
		Allowed:    o.Admitted == r.Cost,
		Limit:      r.Limit.Limit,
		Remaining:  o.Remaining,
		ResetAfter: time.Duration(o.ResetMs) * time.Millisecond,
		RetryAfter: time.Duration(o.RetryMs) * time.Millisecond,
		Lease:      Lease{Limit: r.Limit, id: id, first: 1, Units: o.Admitted, state: o.State},
	}
}

// Refund implements Store.
func (s *MemoryStore) Refund(_ context.Context, leases []Lease) error {
	for _, l := range leases {
		if l.Units <= 0 {
			continue
		}
		if err := l.Limit.Validate(); err != nil {
			return err
		}
		a := s.args(l.Limit, time.Time{})
		a.ID, a.Cost, a.State, a.First = l.id, l.Units, l.state, l.first
		key := memKey(l.Limit)
		sh := &s.shards[maphash.String(s.seed, key)%memoryShards]
		sh.mu.Lock()
		var back int64 // what a tallied lease's refund gives back comes off its tally too
		if st, ok := sh.keys[key]; ok && !st.Expired(a.Now) {
			left := func(st *limit.State, present bool) int64 { // a take of nothing: what remains
				ra := a
				ra.Cost, ra.Need = 0, 1
				return l.Limit.Algorithm.Spec().Take(st, ra, present).Remaining
			}
			var before int64
			if l.tallied() {
				before = left(st, true)
			}
			kept := l.Limit.Algorithm.Spec().Refund(st, a)
			if !kept {
				delete(sh.keys, key)
			}
			if l.tallied() {
				if !kept {
					st = &limit.State{} // as the script finds it: gone
				}
				back = left(st, kept) - before
			}
		}
		sh.mu.Unlock()
		if l.tallied() && back > 0 {
			s.tally(key, l.state, -back)
		}
	}
	return nil
}

// idSource makes request ids unique across processes and calls: a random
// per-process prefix and a counter. Sliding log and concurrency members are
// "<id>:<unit>", so two calls never collide in one ZSET.
type idSource struct {
	prefix string
	n      atomic.Uint64
}

func newIDSource() *idSource {
	return &idSource{prefix: strconv.FormatUint(randUint64(), 36)}
}

func (s *idSource) next() string {
	return s.prefix + "." + strconv.FormatUint(s.n.Add(1), 36)
}
