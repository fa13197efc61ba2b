package shedder

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// AdaptiveConfig sets the adaptive concurrency limit on requests in flight
// to the origin (see Adaptive). It is off by default: the worker cap and
// the utilization ramp then do all the shedding, as before.
type AdaptiveConfig struct {
	// Enabled refuses origin requests past the learned limit (503, not
	// processed). Off, the limit is still learned and exported, so it can
	// be watched before it is trusted.
	Enabled bool `json:"enabled" yaml:"enabled"`
	// InitialLimit is where the limit starts, until the first window with
	// enough origin responses (it is learned from then on, also while
	// Enabled is off): low enough not to flood a cold origin, it grows by
	// about its square root per window while latency stays at minRTT.
	InitialLimit int `json:"initial_limit" yaml:"initial_limit"`
	// MinLimit is the lowest the learned limits of the region's edges go
	// together: each edge's floor is this divided by the edges registered
	// for the region (--nodes-in-region until the Consul catalog says),
	// rounded up, at least 1. Keep it at most the origin's smallest
	// concurrency, or the edges queue requests there by construction.
	// Still slow for 3 windows with its limit at its floor, an edge takes
	// the origin itself to have become slower, and its latency there
	// becomes the new minRTT.
	MinLimit int `json:"min_limit" yaml:"min_limit"`
	// MaxLimit is the highest the learned limit goes.
	MaxLimit int `json:"max_limit" yaml:"max_limit"`
	// Window is how often the limit moves, from the median latency of the
	// window's origin responses (a window with fewer than 8 waits for more).
	Window time.Duration `json:"window" yaml:"window"`
	// MinRTTWindow is how far back the no-queue latency (minRTT) is
	// remembered: long enough to span a moment when the origin's queue
	// was empty, short enough to follow an origin that has become slower
	// for good.
	MinRTTWindow time.Duration `json:"min_rtt_window" yaml:"min_rtt_window"`
	// Buffer is the latency above minRTT, as a fraction of it, that still
	// counts as no queue (Envoy's default is 0.25).
	Buffer float64 `json:"buffer" yaml:"buffer"`
	// Smoothing is how much of each window's step is taken, in (0, 1]:
	// lower is steadier, higher follows a change faster.
	Smoothing float64 `json:"smoothing" yaml:"smoothing"`
	// Shares are each tier's guaranteed fractions of the limit; their sum
	// is at most 1.
	Shares TierShares `json:"shares" yaml:"shares"`
}

// TierShares is a fraction of the limit per tier.
type TierShares struct {
	// Test is kept for test traffic (default 0: it only gets what is left).
	Test float64 `json:"test" yaml:"test"`
	// Read is kept for reads; the tiers below cannot use it.
	Read float64 `json:"read" yaml:"read"`
	// Write is kept for writes; the tiers below cannot use it.
	Write float64 `json:"write" yaml:"write"`
	// Critical is kept for critical requests, which the limit never
	// refuses: it is the part of the limit the other tiers leave to them.
	Critical float64 `json:"critical" yaml:"critical"`
}

func (s TierShares) of(t Tier) float64 {
	switch t {
	case TierTest:
		return s.Test
	case TierRead:
		return s.Read
	case TierWrite:
		return s.Write
	case TierCritical:
		return s.Critical
	}
	return 0
}

func (s *TierShares) ptr(t Tier) *float64 {
	return [numTiers]*float64{&s.Test, &s.Read, &s.Write, &s.Critical}[t]
}

// DefaultAdaptiveConfig is off, starts at 20 requests, moves every 100 ms
// (Envoy's sample window) and guarantees critical a quarter of the limit.
func DefaultAdaptiveConfig() AdaptiveConfig {
	return AdaptiveConfig{
		InitialLimit: 20,
		MinLimit:     4,
		MaxLimit:     1000,
		Window:       100 * time.Millisecond,
		MinRTTWindow: 30 * time.Second,
		Buffer:       0.25,
		Smoothing:    0.5,
		Shares:       TierShares{Read: 0.05, Write: 0.1, Critical: 0.25},
	}
}

// validate adds each problem, named under adaptive., to bad.
func (c AdaptiveConfig) validate(bad func(field, format string, args ...any)) {
	if c.MinLimit < 1 {
		bad("adaptive.min_limit", "must be >= 1, got %d", c.MinLimit)
	}
	if c.MaxLimit < c.MinLimit {
		bad("adaptive.max_limit", "must be >= min_limit (%d), got %d", c.MinLimit, c.MaxLimit)
	}
	if c.InitialLimit < c.MinLimit || c.InitialLimit > c.MaxLimit {
		bad("adaptive.initial_limit", "must be in [min_limit, max_limit] = [%d, %d], got %d", c.MinLimit, c.MaxLimit, c.InitialLimit)
	}
	if c.Window < time.Millisecond {
		bad("adaptive.window", "must be >= 1ms, got %v", c.Window)
	}
	if c.MinRTTWindow < 10*c.Window {
		bad("adaptive.min_rtt_window", "must be at least 10 windows (%v), got %v", 10*c.Window, c.MinRTTWindow)
	}
	if !(c.Buffer >= 0 && c.Buffer <= 10) {
		bad("adaptive.buffer", "must be in [0, 10], got %v", c.Buffer)
	}
	if !(c.Smoothing > 0 && c.Smoothing <= 1) {
		bad("adaptive.smoothing", "must be in (0, 1], got %v", c.Smoothing)
	}
	var sum float64
	for t := range Tier(numTiers) {
		v := c.Shares.of(t)
		if !(v >= 0 && v <= 1) {
			bad("adaptive.shares."+t.String(), "must be in [0, 1], got %v", v)
			continue
		}
		sum += v
	}
	if sum > 1+1e-9 {
		bad("adaptive.shares", "must sum to at most 1, got %v", sum)
	}
}

type adaptiveAlias AdaptiveConfig

type adaptiveWire struct {
	*adaptiveAlias
	Window       jsonDuration `json:"window"`
	MinRTTWindow jsonDuration `json:"min_rtt_window"`
}

// MarshalJSON writes durations as strings.
func (c AdaptiveConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(adaptiveWire{adaptiveAlias: (*adaptiveAlias)(&c), Window: jsonDuration(c.Window), MinRTTWindow: jsonDuration(c.MinRTTWindow)})
}

// UnmarshalJSON overlays data on c, strictly, like Config's.
func (c *AdaptiveConfig) UnmarshalJSON(data []byte) error {
	next := *c
	w := adaptiveWire{adaptiveAlias: (*adaptiveAlias)(&next), Window: jsonDuration(c.Window), MinRTTWindow: jsonDuration(c.MinRTTWindow)}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return fmt.Errorf("adaptive: %w", err)
	}
	next.Window, next.MinRTTWindow = time.Duration(w.Window), time.Duration(w.MinRTTWindow)
	*c = next
	return nil
}

// adaptive is the controller's setting: shadow mode (enabled: false)
// learns without refusing, like the ramp.
func (c Config) adaptive() AdaptiveConfig {
	a := c.Adaptive
	a.Enabled = a.Enabled && c.Enabled
	return a
}
