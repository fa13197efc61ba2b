package limit

// SlidingLog is exact: at most Limit units in any Window, optionally
// MinInterval apart (Guan, Alg. 4). Redis: a ZSET, one member per admitted
// unit, score = admission time (µs).
var SlidingLog = register(&Spec{
	Name:        "sliding_log",
	Script:      "sliding_log",
	Keys:        []string{"sl"},
	MinInterval: true,
	Members:     true,
	MaxLimit:    MaxMembers,
	MaxLimitWhy: ": the log keeps one Redis member per admitted request",
	Take:        slidingLogTake,
	Refund:      func(s *State, a Args) bool { return s.zrem(a) },
})

func slidingLogTake(s *State, a Args, _ bool) Result {
	s.zremUpTo(a.Now - a.Window)
	n := int64(len(s.log))
	admitted := max(0, min(a.Cost, a.Limit-n))
	var last *int64
	if a.Extra > 0 && n > 0 {
		last = &s.log[n-1].score
	}
	if a.Extra > 0 && admitted > 0 {
		if last != nil && a.Now-*last < a.Extra {
			admitted = 0
		} else {
			admitted = min(admitted, a.Need)
		}
	}
	admitted = whole(admitted, a.Need)
	if admitted > 0 {
		s.zadd(a.Now, a, admitted)
		// A take dated before the newest member (a restore, a replay)
		// leaves the key as long-lived as it was, as Redis's TTL, set
		// from Redis's time, does.
		s.expires = max(s.expires, a.Now+msCeil(float64(a.Window))*1000)
		n += admitted
		now := a.Now
		last = &now
	}
	var reset int64
	if n > 0 {
		reset = s.log[n-1].score + a.Window - a.Now
	}
	var retry int64
	if admitted < a.Cost {
		switch {
		case a.Need > a.Limit:
			retry = reset
		case n+a.Need > a.Limit:
			retry = s.log[n+a.Need-a.Limit-1].score + a.Window - a.Now
		}
		if a.Extra > 0 && last != nil {
			retry = max(retry, *last+a.Extra-a.Now)
		}
	}
	return Result{admitted, max(0, a.Limit-n), msCeil(float64(reset)), msCeil(float64(retry)), 0}
}
