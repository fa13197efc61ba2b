package limit

import "math"

// LeakyBucket is the shaping algorithm as a meter: a bucket of capacity
// Burst (or Limit) that leaks Limit units per Window; a request fits when
// level + cost ≤ capacity. Redis: a hash {l = level, t = last leak µs};
// memory: f = level, w = last leak.
var LeakyBucket = register(&Spec{
	Name:   "leaky_bucket",
	Script: "leaky_bucket",
	Keys:   []string{"lb"},
	Burst:  true,
	// Tallied: as TokenBucket.
	Tallied: true,
	Bucket:  true,
	Take:    leakyTake,
	Refund:  leakyRefund,
})

// leak brings the level to now; the rate is units per µs.
func leak(s *State, a Args, present bool) (level, rate, capacity float64) {
	rate = float64(a.Limit) / float64(a.Window)
	capacity = float64(a.Limit)
	if a.Extra > 0 {
		capacity = float64(a.Extra)
	}
	if present {
		level = math.Max(0, s.f-math.Max(0, float64(a.Now-s.w))*rate)
	}
	return level, rate, capacity
}

func leakyTake(s *State, a Args, present bool) Result {
	level, rate, capacity := leak(s, a, present)
	fits := func() int64 { return int64(math.Floor(capacity - level + 1e-9)) }
	admitted := max(0, min(a.Cost, fits()))
	admitted = whole(admitted, a.Need)
	if admitted > 0 {
		// The leak clock never goes back (a restore dated before the
		// last leak): the level is as of the later of the two.
		at := a.Now
		if present {
			at = max(at, s.w)
		}
		level += float64(admitted)
		s.f, s.w = level, at
		s.expires = at + max(1, msCeil(level/rate))*1000
	}
	var retry float64
	if admitted < a.Cost {
		if float64(a.Need) > capacity {
			retry = level / rate
		} else {
			retry = (level + float64(a.Need) - capacity) / rate
		}
	}
	return Result{admitted, max(0, fits()), msCeil(level / rate), msCeil(retry), 0}
}

// leakyRefund lowers the stored level and leaves its time: a refund never
// moves the leak clock (the refund's clock may differ from the take's).
func leakyRefund(s *State, a Args) bool {
	s.f = math.Max(0, s.f-float64(a.Cost))
	return s.f > 0
}
