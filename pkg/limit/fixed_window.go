package limit

import "time"

// FixedWindow is the cheapest: one counter per epoch-aligned window, so it
// admits up to 2×Limit across a window boundary. Redis: a hash whose field
// is the window's start (ms) and value its count; memory: the same pair.
var FixedWindow = register(&Spec{
	Name:    "fixed_window",
	Script:  "fixed_window",
	Keys:    []string{"fw"},
	Tallied: true,
	// A year of 366 days: Envoy's longest unit, with a leap day to spare.
	MaxWindow: 366 * 24 * time.Hour,
	// Leasable: a window's carved units expire with it.
	Leasable: true,
	Take:     fixedWindowTake,
	Refund: func(s *State, a Args) bool {
		if s.w == a.State {
			s.n = max(0, s.n-a.Cost)
		}
		return true
	},
})

func fixedWindowTake(s *State, a Args, present bool) Result {
	W := a.Window / 1000
	nowms := a.Now / 1000
	ws := windowStart(nowms, W)
	var n int64
	if present && s.w >= ws {
		ws, n = s.w, s.n
	}
	admitted := max(0, min(a.Cost, a.Limit-n))
	admitted = whole(admitted, a.Need)
	if admitted > 0 {
		n += admitted
		s.w, s.n = ws, n
		s.expires = (ws + W) * 1000
	}
	reset := ws + W - nowms
	var retry int64
	if admitted < a.Cost && (a.Need > a.Limit || n+a.Need > a.Limit) {
		retry = reset
	}
	return Result{admitted, max(0, a.Limit-n), reset, retry, ws}
}
