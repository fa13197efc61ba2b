package behavior

import (
	"fmt"
	"math"
	"time"

	"go.yaml.in/yaml/v3"
)

// Mode is what the layer does with the levels it computes.
type Mode string

// The modes. A rules document without a behaviour section is ModeOff.
const (
	ModeOff     Mode = "off"     // nothing is computed
	ModeShadow  Mode = "shadow"  // levels are computed, counted and logged; no request is treated differently
	ModeEnforce Mode = "enforce" // levels tighten limits, demote to the shedder's lowest tier and block
)

// IdentityKind is what a client's score follows.
type IdentityKind string

// The identity kinds.
const (
	IdentityAddress     IdentityKind = "address"
	IdentityUpstreamKey IdentityKind = "upstream_key"
	IdentityJA4         IdentityKind = "ja4"
)

// Settings is the rules document's behaviour section. Every field may be
// omitted; Normalize fills in the defaults (DefaultSettings), and Validate
// reports every bad value by field.
type Settings struct {
	// Mode is off, shadow (the default: start here and watch the levels)
	// or enforce.
	Mode Mode `yaml:"mode,omitempty" json:"mode,omitempty"`
	// Identity is what a client's score follows: address (the default: the
	// client address, an IPv6 client's prefix, which a client cannot
	// cheaply change or borrow) or upstream_key (the API key an opted-in
	// rule counts by, but only on requests from a trusted proxy, which is
	// then taken to have authenticated it; other requests still follow
	// their address). A key the edge did not see authenticated is never an
	// identity: a scanner would rotate it to stay unscored, or send a
	// victim's key to get the victim blocked. ja4: the JA4 fingerprint of
	// the client's TLS stack, so a client that rotates addresses keeps one
	// score (requests without TLS follow their address). Every client of
	// the same TLS stack shares that score: it suits traffic from few,
	// distinct stacks (an API whose callers use its SDKs, bots with their
	// own stacks), not browsers, which share a handful of fingerprints.
	Identity IdentityKind `yaml:"identity,omitempty" json:"identity,omitempty"`
	// Horizon is how far back the signals look (default 60s). It is kept
	// as two halves: a signal counts the current and the previous half, so
	// between Horizon/2 and Horizon of history.
	Horizon Duration `yaml:"horizon,omitempty" json:"horizon,omitempty"`
	// BurstWindow is the burst signal's horizon (default 5s), kept the same
	// way.
	BurstWindow Duration `yaml:"burst_window,omitempty" json:"burst_window,omitempty"`
	// Cooldown is how long a level holds after the score last reached it
	// (within Hysteresis) before it steps down (default 60s); a blocked
	// client's Retry-After.
	Cooldown Duration `yaml:"cooldown,omitempty" json:"cooldown,omitempty"`
	// Hysteresis (0 < h <= 1, default 0.8): a level is held while the score
	// stays at or above its threshold × Hysteresis, so a score hovering
	// at a threshold does not flap.
	Hysteresis float64 `yaml:"hysteresis,omitempty" json:"hysteresis,omitempty"`
	// Weights multiply each signal (0 switches one off; default 1 each).
	Weights *Weights `yaml:"weights,omitempty" json:"weights,omitempty"`
	// Thresholds are the scores at which a client enters each level.
	Thresholds *Thresholds `yaml:"thresholds,omitempty" json:"thresholds,omitempty"`
	// Signals sets how each signal is scaled into score points.
	Signals *SignalScale `yaml:"signals,omitempty" json:"signals,omitempty"`
	// Levels is what each level does in enforce mode.
	Levels *Levels `yaml:"levels,omitempty" json:"levels,omitempty"`
}

// Weights multiply the signals in the score.
type Weights struct {
	Burst  *float64 `yaml:"burst,omitempty" json:"burst,omitempty"`
	Replay *float64 `yaml:"replay,omitempty" json:"replay,omitempty"`
	Scan   *float64 `yaml:"scan,omitempty" json:"scan,omitempty"`
	Denial *float64 `yaml:"denial,omitempty" json:"denial,omitempty"`
}

// Thresholds are the score at which each level starts.
type Thresholds struct {
	Elevated   float64 `yaml:"elevated,omitempty" json:"elevated,omitempty"`
	Suspicious float64 `yaml:"suspicious,omitempty" json:"suspicious,omitempty"`
	Blocked    float64 `yaml:"blocked,omitempty" json:"blocked,omitempty"`
}

