package behavior

import "slices"

// Obs is what one update tells a client's state: some requests, and
// possibly a 429 given to it.
type Obs struct {
	// N requests were sent.
	N int64
	// Judge of them are judged early or not against the stored retry
	// time (requests seen as they arrive); the others' earliness, judged by
	// an edge, is in Early.
	Judge int64
	Early int64
	// RetryMs > 0: a 429 told the client to wait this long from now.
	RetryMs int64
	// Q is the most the client's opted-in rules admit within the burst
	// window (the tightest rule's quota, times the windows that fit in
	// the burst window): the burst signal's scale. 0: keep the last.
	Q int64
	// Routes are hashes of the normalized paths requested.
	Routes []uint64
	// FP is the request's fingerprint (method, path, query, small body);
	// 0 for none (a batch of counted requests).
	FP uint64
}

// localRoutes is how many distinct routes a half-horizon keeps in process
// memory, as many as the region's sketch in Redis takes: bounded, so a
// flood of scanners cannot grow an edge's memory.
const localRoutes = maxScan

// State is one client's signals and level in process memory: the model of
// lua/behaviour.lua, which keeps the same state region-wide in Redis
// (TestScriptMatchesModel holds the two together), and the edge's own view
// when Redis cannot be asked.
type State struct {
	half                  int64 // index of the current horizon half
	earlyCur, earlyPrev   int64
	routesCur, routesPrev []uint32
	burstHalf             int64
	burstCur, burstPrev   int64
	fp                    uint64
	fpAt, run             int64
	retryUntil            int64
	hold                  Hold
	lastQ                 int64
}

// Verdict is a state's reading after an update.
type Verdict struct {
	Level Level
	Score int64 // thousandths of a point
	// HoldMs is how long the level holds without further support.
	HoldMs int64
	Raw    Raw
}

// roll moves the halves to now's.
func (s *State) roll(p *Params, now int64) {
	h := now / max(p.HorizonMs/2, 1)
	if h > s.half {
		if h == s.half+1 {
			s.earlyPrev, s.routesPrev = s.earlyCur, s.routesCur
		} else {
			s.earlyPrev, s.routesPrev = 0, nil
		}
		s.earlyCur, s.routesCur, s.half = 0, nil, h
	}
	b := now / max(p.BurstMs/2, 1)
	if b > s.burstHalf {
		if b == s.burstHalf+1 {
			s.burstPrev = s.burstCur
		} else {
			s.burstPrev = 0
		}
		s.burstCur, s.burstHalf = 0, b
	}
}

// Observe applies o at now (ms) and returns the reading.
func (s *State) Observe(p *Params, o Obs, now int64) Verdict {
	s.roll(p, now)
	if o.Judge > 0 && now < s.retryUntil {
		s.earlyCur += o.Judge
	}
	s.earlyCur += o.Early
	if o.RetryMs > 0 {
		s.retryUntil = max(s.retryUntil, now+o.RetryMs)
	}
	s.burstCur += o.N
	for _, r := range o.Routes {
		r32 := uint32(r)
		if len(s.routesCur) < localRoutes && !slices.Contains(s.routesCur, r32) {
			s.routesCur = append(s.routesCur, r32)
		}
	}
	if o.FP != 0 {
		if o.FP == s.fp && now-s.fpAt <= p.ReplayGapMs {
			s.run++
		} else {
			s.run = 0
		}
		s.fp, s.fpAt = o.FP, now
	}
	if o.Q > 0 {
		s.lastQ = o.Q
	}
	return s.read(p, now, true)
}

// Peek is the reading at now without an update (nothing changes).
func (s *State) Peek(p *Params, now int64) Verdict {
	c := *s
	c.roll(p, now)
	return c.read(p, now, false)
}

// Early reports whether a request at now (ms) comes before a Retry-After
// this state knows of.
func (s *State) Early(now int64) bool { return now < s.retryUntil }

func (s *State) read(p *Params, now int64, step bool) Verdict {
	raw := s.raw(p, now)
	score := p.Score(p.Signals(raw))
	h := p.Step(s.hold, score, now)
	if step {
		s.hold = h
	}
	return Verdict{Level: h.Level, Score: score, HoldMs: p.HoldLeft(h, now).Milliseconds(), Raw: raw}
}

func (s *State) raw(p *Params, now int64) Raw {
	var r Raw
	if s.lastQ > 0 {
		r.Burst = float64(s.burstPrev+s.burstCur) / float64(s.lastQ)
	}
	if s.fp != 0 && now-s.fpAt <= p.ReplayGapMs {
		r.Replay = s.run
	}
	r.Scan = int64(len(s.routesCur))
	for _, x := range s.routesPrev {
		if !slices.Contains(s.routesCur, x) {
			r.Scan++
		}
	}
	r.Denial = s.earlyPrev + s.earlyCur
	return r
}

// Idle reports whether the state holds nothing worth keeping at now: no
// level, and every signal aged out.
func (s *State) Idle(p *Params, now int64) bool {
	v := s.Peek(p, now)
	return v.Level == Normal && v.Score == 0 && now >= s.retryUntil
}
