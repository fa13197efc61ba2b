package behavior

import (
	"fmt"
	"strconv"
	"time"
)

// Level is a client's risk level. (Levels, not tiers: tiers are the
// shedder's.)
type Level uint8

// The levels, in order.
const (
	Normal Level = iota
	Elevated
	Suspicious
	Blocked
	numLevels
)

var levelNames = [...]string{"normal", "elevated", "suspicious", "blocked"}

func (l Level) String() string {
	if l < numLevels {
		return levelNames[l]
	}
	return "level(" + strconv.Itoa(int(l)) + ")"
}

// AllLevels lists every level, lowest first.
func AllLevels() []Level { return []Level{Normal, Elevated, Suspicious, Blocked} }

// maxScan is the most distinct routes a half-horizon's sketch takes: past
// it the scan signal is saturated for any sensible scale, and the sketch's
// memory stays small (lua/behaviour.lua stops adding there too).
const maxScan = 64

// Params is a validated section in the units the scorer and the Redis
// script work in (milliseconds, points). The script gets the same numbers
// as arguments, so the two score alike (TestScriptMatchesModel).
type Params struct {
	HorizonMs, BurstMs, CooldownMs, ReplayGapMs int64
	Hysteresis                                  float64
	W                                           [4]float64 // burst, replay, scan, denial
	Th                                          [numLevels]float64
	BurstFree, BurstSpan                        float64
	ReplayFree, ReplaySpan                      float64
	ScanFree, ScanSpan                          float64
	DenialFree, DenialSpan                      float64
}

// ParamsOf compiles a validated section.
func ParamsOf(s *Settings) Params {
	g := s.Signals
	return Params{
		HorizonMs:   s.Horizon.D().Milliseconds(),
		BurstMs:     s.BurstWindow.D().Milliseconds(),
		CooldownMs:  s.Cooldown.D().Milliseconds(),
		ReplayGapMs: g.ReplayGap.D().Milliseconds(),
		Hysteresis:  s.Hysteresis,
		W:           [4]float64{*s.Weights.Burst, *s.Weights.Replay, *s.Weights.Scan, *s.Weights.Denial},
		Th:          [numLevels]float64{0, s.Thresholds.Elevated, s.Thresholds.Suspicious, s.Thresholds.Blocked},
		BurstFree:   *g.BurstFree, BurstSpan: g.BurstSpan,
		ReplayFree: *g.ReplayFree, ReplaySpan: g.ReplaySpan,
		ScanFree: *g.ScanFree, ScanSpan: g.ScanSpan,
		DenialFree: *g.DenialFree, DenialSpan: g.DenialSpan,
	}
}

// Cooldown is the cool-down as a duration.
func (p *Params) Cooldown() time.Duration { return time.Duration(p.CooldownMs) * time.Millisecond }

// Raw is what the signals counted within their horizons.
type Raw struct {
	Burst  float64 // requests in the burst window / the rule's quota q
	Replay int64   // identical requests in the current run, after the first
	Scan   int64   // distinct routes
	Denial int64   // requests sent before a 429's Retry-After
}

// Signals are the raw counts scaled into points (before weights).
type Signals struct {
	Burst, Replay, Scan, Denial float64
}

func over(raw, free, span float64) float64 { return max(0, raw-free) / span }

// Signals scales raw counts into points.
func (p *Params) Signals(r Raw) Signals {
	return Signals{
		Burst:  over(r.Burst, p.BurstFree, p.BurstSpan),
		Replay: over(float64(r.Replay), p.ReplayFree, p.ReplaySpan),
		Scan:   over(float64(r.Scan), p.ScanFree, p.ScanSpan),
		Denial: over(float64(r.Denial), p.DenialFree, p.DenialSpan),
	}
}

// Score is the weighted sum of the signals, in thousandths of a point (the
// script's integer arithmetic: the two must agree exactly at thresholds).
func (p *Params) Score(s Signals) int64 {
	f := p.W[0]*s.Burst + p.W[1]*s.Replay + p.W[2]*s.Scan + p.W[3]*s.Denial
	return int64(f*1000 + 0.5)
}

// thMilli is threshold l × factor in thousandths, as the script computes it.
func (p *Params) thMilli(l Level, factor float64) int64 {
	return int64(p.Th[l]*factor*1000 + 0.5)
}

// Hold is a client's level and when the score last supported it.
type Hold struct {
	Level Level
	Since int64 // ms: the last time the score reached Level (within hysteresis)
}

// Step moves h for a score observed at now (ms): up at once to the highest
// level whose threshold the score reaches; held while the score stays at or
// above the level's threshold × hysteresis; down, to the level the score
// supports within hysteresis, once it has not supported the level for the
// cool-down.
func (p *Params) Step(h Hold, score, now int64) Hold {
	up, down := Normal, Normal
	for l := Elevated; l < numLevels; l++ {
		if score >= p.thMilli(l, 1) {
			up = l
		}
		if score >= p.thMilli(l, p.Hysteresis) {
			down = l
		}
	}
	switch {
	case up > h.Level:
		return Hold{Level: up, Since: now}
	case down >= h.Level:
		return Hold{Level: h.Level, Since: now}
	case now-h.Since >= p.CooldownMs:
		return Hold{Level: down, Since: now}
	}
	return h
}

// HoldLeft is how long h holds its level from now on without support: the
// time a reading of it stays good for, and a blocked client's wait.
func (p *Params) HoldLeft(h Hold, now int64) time.Duration {
	if h.Level == Normal {
		return 0
	}
	return time.Duration(max(0, h.Since+p.CooldownMs-now)) * time.Millisecond
}

func (r Raw) String() string {
	return fmt.Sprintf("burst=%.2f replay=%d scan=%d denial=%d", r.Burst, r.Replay, r.Scan, r.Denial)
}