// SignalScale turns each signal's raw count into points: a signal scores
// max(0, raw − free) / span, so 1 point is "span past what is normal".
type SignalScale struct {
	// BurstFree is the share of a rule's quota (q) a client may send
	// within BurstWindow for nothing (default 1: its whole quota);
	// BurstSpan the further share worth one point (default 1).
	BurstFree *float64 `yaml:"burst_free,omitempty" json:"burst_free,omitempty"`
	BurstSpan float64  `yaml:"burst_span,omitempty" json:"burst_span,omitempty"`
	// ReplayGap is the most time between two identical requests that still
	// continues a replay run (default 5s); ReplayFree repeats in a run
	// score nothing (default 3); ReplaySpan more are one point (default 10).
	ReplayGap  Duration `yaml:"replay_gap,omitempty" json:"replay_gap,omitempty"`
	ReplayFree *float64 `yaml:"replay_free,omitempty" json:"replay_free,omitempty"`
	ReplaySpan float64  `yaml:"replay_span,omitempty" json:"replay_span,omitempty"`
	// ScanFree distinct routes within the horizon score nothing (default
	// 24; a web client touches up to about 20 a minute); ScanSpan more are
	// one point (default 24).
	ScanFree *float64 `yaml:"scan_free,omitempty" json:"scan_free,omitempty"`
	ScanSpan float64  `yaml:"scan_span,omitempty" json:"scan_span,omitempty"`
	// DenialFree requests sent before a 429's Retry-After within the
	// horizon score nothing (default 3); DenialSpan more are one point
	// (default 5).
	DenialFree *float64 `yaml:"denial_free,omitempty" json:"denial_free,omitempty"`
	DenialSpan float64  `yaml:"denial_span,omitempty" json:"denial_span,omitempty"`
}

// Levels holds each level's policy.
type Levels struct {
	Elevated   *Policy `yaml:"elevated,omitempty" json:"elevated,omitempty"`
	Suspicious *Policy `yaml:"suspicious,omitempty" json:"suspicious,omitempty"`
	Blocked    *Policy `yaml:"blocked,omitempty" json:"blocked,omitempty"`
}

