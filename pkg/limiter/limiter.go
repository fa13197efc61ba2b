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
	"strings"
	"time"
)

// Algorithm selects how a Limit counts.
type Algorithm uint8

// The algorithms. Their Redis state and semantics are described in lua/.
const (
	SlidingLog    Algorithm = iota + 1 // exact: at most Limit units in any Window
	SlidingWindow                      // two counters, prev·(W−elapsed)/W + cur
	TokenBucket                        // GCRA: Limit per Window, Burst capacity
	FixedWindow                        // one counter per epoch-aligned window
	Concurrency                        // in-flight units; Window is the stale-slot TTL
)

var algorithmNames = [...]string{
	SlidingLog:    "sliding_log",
	SlidingWindow: "sliding_window",
	TokenBucket:   "token_bucket",
	FixedWindow:   "fixed_window",
	Concurrency:   "concurrency",
}

func (a Algorithm) String() string {
	if a.valid() {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

func (a Algorithm) valid() bool { return a >= SlidingLog && a <= Concurrency }

// ParseAlgorithm maps a rule's algorithm name to an Algorithm.
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, name := range algorithmNames {
		if name != "" && name == s {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownAlgorithm, s)
}

// Errors callers act on.
var (
	ErrUnknownAlgorithm = errors.New("unknown algorithm")
	ErrInvalidLimit     = errors.New("invalid limit")
	ErrInvalidRequest   = errors.New("invalid request")
)

// maxExactWindowProduct keeps limit·window(ms) exact in a Lua double.
const maxExactWindowProduct = 1 << 53

// Limit is one counted thing: a key and the rule that governs it.
type Limit struct {
	// Key identifies what is counted (a rule id plus a hash of descriptor
	// values). It becomes the Redis hash tag, so it must not contain braces.
	Key       string
	Algorithm Algorithm
	// Limit is the quota: units per Window (rate for TokenBucket, slots for
	// Concurrency).
	Limit int64
	// Window is the period of the quota, or a Concurrency slot's TTL, which
	// must exceed the longest request.
	Window time.Duration
	// Burst is a TokenBucket's capacity; 0 means Limit.
	Burst int64
	// MinInterval is the least time between two SlidingLog admissions.
	MinInterval time.Duration
}

// Capacity is the most units the limit can hold at once.
func (l Limit) Capacity() int64 {
	if l.Algorithm == TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Limit
}

// Validate reports every problem with l.
func (l Limit) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidLimit, fmt.Sprintf(format, args...)))
	}
	switch {
	case l.Key == "":
		bad("key is empty")
	case len(l.Key) > 512:
		bad("key is %d bytes, more than 512", len(l.Key))
	case strings.ContainsAny(l.Key, "{}"):
		bad("key %q contains a brace", l.Key)
	}
	if !l.Algorithm.valid() {
		errs = append(errs, fmt.Errorf("%w: %s", ErrUnknownAlgorithm, l.Algorithm))
	}
	if l.Limit <= 0 || l.Limit > 1e9 {
		bad("limit must be in 1..1e9 (got %d)", l.Limit)
	}
	if l.Window < time.Millisecond {
		bad("window must be at least 1ms (got %s)", l.Window)
	} else if l.Algorithm == SlidingWindow && l.Limit > 0 && l.Limit > maxExactWindowProduct/l.Window.Milliseconds() {
		bad("limit × window in ms must stay below 2^53 for sliding_window (got %d × %d)", l.Limit, l.Window.Milliseconds())
	}
	if l.Burst < 0 || (l.Burst != 0 && l.Algorithm != TokenBucket) {
		bad("burst must be ≥ 0 and is for token_bucket only (got %d on %s)", l.Burst, l.Algorithm)
	}
	if l.MinInterval < 0 || (l.MinInterval != 0 && l.Algorithm != SlidingLog) || (l.MinInterval > 0 && l.MinInterval >= l.Window) {
		bad("min_interval must be ≥ 0, below the window, and is for sliding_log only (got %s on %s)", l.MinInterval, l.Algorithm)
	}
	return errors.Join(errs...)
}

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
}

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
	return errors.Join(errs...)
}

// Decision is a store's answer to one Request.
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
}

// Lease identifies the units a Decision took, so that they can be given back
// (a refund after another limit denied, or a concurrency slot released).
type Lease struct {
	Limit Limit
	id    string // member prefix for sliding log and concurrency units
	first int64  // index of the first member
	Units int64
	state int64 // window start for window algorithms
}

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

// Result is the answer for one client request with all its limits.
type Result struct {
	Allowed   bool
	Decisions []Decision
}

// Decide takes every limit of one request and makes it all-or-nothing: if any
// limit admits less than its cost, everything taken is given back (a second
// call, made only on denials) and the request is denied. On a store error,
// whatever was taken is given back too and the error is returned, so the
// caller can decide elsewhere without having counted twice.
func Decide(ctx context.Context, s Store, reqs []Request) (Result, error) {
	ds, err := s.Take(ctx, reqs)
	allowed := err == nil
	for _, d := range ds {
		allowed = allowed && d.Allowed
	}
	if allowed {
		return Result{Allowed: true, Decisions: ds}, nil
	}
	leases := make([]Lease, 0, len(ds))
	for _, d := range ds {
		if d.Admitted > 0 {
			leases = append(leases, d.Lease)
		}
	}
	if len(leases) > 0 {
		if rerr := s.Refund(ctx, leases); rerr != nil {
			err = errors.Join(err, fmt.Errorf("refunding: %w", rerr))
		}
	}
	return Result{Decisions: ds}, err
}
