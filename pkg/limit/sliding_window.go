package limit

import "fmt"

// SlidingWindow is Cloudflare's sliding window counter:
// prev·(W−elapsed)/W + cur ≤ limit. Redis: a hash {w = window start ms,
// n = count} for the current window and a counter for the previous one.
// Memory: w, n as in Redis; pn, pe the previous count and its expiry (ms).
var SlidingWindow = register(&Spec{
	Name:    "sliding_window",
	Script:  "sliding_window",
	Keys:    []string{"sw:cur", "sw:prev"},
	Tallied: true,
	Check: func(l Limit) []Problem {
		// The script computes limit·W exactly in a double.
		if ms := l.Window.Milliseconds(); l.Limit > maxExact/ms {
			return []Problem{{"limit", fmt.Sprintf("limit × window in ms must stay below 2^53 for sliding_window (got %d × %d)", l.Limit, ms)}}
		}
		return nil
	},
	Take:   slidingWindowTake,
	Refund: slidingWindowRefund,
})

// slidingWindowBefore is a dated take for a window before the stored one (a
// restore, or a replay of units admitted then), as the script runs it: it
// counts in its own window, as of then. The window just before the stored
// one is its previous count (pn), which still weighs on it; an older one
// weighs on nothing any more.
func slidingWindowBefore(s *State, a Args, ws, W, nowms, pn int64) Result {
	var n int64
	prev := s.w == ws+W
	if prev {
		n = pn
	}
	admitted := whole(max(0, min(a.Cost, a.Limit-n)), a.Need)
	if admitted > 0 && prev {
		s.pn, s.pe = n+admitted, s.w+W
	}
	reset := ws + 2*W - nowms
	var retry int64
	if admitted < a.Cost {
		retry = reset
	}
	return Result{admitted, max(0, a.Limit-n-admitted), reset, retry, ws}
}

// maxExact is the largest integer every double below it represents exactly.
const maxExact = 1 << 53

func slidingWindowTake(s *State, a Args, present bool) Result {
	W := a.Window / 1000
	nowms := a.Now / 1000
	ws := windowStart(nowms, W)
	cn, pn := s.n, s.pn
	if nowms >= s.pe {
		pn = 0
	}
	if a.Dated && present && s.w > ws {
		return slidingWindowBefore(s, a, ws, W, nowms, pn)
	}
	switch {
	case !present:
		cn, pn = 0, 0
	case s.w > ws:
		ws = s.w
	case s.w < ws:
		if s.w == ws-W {
			pn = cn
		} else {
			pn = 0
		}
		cn = 0
	}
	e := max(0, nowms-ws)
	fits := func(c int64) int64 {
		num := a.Limit*W - pn*(W-e)
		if num < 0 {
			return -c
		}
		return num/W - c
	}
	admitted := max(0, min(a.Cost, fits(cn)))
	admitted = whole(admitted, a.Need)
	if admitted > 0 {
		cn += admitted
		s.w, s.n = ws, cn
		s.expires = (ws + 2*W) * 1000
		s.pn, s.pe = pn, ws+W
	}
	var reset int64
	if cn > 0 {
		reset = ws + 2*W - nowms
	} else if pn > 0 {
		reset = ws + W - nowms
	}
	var retry int64
	if admitted < a.Cost {
		room := a.Limit - cn - a.Need
		switch {
		case a.Need > a.Limit:
			retry = reset
		case room >= 0 && pn > 0 && room*W/pn > 0:
			retry = max(0, (W-e)-room*W/pn)
		case room >= 0 && pn == 0:
			retry = 0
		case cn == 0:
			retry = W - e
		default:
			retry = (W - e) + max(0, W-floorDiv((a.Limit-a.Need)*W, cn))
		}
	}
	return Result{admitted, max(0, fits(cn)), reset, retry, ws}
}

func slidingWindowRefund(s *State, a Args) bool {
	W := a.Window / 1000
	switch {
	case s.w == a.State:
		s.n = max(0, s.n-a.Cost)
	case s.w == a.State+W && s.pn > 0 && a.Now/1000 < s.pe:
		s.pn = max(0, s.pn-a.Cost)
	}
	return true
}