// Policy is what a level does to a client's requests in enforce mode, on
// the rules that opt in (a rule's behaviour: true).
type Policy struct {
	// LimitFactor multiplies the opted-in rules' limit and burst
	// (0 < f <= 1; default 1, i.e. unchanged).
	LimitFactor float64 `yaml:"limit_factor,omitempty" json:"limit_factor,omitempty"`
	// LowestTier puts the client's requests in the shedder's lowest tier.
	LowestTier bool `yaml:"lowest_tier,omitempty" json:"lowest_tier,omitempty"`
	// Block answers 429 (type abnormal-usage-detected) with Retry-After =
	// the cool-down.
	Block bool `yaml:"block,omitempty" json:"block,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("60s").
type Duration time.Duration

// D is the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalText writes the duration string, so documents round-trip.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads a Go duration string; a bare number is refused ("60"
// could mean seconds or nanoseconds).
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q (want e.g. \"60s\", \"500ms\")", b)
	}
	*d = Duration(v)
	return nil
}

// UnmarshalYAML is UnmarshalText for a YAML scalar, as a *yaml.TypeError so
// the decoder reports it with the document's other problems.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration must be a string like \"60s\"", n.Line)}}
	}
	if err := d.UnmarshalText([]byte(n.Value)); err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	return nil
}

// MarshalYAML writes the duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

func ptr[T any](v T) *T { return &v }

// DefaultSettings is the section with every default filled in: the default
// weights are the ones the detection and false-positive tests hold to.
func DefaultSettings() Settings {
	return Settings{
		Mode:        ModeShadow,
		Identity:    IdentityAddress,
		Horizon:     Duration(60 * time.Second),
		BurstWindow: Duration(5 * time.Second),
		Cooldown:    Duration(60 * time.Second),
		Hysteresis:  0.8,
		Weights:     &Weights{Burst: ptr(1.0), Replay: ptr(1.0), Scan: ptr(1.0), Denial: ptr(1.0)},
		Thresholds:  &Thresholds{Elevated: 0.5, Suspicious: 1, Blocked: 2},
		Signals: &SignalScale{
			BurstFree: ptr(1.0), BurstSpan: 1,
			ReplayGap: Duration(5 * time.Second), ReplayFree: ptr(3.0), ReplaySpan: 10,
			ScanFree: ptr(24.0), ScanSpan: 24,
			DenialFree: ptr(3.0), DenialSpan: 5,
		},
		Levels: &Levels{
			Elevated:   &Policy{LimitFactor: 0.5},
			Suspicious: &Policy{LimitFactor: 0.1, LowestTier: true},
			Blocked:    &Policy{LimitFactor: 1, Block: true},
		},
	}
}

// Clone is a deep copy.
func (s *Settings) Clone() *Settings {
	if s == nil {
		return nil
	}
	c := *s
	if s.Weights != nil {
		w := *s.Weights
		w.Burst, w.Replay, w.Scan, w.Denial = clonePtr(w.Burst), clonePtr(w.Replay), clonePtr(w.Scan), clonePtr(w.Denial)
		c.Weights = &w
	}
	if s.Thresholds != nil {
		t := *s.Thresholds
		c.Thresholds = &t
	}
	if s.Signals != nil {
		g := *s.Signals
		g.BurstFree, g.ReplayFree, g.ScanFree, g.DenialFree = clonePtr(g.BurstFree), clonePtr(g.ReplayFree), clonePtr(g.ScanFree), clonePtr(g.DenialFree)
		c.Signals = &g
	}
	if s.Levels != nil {
		l := *s.Levels
		l.Elevated, l.Suspicious, l.Blocked = clonePtr(l.Elevated), clonePtr(l.Suspicious), clonePtr(l.Blocked)
		c.Levels = &l
	}
	return &c
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// Normalize fills every omitted field with its default, in place, so a
// validated section spells out what runs (and validating again changes
// nothing). A level's policy given in part keeps the defaults of the
// fields it omits only for limit_factor (1: unchanged).
func (s *Settings) Normalize() {
	d := DefaultSettings()
	if s.Mode == "" {
		s.Mode = d.Mode
	}
	if s.Identity == "" {
		s.Identity = d.Identity
	}
	if s.Horizon == 0 {
		s.Horizon = d.Horizon
	}
	if s.BurstWindow == 0 {
		s.BurstWindow = d.BurstWindow
	}
	if s.Cooldown == 0 {
		s.Cooldown = d.Cooldown
	}
	if s.Hysteresis == 0 {
		s.Hysteresis = d.Hysteresis
	}
	if s.Weights == nil {
		s.Weights = &Weights{}
	}
	w := s.Weights
	fill(&w.Burst, d.Weights.Burst)
	fill(&w.Replay, d.Weights.Replay)
	fill(&w.Scan, d.Weights.Scan)
	fill(&w.Denial, d.Weights.Denial)
	if s.Thresholds == nil {
		s.Thresholds = &Thresholds{}
	}
	t := s.Thresholds
	fillF(&t.Elevated, d.Thresholds.Elevated)
	fillF(&t.Suspicious, d.Thresholds.Suspicious)
	fillF(&t.Blocked, d.Thresholds.Blocked)
	if s.Signals == nil {
		s.Signals = &SignalScale{}
	}
	g, dg := s.Signals, d.Signals
	fill(&g.BurstFree, dg.BurstFree)
	fillF(&g.BurstSpan, dg.BurstSpan)
	if g.ReplayGap == 0 {
		g.ReplayGap = dg.ReplayGap
	}
	fill(&g.ReplayFree, dg.ReplayFree)
	fillF(&g.ReplaySpan, dg.ReplaySpan)
	fill(&g.ScanFree, dg.ScanFree)
	fillF(&g.ScanSpan, dg.ScanSpan)
	fill(&g.DenialFree, dg.DenialFree)
	fillF(&g.DenialSpan, dg.DenialSpan)
	if s.Levels == nil {
		s.Levels = &Levels{}
	}
	l := s.Levels
	for _, p := range []struct{ got, def **Policy }{{&l.Elevated, &d.Levels.Elevated}, {&l.Suspicious, &d.Levels.Suspicious}, {&l.Blocked, &d.Levels.Blocked}} {
		if *p.got == nil {
			*p.got = *p.def
		} else if (*p.got).LimitFactor == 0 {
			(*p.got).LimitFactor = 1
		}
	}
}

func fill(p **float64, def *float64) {
	if *p == nil {
		*p = ptr(*def)
	}
}

func fillF(p *float64, def float64) {
	if *p == 0 {
		*p = def
	}
}

// Problem is one bad value of the section; Field is its path in the rules
// document ("behaviour.weights.scan").
type Problem struct {
	Field, Msg string
}

// Bounds of the section's values.
const (
	minHorizon = 2 * time.Second
	maxHorizon = time.Hour
	maxCount   = 1e6 // free and span counts
)

// Validate normalizes s (Normalize) and returns every bad value, by field.
func (s *Settings) Validate() []Problem {
	s.Normalize()
	var ps []Problem
	add := func(field, format string, args ...any) {
		ps = append(ps, Problem{Field: "behaviour." + field, Msg: fmt.Sprintf(format, args...)})
	}
	switch s.Mode {
	case ModeOff, ModeShadow, ModeEnforce:
	default:
		add("mode", "unknown %q (want off, shadow or enforce)", s.Mode)
	}
	switch s.Identity {
	case IdentityAddress, IdentityUpstreamKey, IdentityJA4:
	default:
		add("identity", "unknown %q (want address, upstream_key for keys a trusted proxy authenticated, or ja4 for the TLS fingerprint)", s.Identity)
	}
	dur := func(field string, d Duration, lo, hi time.Duration) {
		if d.D() < lo || d.D() > hi {
			add(field, "%s outside %s–%s", d.D(), lo, hi)
		} else if d.D()%time.Millisecond != 0 {
			add(field, "%s: want whole milliseconds", d.D())
		}
	}
	dur("horizon", s.Horizon, minHorizon, maxHorizon)
	dur("burst_window", s.BurstWindow, 200*time.Millisecond, maxHorizon)
	if s.BurstWindow > s.Horizon {
		add("burst_window", "%s is longer than the horizon (%s)", s.BurstWindow.D(), s.Horizon.D())
	}
	dur("cooldown", s.Cooldown, time.Second, 24*time.Hour)
	if !(s.Hysteresis > 0 && s.Hysteresis <= 1) {
		add("hysteresis", "%v outside (0, 1]", s.Hysteresis)
	}
	for _, w := range []struct {
		name string
		v    float64
	}{{"burst", *s.Weights.Burst}, {"replay", *s.Weights.Replay}, {"scan", *s.Weights.Scan}, {"denial", *s.Weights.Denial}} {
		if !finite(w.v) || w.v < 0 || w.v > 1000 {
			add("weights."+w.name, "%v outside 0–1000", w.v)
		}
	}
	t := s.Thresholds
	for _, th := range []struct {
		name string
		v    float64
	}{{"elevated", t.Elevated}, {"suspicious", t.Suspicious}, {"blocked", t.Blocked}} {
		if !finite(th.v) || th.v <= 0 || th.v > 1e6 {
			add("thresholds."+th.name, "%v outside (0, 1e6]", th.v)
		}
	}
	if t.Suspicious <= t.Elevated {
		add("thresholds.suspicious", "%v must be above elevated (%v)", t.Suspicious, t.Elevated)
	}
	if t.Blocked <= t.Suspicious {
		add("thresholds.blocked", "%v must be above suspicious (%v)", t.Blocked, t.Suspicious)
	}
	g := s.Signals
	scale := func(name string, free *float64, span float64, hi float64) {
		if !finite(*free) || *free < 0 || *free > hi {
			add("signals."+name+"_free", "%v outside 0–%v", *free, hi)
		}
		if !finite(span) || span <= 0 || span > hi {
			add("signals."+name+"_span", "%v outside (0, %v]", span, hi)
		}
	}
	scale("burst", g.BurstFree, g.BurstSpan, 1000)
	scale("replay", g.ReplayFree, g.ReplaySpan, maxCount)
	scale("scan", g.ScanFree, g.ScanSpan, maxScan)
	scale("denial", g.DenialFree, g.DenialSpan, maxCount)
	dur("signals.replay_gap", g.ReplayGap, time.Millisecond, maxHorizon)
	for _, p := range []struct {
		name string
		p    *Policy
	}{{"elevated", s.Levels.Elevated}, {"suspicious", s.Levels.Suspicious}, {"blocked", s.Levels.Blocked}} {
		if f := p.p.LimitFactor; !finite(f) || f <= 0 || f > 1 {
			add("levels."+p.name+".limit_factor", "%v outside (0, 1]", f)
		}
	}
	return ps
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// Policy returns level l's policy (normal's changes nothing).
func (s *Settings) Policy(l Level) Policy {
	switch l {
	case Elevated:
		return *s.Levels.Elevated
	case Suspicious:
		return *s.Levels.Suspicious
	case Blocked:
		return *s.Levels.Blocked
	}
	return Policy{LimitFactor: 1}
}
