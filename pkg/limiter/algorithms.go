package limiter

import (
	"math"
	"sort"
	"strconv"
)

// The algorithms over process memory. Each function mirrors its script in lua/
// step by step (same integer ms arithmetic, same float expressions), so the
// differential tests can hold the two to identical answers.

// args are one call's inputs, in the units the scripts use (µs).
type args struct {
	now, limit, window, extra int64
	id                        string
	cost, need                int64 // take
	state, first              int64 // refund
}

// outcome is what a take returns: {admitted, remaining, reset, retry, state}.
type outcome struct {
	admitted, remaining int64
	resetMs, retryMs    int64
	state               int64
}

// state is one key's memory, shaped like its Redis value. expires mirrors the
// key's TTL: past it the key reads as absent.
type state struct {
	log      []member // sliding log, concurrency: sorted by (score, name)
	w, n     int64    // window start (ms) and count: fixed and sliding window
	pn, pexp int64    // sliding window: previous count and its expiry (ms)
	tat      float64  // GCRA
	expires  int64    // µs
}

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

func (s *state) zadd(score int64, a args, n int64) {
	for i := int64(1); i <= n; i++ {
		m := member{score, memberName(a.id, i)}
		at := sort.Search(len(s.log), func(j int) bool {
			o := s.log[j]
			return o.score > m.score || (o.score == m.score && o.name >= m.name)
		})
		s.log = append(s.log, member{})
		copy(s.log[at+1:], s.log[at:])
		s.log[at] = m
	}
}

func (s *state) zrem(a args) {
	drop := make(map[string]bool, a.cost)
	for i := a.first; i < a.first+a.cost; i++ {
		drop[memberName(a.id, i)] = true
	}
	kept := s.log[:0]
	for _, m := range s.log {
		if !drop[m.name] {
			kept = append(kept, m)
		}
	}
	s.log = kept
}

// zremUpTo drops members with score ≤ max (ZREMRANGEBYSCORE -inf max).
func (s *state) zremUpTo(max int64) {
	i := sort.Search(len(s.log), func(j int) bool { return s.log[j].score > max })
	s.log = append(s.log[:0], s.log[i:]...)
}

func slidingLogTake(s *state, a args) outcome {
	s.zremUpTo(a.now - a.window)
	n := int64(len(s.log))
	admitted := max(0, min(a.cost, a.limit-n))
	var last *int64
	if a.extra > 0 && n > 0 {
		last = &s.log[n-1].score
	}
	if a.extra > 0 && admitted > 0 {
		if last != nil && a.now-*last < a.extra {
			admitted = 0
		} else {
			admitted = min(admitted, a.need)
		}
	}
	admitted = whole(admitted, a.need)
	if admitted > 0 {
		s.zadd(a.now, a, admitted)
		s.expires = a.now + msCeil(float64(a.window))*1000
		n += admitted
		now := a.now
		last = &now
	}
	var reset int64
	if n > 0 {
		reset = s.log[n-1].score + a.window - a.now
	}
	var retry int64
	if admitted < a.cost {
		switch {
		case a.need > a.limit:
			retry = reset
		case n+a.need > a.limit:
			retry = s.log[n+a.need-a.limit-1].score + a.window - a.now
		}
		if a.extra > 0 && last != nil {
			retry = max(retry, *last+a.extra-a.now)
		}
	}
	return outcome{admitted, max(0, a.limit-n), msCeil(float64(reset)), msCeil(float64(retry)), 0}
}

