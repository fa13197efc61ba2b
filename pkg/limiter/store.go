package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Limit, Algorithm and the algorithms are package limit's: one definition of
// a valid limit, shared with rule validation, and one registry of algorithms.
type (
	Limit     = limit.Limit
	Algorithm = limit.Algorithm
)

// Errors callers act on.
var (
	ErrUnknownAlgorithm = limit.ErrUnknownAlgorithm
	ErrInvalidLimit     = limit.ErrInvalidLimit
	ErrInvalidRequest   = errors.New("invalid request")
)

// Request asks a store to take Cost units of a Limit.
type Request struct {
	Limit Limit
	// Cost is the number of units to take; the store admits as many whole
	// Need-sized parts as fit.
	Cost int64
	// Need is one request's cost, 0 meaning Cost: units are admitted in whole
	// multiples of it (a single request is all-or-nothing), and RetryAfter is
	// when Need units fit again. A coalesced call carries the summed cost of
	// several equal-cost requests and one request's need, so partial admission
	// admits whole requests. With MinInterval at most Need units are admitted
	// per call.
	Need int64
	// At is the decision time; zero means the store's clock (Redis TIME).
	// Tests pass explicit times.
	At time.Time
	// dated marks a replay of the fallback's admissions (At zero), one
	// lot of them (ledger.go), that the store counts as of when the lot's
	// units were admitted (the latest of them, if merged): a window
	// before its until, on the limiter's clock (answerUntil). A store maps
	// that to its own clock, never earlier (RedisStore, through its
	// estimate of Redis's clock; when it cannot, the replay runs at Redis's
	// TIME); until then does not bound it.
	dated bool
	// Peek makes the request a look: the store counts nothing (the
	// scripts are run with a cost of 0, which write nothing) and answers
	// whether Cost units would be admitted now, and what remains.
	// Algorithms that keep members (sliding log, concurrency) cannot peek:
	// their scripts trim expired members before reading.
	Peek bool
	// Restore makes the request a restore: the store had reported Remaining
	// at At, and takes, as of At, what is missing since (at most Cost units)
	// — nothing when it kept its state, what it had counted when it lost
	// it. Restoring twice takes nothing the second time.
	Restore bool
	// post marks a fixed or sliding window's take made after a sign that the key's
	// master may have changed, in the window of that sign, or before the
	// edge has read who serves it (Limiter.unattributed): the store
	// tallies what it admits for the server that runs it, which a
	// restore there of another server's answer adds (lua.Batch), and
	// answers who that server is. Beside the other flags: no room of its
	// own.
	post      bool
	Remaining int64
	// ident, for a restore, is the identity of the store that gave the
	// answer it restores (nil unknown): a store with that identity still
	// kept its state, and the restore takes nothing (lua.Batch).
	ident *storeIdent
	// until, when set, is the end of the only window the take may count
	// in, on the store's clock: a take that would run at or past it takes
	// nothing and fails with errWindowEnded. A global rule's debt is
	// settled this way, so it is charged to the window it was made in or
	// to none (global.go).
	// A restore (run at At) keeps here until when the answer it restores
	// speaks for the key's window: the limiter drops one owed past it.
	until time.Time
	// key is memKey(Limit) when the limiter has built it already: the
	// memory store's map key, then not built (and allocated) again.
	key string
}

// admitted is when the latest of a dated replay's units was admitted, on
// the limiter's clock.
func (r Request) admitted() time.Time { return r.until.Add(-r.Limit.Window) }

func (r Request) need() int64 {
	if r.Need > 0 {
		return r.Need
	}
	return r.Cost
}

// Validate reports every problem with r.
func (r Request) Validate() error {
	var errs []error
	if err := r.Limit.Validate(); err != nil {
		errs = append(errs, err)
	}
	if r.Cost < 1 {
		errs = append(errs, fmt.Errorf("%w: cost must be ≥ 1 (got %d)", ErrInvalidRequest, r.Cost))
	}
	if r.Need < 0 {
		errs = append(errs, fmt.Errorf("%w: need must be ≥ 0 (got %d)", ErrInvalidRequest, r.Need))
	}
	if r.Peek && len(errs) == 0 && r.Limit.Algorithm.Spec().Members {
		errs = append(errs, fmt.Errorf("%w: %s cannot peek (its script trims expired members before it reads)", ErrInvalidRequest, r.Limit.Algorithm))
	}
	return errors.Join(errs...)
}

// valid reports every problem with r, as Validate does, but checks a limit's
// shape (everything but its key) once: requests come from a few compiled
// rules, and a store is asked about the same shapes over and over. Up to
// maxValidShapes shapes are remembered; past that every request is
// validated in full.
func (r Request) valid() error {
	l := r.Limit
	// Two byte searches, not strings.ContainsAny (which builds a set of
	// the bytes first): this runs for every check of every request.
	if r.Cost < 1 || r.Need < 0 || r.Peek || l.Key == "" || len(l.Key) > limit.MaxKeyLen ||
		strings.IndexByte(l.Key, '{') >= 0 || strings.IndexByte(l.Key, '}') >= 0 {
		return r.Validate()
	}
	sh := l
	sh.Key = ""
	known := validShapes.Load()
	if known != nil && slices.Contains(*known, sh) {
		return nil
	}
	if err := r.Validate(); err != nil {
		return err
	}
	validShapesMu.Lock()
	defer validShapesMu.Unlock()
	if known = validShapes.Load(); known == nil || len(*known) < maxValidShapes && !slices.Contains(*known, sh) {
		var next []Limit
		if known != nil {
			next = append(next, *known...)
		}
		next = append(next, sh)
		validShapes.Store(&next)
	}
	return nil
}

