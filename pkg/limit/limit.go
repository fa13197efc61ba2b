// Package limit says what is counted and how: a Limit (key, algorithm, quota,
// window) and the registry of algorithms.
//
// Each algorithm registers, in a file of its own, everything the rest of
// edgeguard needs of it: its name in rule documents, its Redis script and key
// suffixes, its bounds, what the RateLimit fields mean for it, and its
// implementation over process memory, which mirrors the script step by step
// (the limiter's differential tests hold the two to identical answers).
//
// The package does no I/O, so rule validation (package rules) and the limiter
// (package limiter) share one definition of a valid limit: a rule that
// validates is a rule the limiter can decide.
package limit

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Bounds every algorithm shares. An algorithm may narrow them (Spec.MaxLimit,
// Spec.MinWindow, Spec.Check).
const (
	MaxLimit  = 1_000_000_000
	MinWindow = time.Millisecond
	MaxWindow = 24 * time.Hour
	// MaxMembers caps the limit of algorithms that keep one Redis member per
	// unit (sliding log, concurrency): one key holds at most this many
	// members, ~10 MB of Redis memory (BENCHMARKS.md: ~100 B per member).
	MaxMembers = 100_000
	// MaxKeyLen bounds a key: it becomes part of every Redis key name.
	MaxKeyLen = 512
	// MinTolerance and MaxTolerance bound a leased limit's tolerance: the
	// share of the limit its edges may admit beyond it per window.
	MinTolerance = 0.001
	MaxTolerance = 0.5
)

// Errors callers act on.
var (
	ErrUnknownAlgorithm = errors.New("unknown algorithm")
	ErrInvalidLimit     = errors.New("invalid limit")
)

// Limit is one counted thing: a key and the rule that governs it.
type Limit struct {
	// Key identifies what is counted (a rule id plus a hash of descriptor
	// values). It becomes the Redis hash tag, so it must not contain braces.
	Key       string
	Algorithm Algorithm
	// Limit is the quota: units per Window (the leak or refill rate of the
	// buckets, slots for concurrency).
	Limit int64
	// Window is the period of the quota, or a concurrency slot's TTL, which
	// must exceed the longest request. Whole milliseconds.
	Window time.Duration
	// Burst is a bucket's capacity (Spec.Burst algorithms); 0 means Limit.
	Burst int64
	// MinInterval is the least time between two admissions
	// (Spec.MinInterval algorithms).
	MinInterval time.Duration
}

// Capacity is the most units the limit can hold at once: the RateLimit
// policy's q, and the most one request may cost.
func (l Limit) Capacity() int64 {
	if sp := l.Algorithm.Spec(); sp != nil && sp.Burst && l.Burst > 0 {
		return l.Burst
	}
	return l.Limit
}

// Problem is one thing wrong with a limit, named by the rule field it comes
// from (algorithm, limit, window, burst, min_interval, cost).
type Problem struct {
	Field, Msg string
}

func (p Problem) Error() string { return p.Field + ": " + p.Msg }

// Problems reports everything wrong with l but its key: the one definition
// of a limit the limiter can decide. Rule validation reports these by field.
func (l Limit) Problems() []Problem {
	var ps []Problem
	add := func(field, format string, args ...any) {
		ps = append(ps, Problem{field, fmt.Sprintf(format, args...)})
	}
	sp := l.Algorithm.Spec()
	if sp == nil {
		add("algorithm", "unknown %s (want one of %s)", l.Algorithm, strings.Join(Names(), ", "))
		sp = &Spec{}
	}
	maxLimit := int64(MaxLimit)
	if sp.MaxLimit > 0 {
		maxLimit = sp.MaxLimit
	}
	switch {
	case l.Limit <= 0:
		add("limit", "must be > 0 (got %d)", l.Limit)
	case l.Limit > maxLimit:
		add("limit", "must be <= %d for %s (got %d)%s", maxLimit, sp.Name, l.Limit, sp.MaxLimitWhy)
	}
	minWindow := max(MinWindow, sp.MinWindow)
	w := l.Window
	maxWindow := max(MaxWindow, sp.MaxWindow)
	switch {
	case w < minWindow:
		add("window", "must be >= %s for %s (got %s)%s", minWindow, sp.Name, w, sp.MinWindowWhy)
	case w > maxWindow:
		add("window", "must be <= %s (got %s)", maxWindow, w)
	case w%time.Millisecond != 0:
		add("window", "must be whole milliseconds (got %s)", w)
	}
	switch {
	case l.Burst < 0:
		add("burst", "must be >= 0 (got %d)", l.Burst)
	case l.Burst > MaxLimit:
		add("burst", "must be <= %d (got %d)", MaxLimit, l.Burst)
	case l.Burst != 0 && !sp.Burst:
		add("burst", "only valid for %s (algorithm is %s)", strings.Join(namesWith(func(s *Spec) bool { return s.Burst }), ", "), sp.Name)
	}
	mi := l.MinInterval
	switch {
	case mi < 0:
		add("min_interval", "must be >= 0 (got %s)", mi)
	case mi > 0 && !sp.MinInterval:
		add("min_interval", "only valid for %s (algorithm is %s)", strings.Join(namesWith(func(s *Spec) bool { return s.MinInterval }), ", "), sp.Name)
	case mi > 0 && mi >= w:
		add("min_interval", "must be < window %s (got %s)", w, mi)
	}
	if len(ps) == 0 && sp.Check != nil {
		ps = append(ps, sp.Check(l)...)
	}
	return ps
}

// CostProblem reports a request cost the limit could never admit.
func (l Limit) CostProblem(cost int64) *Problem {
	switch c := l.Capacity(); {
	case cost < 1:
		return &Problem{"cost", fmt.Sprintf("must be >= 1 (got %d)", cost)}
	case cost > c:
		return &Problem{"cost", fmt.Sprintf("must be <= capacity %d (got %d): such a request could never be admitted", c, cost)}
	}
	return nil
}

// Validate reports every problem with l, its key included, as errors that
// match ErrInvalidLimit (ErrUnknownAlgorithm for the algorithm).
func (l Limit) Validate() error {
	var errs []error
	switch {
	case l.Key == "":
		errs = append(errs, fmt.Errorf("%w: key is empty", ErrInvalidLimit))
	case len(l.Key) > MaxKeyLen:
		errs = append(errs, fmt.Errorf("%w: key is %d bytes, more than %d", ErrInvalidLimit, len(l.Key), MaxKeyLen))
	case strings.ContainsAny(l.Key, "{}"):
		errs = append(errs, fmt.Errorf("%w: key %q contains a brace", ErrInvalidLimit, l.Key))
	}
	for _, p := range l.Problems() {
		if p.Field == "algorithm" {
			errs = append(errs, fmt.Errorf("%w: %s", ErrUnknownAlgorithm, p.Msg))
			continue
		}
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidLimit, p))
	}
	return errors.Join(errs...)
}