func concurrencyTake(s *state, a args) outcome {
	s.zremUpTo(a.now)
	n := int64(len(s.log))
	admitted := max(0, min(a.cost, a.limit-n))
	admitted = whole(admitted, a.need)
	if admitted > 0 {
		s.zadd(a.now+a.window, a, admitted)
		s.expires = a.now + msCeil(float64(a.window))*1000
		n += admitted
	}
	var reset int64
	if n > 0 {
		reset = s.log[0].score - a.now
	}
	var retry int64
	if admitted < a.cost {
		retry = min(reset, 1000000)
	}
	return outcome{admitted, max(0, a.limit-n), msCeil(float64(reset)), msCeil(float64(retry)), 0}
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

func slidingWindowTake(s *state, a args, present bool) outcome {
	W := a.window / 1000
	nowms := a.now / 1000
	ws := windowStart(nowms, W)
	cn, pn := s.n, s.pn
	if nowms >= s.pexp {
		pn = 0
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
		num := a.limit*W - pn*(W-e)
		if num < 0 {
			return -c
		}
		return num/W - c
	}
	admitted := max(0, min(a.cost, fits(cn)))
	admitted = whole(admitted, a.need)
	if admitted > 0 {
		cn += admitted
		s.w, s.n = ws, cn
		s.expires = (ws + 2*W) * 1000
		s.pn, s.pexp = pn, ws+W
	}
	var reset int64
	if cn > 0 {
		reset = ws + 2*W - nowms
	} else if pn > 0 {
		reset = ws + W - nowms
	}
	var retry int64
	if admitted < a.cost {
		room := a.limit - cn - a.need
		switch {
		case a.need > a.limit:
			retry = reset
		case room >= 0 && pn > 0 && room*W/pn > 0:
			retry = max(0, (W-e)-room*W/pn)
		case room >= 0 && pn == 0:
			retry = 0
		case cn == 0:
			retry = W - e
		default:
			retry = (W - e) + max(0, W-floorDiv((a.limit-a.need)*W, cn))
		}
	}
	return outcome{admitted, max(0, fits(cn)), reset, retry, ws}
}

func slidingWindowRefund(s *state, a args) {
	W := a.window / 1000
	switch {
	case s.w == a.state:
		s.n = max(0, s.n-a.cost)
	case s.w == a.state+W && s.pn > 0 && a.now/1000 < s.pexp:
		s.pn = max(0, s.pn-a.cost)
	}
}

func fixedWindowTake(s *state, a args, present bool) outcome {
	W := a.window / 1000
	nowms := a.now / 1000
	ws := windowStart(nowms, W)
	var n int64
	if present && s.w >= ws {
		ws, n = s.w, s.n
	}
	admitted := max(0, min(a.cost, a.limit-n))
	admitted = whole(admitted, a.need)
	if admitted > 0 {
		n += admitted
		s.w, s.n = ws, n
		s.expires = (ws + W) * 1000
	}
	reset := ws + W - nowms
	var retry int64
	if admitted < a.cost && (a.need > a.limit || n+a.need > a.limit) {
		retry = reset
	}
	return outcome{admitted, max(0, a.limit-n), reset, retry, ws}
}

func gcraParams(a args) (T, capacity, tau float64) {
	T = float64(a.window) / float64(a.limit)
	capacity = float64(a.limit)
	if a.extra > 0 {
		capacity = float64(a.extra)
	}
	return T, capacity, capacity * T
}

func gcraTake(s *state, a args, present bool) outcome {
	T, capacity, tau := gcraParams(a)
	now := float64(a.now)
	tat := s.tat
	if !present || tat < now {
		tat = now
	}
	fits := func() int64 { return int64(math.Floor((tau-(tat-now))/T + 1e-9)) }
	admitted := max(0, min(a.cost, fits()))
	admitted = whole(admitted, a.need)
	if admitted > 0 {
		tat += float64(admitted) * T
		s.tat = tat
		s.expires = a.now + max(1, msCeil(tat-now))*1000
	}
	var retry float64
	if admitted < a.cost {
		if float64(a.need) > capacity {
			retry = tat - now
		} else {
			retry = tat + float64(a.need)*T - tau - now
		}
	}
	return outcome{admitted, max(0, fits()), msCeil(tat - now), msCeil(retry), 0}
}

// gcraRefund reports whether the key still exists afterwards.
func gcraRefund(s *state, a args) bool {
	T, _, _ := gcraParams(a)
	s.tat -= float64(a.cost) * T
	if s.tat > float64(a.now) {
		s.expires = a.now + max(1, msCeil(s.tat-float64(a.now)))*1000
		return true
	}
	return false
}
