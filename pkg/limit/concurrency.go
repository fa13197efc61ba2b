package limit

import "time"

// Concurrency counts requests in flight: a unit is held from admission until
// the response ends; Window is how long a leaked unit (a crashed edge) stays
// before it goes stale. Redis: a ZSET of held units, score = stale time.
var Concurrency = register(&Spec{
	Name:         "concurrency",
	Script:       "concurrency",
	Keys:         []string{"cc"},
	Members:      true,
	Held:         true,
	MaxLimit:     MaxMembers,
	MaxLimitWhy:  ": one Redis member per request in flight",
	MinWindow:    time.Second,
	MinWindowWhy: ": for concurrency the window is the stale-slot TTL",
	Take:         concurrencyTake,
	Refund:       func(s *State, a Args) bool { return s.zrem(a) },
})

// concurrencyRetryCap bounds a denial's retry time: a slot is usually freed
// by a response ending, long before the oldest slot goes stale.
const concurrencyRetryCap = 1_000_000 // µs

func concurrencyTake(s *State, a Args, _ bool) Result {
	s.zremUpTo(a.Now)
	n := int64(len(s.log))
	admitted := max(0, min(a.Cost, a.Limit-n))
	admitted = whole(admitted, a.Need)
	if admitted > 0 {
		s.zadd(a.Now+a.Window, a, admitted)
		s.expires = a.Now + msCeil(float64(a.Window))*1000
		n += admitted
	}
	var reset int64
	if n > 0 {
		reset = s.log[0].score - a.Now
	}
	var retry int64
	if admitted < a.Cost {
		retry = min(reset, concurrencyRetryCap)
	}
	return Result{admitted, max(0, a.Limit-n), msCeil(float64(reset)), msCeil(float64(retry)), 0}
}
