package limit

import (
	"fmt"
	"time"
)

// Algorithm selects how a Limit counts: an index into the registry. The zero
// value is no algorithm.
type Algorithm uint8

// Spec is everything edgeguard knows about one algorithm. Each algorithm's
// file registers one; nothing else in edgeguard switches on algorithms.
type Spec struct {
	// Name is the algorithm's name in rule documents, metrics and logs.
	Name string
	// Script is the name of its Redis script in package lua; Keys are the
	// suffixes of the Redis keys it uses, after "<prefix>{<key>}:" (all in
	// one hash slot).
	Script string
	Keys   []string
	// Burst: Limit.Burst is the capacity (RateLimit q). MinInterval:
	// Limit.MinInterval applies. Both are refused on other algorithms.
	Burst, MinInterval bool
	// Members: the Redis state keeps one member per admitted unit, so each
	// call carries a unique id and MaxLimit bounds the key's size.
	Members bool
	// Leasable: units may be carved ahead in batches and spent by an edge
	// on its own (the limiter's leased checks): a take with need 1 admits
	// up to a batch atomically, and when a carved unit is spent later
	// than carved the error stays bounded (package limiter, lease.go).
	Leasable bool
	// Held: units are held while a request runs and released when its
	// response ends (concurrency). Never cached as over limit; the
	// RateLimit-Policy item has no window.
	Held bool
	// Tallied: a take made after a sign that the key's master may have
	// changed is tallied for the server that runs it, per window start
	// (Result.State), and a restore there of an answer another server
	// gave adds that window's tally, so it does not absorb what was
	// admitted there since (lua/tally.lua). The script's ARGV[8] says
	// whether a call is tallied.
	Tallied bool
	// Bucket: the state is a level that drains as time passes, not counts
	// per window (Result.State is always 0). Its tally is one count per
	// server, kept a window past its last tallied take, and a take is
	// tallied for a while after a sign whatever window it falls in.
	Bucket bool
	// MaxLimit and MinWindow narrow the shared bounds, with the reason
	// appended to the error message.
	MaxLimit                  int64
	MaxLimitWhy, MinWindowWhy string
	MinWindow                 time.Duration
	// MaxWindow widens the shared MaxWindow: a fixed window's state is one
	// counter whatever its length, so it can count per week, month or year
	// (the units of Envoy's rate limit service).
	MaxWindow time.Duration
	// Check reports algorithm-specific problems of an otherwise valid limit.
	Check func(Limit) []Problem

	// Take and Refund are the algorithm over process memory, mirroring the
	// script. present says whether st held a live value; Refund reports
	// whether the key should be kept.
	Take   func(st *State, a Args, present bool) Result
	Refund func(st *State, a Args) bool
}

var registry = []*Spec{nil} // index 0: no algorithm

// register adds an algorithm; called from package-level variables, once per
// algorithm file.
func register(s *Spec) Algorithm {
	if s.Name == "" || s.Script == "" || len(s.Keys) == 0 || s.Take == nil || s.Refund == nil {
		panic(fmt.Sprintf("limit: incomplete algorithm spec %q", s.Name))
	}
	for _, o := range registry[1:] {
		if o.Name == s.Name {
			panic(fmt.Sprintf("limit: algorithm %q registered twice", s.Name))
		}
	}
	registry = append(registry, s)
	return Algorithm(len(registry) - 1)
}

// Spec returns the algorithm's description, nil for an unknown one.
func (a Algorithm) Spec() *Spec {
	if a == 0 || int(a) >= len(registry) {
		return nil
	}
	return registry[a]
}

// Valid reports whether a names a registered algorithm.
func (a Algorithm) Valid() bool { return a.Spec() != nil }

func (a Algorithm) String() string {
	if s := a.Spec(); s != nil {
		return s.Name
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// MarshalText renders the algorithm's name (JSON, /debug/rules).
func (a Algorithm) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// All lists every registered algorithm.
func All() []Algorithm {
	out := make([]Algorithm, 0, len(registry)-1)
	for i := 1; i < len(registry); i++ {
		out = append(out, Algorithm(i))
	}
	return out
}

// LeasableNames lists the names of the algorithms that can be leased.
func LeasableNames() []string { return namesWith(func(s *Spec) bool { return s.Leasable }) }

// Names lists the algorithms' names, in registration order.
func Names() []string { return namesWith(func(*Spec) bool { return true }) }

func namesWith(keep func(*Spec) bool) []string {
	var out []string
	for _, s := range registry[1:] {
		if keep(s) {
			out = append(out, s.Name)
		}
	}
	return out
}

// Parse maps an algorithm's name to the Algorithm.
func Parse(name string) (Algorithm, error) {
	for i, s := range registry[1:] {
		if s.Name == name {
			return Algorithm(i + 1), nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownAlgorithm, name)
}