// validShapes holds limits (without their keys) known to be valid: a short
// list, copied on write, that requests read without a lock.
var (
	validShapes   atomic.Pointer[[]Limit]
	validShapesMu sync.Mutex
)

const maxValidShapes = 64

// Decision is the answer for one check: a store's answer to one Request,
// and, once the Limiter has decided the check, where it was decided and
// what holds its units.
type Decision struct {
	// Admitted is how many of the request's units were taken.
	Admitted int64
	// Allowed reports whether the whole cost was admitted.
	Allowed bool
	// Limit is the quota the answer refers to (Limit.Limit).
	Limit int64
	// Remaining is how many units would be admitted right after this call.
	Remaining int64
	// ResetAfter is when the limit is back to its full quota.
	ResetAfter time.Duration
	// RetryAfter is when Need units fit again, never earlier; 0 when allowed.
	RetryAfter time.Duration
	// Lease is what Refund gives back.
	Lease Lease
	// Unsure marks a failed take whose reply was lost after it was sent: it
	// may have run, and Lease names the members it would have added
	// (member-keeping algorithms only), to be removed whether it ran or not.
	Unsure bool
	// Source says where the Limiter decided the check (a store's own
	// answer is SourceStore).
	Source Source
	store  Store // holds the lease, for refunds and releases
	// allow holds the units of a leased check, put back on a refund
	// unless dropped since (epoch).
	allow *allowance
	epoch uint64
	// unseen is what this edge had admitted that the store's answer does
	// not count (ledger.observe): the fallback's admissions still owed, or
	// replayed on a call that had not run (holdBack).
	unseen int64
}

// holdBack is the store's answer d less what it does not count of this
// edge's admissions (unseen): the remaining it reports is short of them,
// and an admission that leaves less than them is denied, its units given
// back with the verdict's (Decide's all-or-nothing: its lease keeps them).
// The denial is not cached: the units it waits for may be refused and
// dropped. Reports whether it denied d.
func (d Decision) holdBack() (Decision, bool) {
	if d.unseen == 0 {
		return d, false
	}
	d.Remaining -= d.unseen
	if d.Remaining >= 0 {
		return d, false
	}
	d.Remaining = 0
	if !d.Allowed {
		return d, false
	}
	d.Allowed, d.Admitted, d.RetryAfter = false, 0, max(d.ResetAfter, time.Millisecond)
	return d, true
}

// from is d as decided by src, its lease held by s (nil: nothing to give
// back to a store).
func (d Decision) from(src Source, s Store) Decision {
	d.Source, d.store = src, s
	return d
}

// Lease identifies the units a Decision took, so that they can be given back
// (a refund after another limit denied, or a concurrency slot released).
type Lease struct {
	Limit Limit
	// id is the member prefix of sliding log and concurrency units; of a
	// tallied take (Request.post), who ran it, as its
	// script read it, so that giving it back comes off the tally too.
	id    string
	first int64 // index of the first member
	Units int64
	state int64 // window start for window algorithms
}

// tallied reports a lease from a tallied take (fixed or sliding window): its refund
// is tallied too.
func (l Lease) tallied() bool { return l.Limit.Algorithm.Spec().Tallied && l.id != "" }

// Split divides the lease into its first n units and the rest: coalesced
// callers hand each request its own share.
func (l Lease) Split(n int64) (head, tail Lease) {
	n = min(max(n, 0), l.Units)
	head, tail = l, l
	head.Units = n
	tail.first += n
	tail.Units -= n
	return head, tail
}

// Store counts. Take answers every request in one round trip per node; each
// request is decided on its own (Decide adds all-or-nothing). A request that
// could not be decided has its error in errs at the same index.
type Store interface {
	Take(ctx context.Context, reqs []Request) ([]Decision, error)
	Refund(ctx context.Context, leases []Lease) error
	// Shard names the node that owns a limit's keys, "" for a store on one
	// node: the Limiter keeps one breaker per shard.
	Shard(Limit) string
	// Remote reports whether calls cross the network, and so get the
	// Limiter's deadline (a memory store never blocks: no timer).
	Remote() bool
	// Refresh asks the store to find again where keys live (a Cluster's
	// slot map), before a breaker probe: a failed master's keys move to the
	// promoted replica. It does not wait.
	Refresh()
	// Probe reports whether the node holding a limit's keys answers,
	// counting nothing: a breaker's half-open probe.
	Probe(ctx context.Context, l Limit) error
}

// TakeError reports which requests of a Take could not be decided.
type TakeError struct {
	Errs []error // one per request, nil where it was decided
}

func (e *TakeError) Error() string {
	var b strings.Builder
	n := 0
	for i, err := range e.Errs {
		if err == nil {
			continue
		}
		if n == 0 {
			fmt.Fprintf(&b, "request %d: %v", i, err)
		}
		n++
	}
	if n > 1 {
		fmt.Fprintf(&b, " (and %d more)", n-1)
	}
	return b.String()
}

// Unwrap exposes the individual errors to errors.Is and errors.As.
func (e *TakeError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}
