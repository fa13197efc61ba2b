package limit

import (
	"fmt"
	"math"
)

// TokenBucket is GCRA: Limit units per Window steady rate, Burst capacity,
// in one number per key, the theoretical arrival time (TAT, µs; memory: f).
var TokenBucket = register(&Spec{
	Name:   "token_bucket",
	Script: "gcra",
	Keys:   []string{"tb"},
	Burst:  true,
	// Tallied after a sign of a master change (lua/tally.lua): an
	// edge that moves over late would otherwise raise the new master's
	// level to its last answer and absorb what the others took there.
	Tallied: true,
	Bucket:  true,
	// Leasable: carved tokens are spent within tolerance × window.
	Leasable: true,
	Check: func(l Limit) []Problem {
		// The TAT is a double near 2^51 µs: an emission interval below
		// 1 µs would vanish when added to it and nothing would count.
		if l.Limit > l.Window.Microseconds() {
			return []Problem{{"limit", fmt.Sprintf("must be <= one per µs of window for token_bucket (got %d per %s)", l.Limit, l.Window)}}
		}
		return nil
	},
	Take:   gcraTake,
	Refund: gcraRefund,
})

func gcraParams(a Args) (T, capacity, tau float64) {
	T = float64(a.Window) / float64(a.Limit)
	capacity = float64(a.Limit)
	if a.Extra > 0 {
		capacity = float64(a.Extra)
	}
	return T, capacity, capacity * T
}

func gcraTake(s *State, a Args, present bool) Result {
	T, capacity, tau := gcraParams(a)
	now := float64(a.Now)
	tat := s.f
	if !present || tat < now {
		tat = now
	}
	fits := func() int64 { return int64(math.Floor((tau-(tat-now))/T + 1e-9)) }
	admitted := max(0, min(a.Cost, fits()))
	admitted = whole(admitted, a.Need)
	if admitted > 0 {
		tat += float64(admitted) * T
		s.f = tat
		s.expires = a.Now + max(1, msCeil(tat-now))*1000
	}
	var retry float64
	if admitted < a.Cost {
		if float64(a.Need) > capacity {
			retry = tat - now
		} else {
			retry = tat + float64(a.Need)*T - tau - now
		}
	}
	return Result{admitted, max(0, fits()), msCeil(tat - now), msCeil(retry), 0}
}

func gcraRefund(s *State, a Args) bool {
	T, _, _ := gcraParams(a)
	s.f -= float64(a.Cost) * T
	if s.f > float64(a.Now) {
		s.expires = a.Now + max(1, msCeil(s.f-float64(a.Now)))*1000
		return true
	}
	return false
}
