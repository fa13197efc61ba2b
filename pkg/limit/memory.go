package limit

import (
	"math"
	"sort"
	"strconv"
)

// Args are one script call's inputs, in the units the scripts use (µs), as
// the prelude of package lua reads them.
type Args struct {
	Now, Limit, Window, Extra int64
	// Dated: the caller gave Now (a restore, a replay), which may be
	// before the state's last write (the script's dated).
	Dated bool
	// ID prefixes the members a call adds (Spec.Members algorithms).
	ID string
	// Take: Cost units, admitted in whole multiples of Need.
	Cost, Need int64
	// Refund: Cost units, State as the take returned it, First member index.
	State, First int64
}

// ArgsFor fills the limit's part of a call: now (µs), limit, window, extra.
func ArgsFor(l Limit, nowUs int64) Args {
	a := Args{Now: nowUs, Limit: l.Limit, Window: l.Window.Microseconds(), First: 1}
	switch sp := l.Algorithm.Spec(); {
	case sp == nil:
	case sp.Burst:
		a.Extra = l.Burst
	case sp.MinInterval:
		a.Extra = l.MinInterval.Microseconds()
	}
	return a
}

// Result is what a take returns: {admitted, remaining, reset, retry, state}.
type Result struct {
	Admitted, Remaining int64
	ResetMs, RetryMs    int64
	State               int64
}

// State is one key's memory, shaped like its Redis value. Its fields are
// slots the algorithms share: each algorithm's file says what it keeps where.
type State struct {
	log     []member // ZSET algorithms: sorted by (score, name)
	w, n    int64    // integers: a window start (ms) and count, a timestamp
	pn, pe  int64    // more integers: sliding window's previous count and its expiry
	f       float64  // a float (a TAT, a level): each algorithm says
	expires int64    // µs; mirrors the Redis key's TTL: past it the key is absent
}

// Expired reports whether the key has expired at now (µs).
func (s *State) Expired(nowUs int64) bool { return nowUs >= s.expires }

type member struct {
	score int64
	name  string
}

// whole rounds admitted units down to whole requests of need units.
func whole(admitted, need int64) int64 { return admitted - admitted%need }

func msCeil(us float64) int64 {
	if us <= 0 {
		return 0
	}
	return int64(math.Ceil(us / 1000))
}

func memberName(id string, i int64) string { return id + ":" + strconv.FormatInt(i, 10) }

func (s *State) zadd(score int64, a Args, n int64) {
	for i := int64(1); i <= n; i++ {
		m := member{score, memberName(a.ID, i)}
		at := sort.Search(len(s.log), func(j int) bool {
			o := s.log[j]
			return o.score > m.score || (o.score == m.score && o.name >= m.name)
		})
		s.log = append(s.log, member{})
		copy(s.log[at+1:], s.log[at:])
		s.log[at] = m
	}
}

// zrem removes the units a refund gives back.
func (s *State) zrem(a Args) bool {
	drop := make(map[string]bool, a.Cost)
	for i := a.First; i < a.First+a.Cost; i++ {
		drop[memberName(a.ID, i)] = true
	}
	kept := s.log[:0]
	for _, m := range s.log {
		if !drop[m.name] {
			kept = append(kept, m)
		}
	}
	s.log = kept
	return true
}

// zremUpTo drops members with score ≤ max (ZREMRANGEBYSCORE -inf max).
func (s *State) zremUpTo(max int64) {
	i := sort.Search(len(s.log), func(j int) bool { return s.log[j].score > max })
	s.log = append(s.log[:0], s.log[i:]...)
}

// windowStart aligns now (ms) to the epoch-aligned window of W ms.
func windowStart(nowms, W int64) int64 { return nowms - nowms%W }

// floorDiv is Lua's math.floor(a / b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
