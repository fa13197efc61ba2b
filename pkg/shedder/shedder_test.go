package shedder

import (
	"context"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func seeded() Option { return WithRandSource(rand.New(rand.NewPCG(1, 2))) }

// rawConfig has no smoothing so ramp timings can be checked to the step.
func rawConfig() Config {
	cfg := DefaultConfig()
	cfg.Smoothing = 0
	return cfg
}

func newShedder(t testing.TB, cfg Config, opts ...Option) *Shedder {
	t.Helper()
	s, err := New(cfg, nil, append([]Option{seeded()}, opts...)...)
	require.NoError(t, err)
	return s
}

func TestFloorIsExactFraction(t *testing.T) {
	s := newShedder(t, rawConfig())
	require.Equal(t, -28.0/120.0, s.Level())
	require.NotEqual(t, -1.0, s.Level())
	require.Equal(t, TierNone, s.CutoffTier())
}

func TestRampTimings(t *testing.T) {
	for _, step := range []time.Duration{time.Second, 100 * time.Millisecond, 50 * time.Millisecond, 3 * time.Second} {
		t.Run(step.String(), func(t *testing.T) {
			s := newShedder(t, rawConfig())
			maxStep := step.Seconds() / 120 // how far S moves in one sample
			now := time.Duration(0)
			s.ObserveUtilization(at(now), 1)

			// Overload from rest: nothing shed before start_after.
			for now+step < 28*time.Second {
				now += step
				s.ObserveUtilization(at(now), 1)
				require.LessOrEqual(t, s.Level(), 1e-12, "at %v", now)
				require.Zero(t, s.DropProbability(TierRead), "at %v", now)
			}
			for now < 28*time.Second+step {
				now += step
				s.ObserveUtilization(at(now), 1)
			}
			require.Greater(t, s.Level(), 0.0, "shedding must have begun by %v", now)

			// S reaches 1 at start_after+full_after, within one step.
			for now+step <= 148*time.Second-step {
				now += step
				s.ObserveUtilization(at(now), 1)
				require.Less(t, s.Level(), 1.0, "at %v", now)
			}
			for now < 148*time.Second {
				now += step
				s.ObserveUtilization(at(now), 1)
			}
			require.InDelta(t, 1.0, s.Level(), maxStep+1e-9)
			now += step
			s.ObserveUtilization(at(now), 1)
			require.Equal(t, 1.0, s.Level())
			require.Equal(t, TierWrite, s.CutoffTier())

			// Recovery at u=0 is symmetric: back to the floor after 148 s.
			start := now
			for now+step <= start+148*time.Second-step {
				now += step
				s.ObserveUtilization(at(now), 0)
				require.Greater(t, s.Level(), -28.0/120, "at %v", now-start)
			}
			for now < start+148*time.Second {
				now += step
				s.ObserveUtilization(at(now), 0)
			}
			require.InDelta(t, -28.0/120, s.Level(), maxStep+1e-9)
			now += step
			s.ObserveUtilization(at(now), 0)
			require.Equal(t, -28.0/120, s.Level(), "floor is -t_start/t_all exactly")
		})
	}
}

func TestRampAmount(t *testing.T) {
	tests := []struct {
		u, want float64
	}{
		{0, -1}, {0.35, -0.5}, {0.7, 0}, {0.75, 0}, {0.7999, 0}, {0.8, 0}, {0.9, 0.5}, {1, 1}, {1.5, 3.5},
	}
	for _, tt := range tests {
		require.InDelta(t, tt.want, rampAmount(tt.u, 0.7, 0.8), 1e-9, "u=%v", tt.u)
	}
}

func TestDeadZoneHoldsLevel(t *testing.T) {
	for _, u := range []float64{0.7, 0.75, 0.7999} {
		t.Run("", func(t *testing.T) {
			s := newShedder(t, rawConfig())
			s.ObserveUtilization(at(0), 1)
			for i := 1; i <= 60; i++ {
				s.ObserveUtilization(at(time.Duration(i)*time.Second), 1)
			}
			before := s.Level()
			require.Greater(t, before, 0.0)
			for i := 61; i <= 300; i++ {
				s.ObserveUtilization(at(time.Duration(i)*time.Second), u)
				require.Equal(t, before, s.Level(), "u=%v at %ds", u, i)
			}
		})
	}
}

func TestSmoothingIgnoresSpike(t *testing.T) {
	cfg := DefaultConfig() // 1 s half-life
	s := newShedder(t, cfg)
	// 100 ms samples at 0.5 with a single 1.0 spike: the smoothed value
	// never reaches bad, so S never leaves the floor.
	samples := []float64{0.5, 0.5, 0.5, 1, 0.5, 0.5, 0.5, 0.5}
	for i, u := range samples {
		s.ObserveUtilization(at(time.Duration(i)*100*time.Millisecond), u)
		require.Less(t, s.Utilization(), cfg.Bad)
		require.Equal(t, cfg.floor(), s.Level())
	}
	// Sustained overload does get through: ~10 half-lives later u ≈ 1.
	for i := len(samples); i < len(samples)+100; i++ {
		s.ObserveUtilization(at(time.Duration(i)*100*time.Millisecond), 1)
	}
	require.Greater(t, s.Utilization(), 0.99)
	require.Greater(t, s.Level(), cfg.floor())
}

func TestStalledSamplerStepIsCapped(t *testing.T) {
	s := newShedder(t, rawConfig())
	s.ObserveUtilization(at(0), 1)
	s.ObserveUtilization(at(time.Hour), 1)
	// One sample may move S by at most t_start/t_all: to exactly 0 here.
	require.InDelta(t, 0.0, s.Level(), 1e-12)
}

func TestIgnoresBadSamples(t *testing.T) {
	s := newShedder(t, rawConfig())
	s.ObserveUtilization(at(0), 1)
	s.ObserveUtilization(at(10*time.Second), math.NaN())
	s.ObserveUtilization(at(10*time.Second), math.Inf(1))
	require.Equal(t, -28.0/120, s.Level())
	s.ObserveUtilization(at(10*time.Second), 1)
	lvl := s.Level()
	// A sample from the past advances nothing.
	s.ObserveUtilization(at(5*time.Second), 1)
	require.Equal(t, lvl, s.Level())
}

// stripeExpected is the analytical expectation of drops for one request per
// second at u=1 from rest: request k (k = 0..n-1) is dropped with
// probability clamp(-t_start/t_all + k/t_all, 0, 1).
func stripeExpected(n int, tStart, tAll float64) float64 {
	var sum float64
	for k := range n {
		sum += clamp(-tStart/tAll+float64(k)/tAll, 0, 1)
	}
	return sum
}

func TestStripeReference(t *testing.T) {
	const seconds = 148
	want := stripeExpected(seconds, 28, 120)
	require.InDelta(t, 59.5, want, 1e-9) // Σ j/120 for j = 1..119

	for _, seed := range []uint64{1, 2, 3, 42, 2024} {
		t.Run("", func(t *testing.T) {
			s, err := New(rawConfig(), nil, WithRandSource(rand.New(rand.NewPCG(seed, seed^0x9e37))))
			require.NoError(t, err)
			drops := 0
			for k := range seconds {
				now := at(time.Duration(k) * time.Second)
				s.ObserveUtilization(now, 1)
				require.InDelta(t, clamp(-28.0/120+float64(k)/120, -28.0/120, 1), s.Level(), 1e-9)
				if !s.Admit(now, TierRead) {
					drops++
					require.GreaterOrEqual(t, k, 28, "dropped before start_after")
				}
			}
			t.Logf("seed %d: %d drops, expected %.1f", seed, drops, want)
			require.InDelta(t, want, float64(drops), 15)
		})
	}
}

// mix is 20% test, 40% read, 30% write, 10% critical, deterministically.
var mix = [10]Tier{TierTest, TierRead, TierWrite, TierRead, TierCritical, TierTest, TierRead, TierWrite, TierRead, TierWrite}

func TestTierOrder(t *testing.T) {
	const pTest, pRead, pWrite = 2.0 / 9, 4.0 / 9, 3.0 / 9 // shares of sheddable traffic
	tests := []struct {
		level  float64
		want   [numTiers]float64
		cutoff Tier
	}{
		{level: -0.1, want: [numTiers]float64{0, 0, 0, 0}, cutoff: TierNone},
		{level: 0, want: [numTiers]float64{0, 0, 0, 0}, cutoff: TierNone},
		{level: 0.1, want: [numTiers]float64{0.1 / pTest, 0, 0, 0}, cutoff: TierTest},
		{level: 0.25, want: [numTiers]float64{1, (0.25 - pTest) / pRead, 0, 0}, cutoff: TierRead},
		{level: 0.5, want: [numTiers]float64{1, (0.5 - pTest) / pRead, 0, 0}, cutoff: TierRead},
		{level: 0.8, want: [numTiers]float64{1, 1, (0.8 - pTest - pRead) / pWrite, 0}, cutoff: TierWrite},
		{level: 0.99, want: [numTiers]float64{1, 1, (0.99 - pTest - pRead) / pWrite, 0}, cutoff: TierWrite},
		{level: 1, want: [numTiers]float64{1, 1, 1, 0}, cutoff: TierWrite},
	}
	for _, tt := range tests {
		t.Run("", func(t *testing.T) {
			s := newShedder(t, rawConfig())
			now := at(0)
			for i := range 1000 {
				require.True(t, s.Admit(now, mix[i%len(mix)]))
			}
			s.ObserveUtilization(now, 0.75) // dead zone: measures shares only
			s.setLevel(tt.level)
			require.Equal(t, tt.cutoff, s.CutoffTier())

			const n = 200_000
			var offered, dropped [numTiers]int
			for i := range n {
				tier := mix[i%len(mix)]
				offered[tier]++
				if !s.Admit(now, tier) {
					dropped[tier]++
				}
			}
			for tier := range Tier(numTiers) {
				require.InDelta(t, tt.want[tier], s.DropProbability(tier), 1e-9, "%s at S=%v", tier, tt.level)
				rate := float64(dropped[tier]) / float64(offered[tier])
				switch tt.want[tier] {
				case 0, 1: // exact: no randomness is involved
					require.Equal(t, tt.want[tier], rate, "%s at S=%v", tier, tt.level)
				default:
					require.InDelta(t, tt.want[tier], rate, 0.02, "%s at S=%v", tier, tt.level)
				}
			}
			require.Zero(t, dropped[TierCritical])
			if dropped[TierRead] > 0 {
				require.Equal(t, offered[TierTest], dropped[TierTest], "read cut before test was gone")
			}
			if dropped[TierWrite] > 0 {
				require.Equal(t, offered[TierRead], dropped[TierRead], "write cut before read was gone")
			}
			// Overall, S is the fraction of sheddable traffic dropped.
			sheddableOffered := offered[TierTest] + offered[TierRead] + offered[TierWrite]
			sheddableDropped := dropped[TierTest] + dropped[TierRead] + dropped[TierWrite]
			require.InDelta(t, max(tt.level, 0), float64(sheddableDropped)/float64(sheddableOffered), 0.01)
		})
	}
}

func TestSharesMeasuredBeforeShedding(t *testing.T) {
	s := newShedder(t, rawConfig())
	for i := range 1000 {
		s.Admit(at(0), mix[i%len(mix)])
	}
	s.ObserveUtilization(at(0), 0.75)
	s.setLevel(0.5)
	before := s.DropProbability(TierRead)
	// Shedding half the traffic must not shift the shares it is based on.
	for sec := 1; sec <= 30; sec++ {
		now := at(time.Duration(sec) * time.Second)
		for i := range 100 {
			s.Admit(now, mix[i%len(mix)])
		}
		s.ObserveUtilization(now, 0.75)
	}
	require.InDelta(t, before, s.DropProbability(TierRead), 1e-9)
}

func TestSharesFollowTrafficMix(t *testing.T) {
	s := newShedder(t, rawConfig())
	s.ObserveUtilization(at(0), 0.75)
	s.setLevel(0.5)
	// Only read traffic for a while: S=0.5 means half of reads go.
	for sec := 1; sec <= 120; sec++ {
		now := at(time.Duration(sec) * time.Second)
		for range 10 {
			s.Admit(now, TierRead)
		}
		s.ObserveUtilization(now, 0.75)
	}
	require.InDelta(t, 0.5, s.DropProbability(TierRead), 1e-3)
	require.Equal(t, 1.0, s.DropProbability(TierTest))
	require.Zero(t, s.DropProbability(TierWrite))
}

func TestStaleSamplerFailsOpen(t *testing.T) {
	s := newShedder(t, rawConfig())
	s.ObserveUtilization(at(0), 1)
	s.setLevel(1)
	require.False(t, s.Admit(at(28*time.Second), TierTest))
	require.True(t, s.Admit(at(28*time.Second+time.Millisecond), TierTest))
	require.True(t, s.Admit(at(0), TierCritical))
}

func TestInvalidTierTreatedAsWrite(t *testing.T) {
	s := newShedder(t, rawConfig())
	s.ObserveUtilization(at(0), 1)
	s.setLevel(1)
	require.False(t, s.Admit(at(0), Tier(42)))
	require.False(t, s.Admit(at(0), TierNone))
}

func TestUpdate(t *testing.T) {
	s := newShedder(t, rawConfig())
	old := s.Config()

	t.Run("invalid is refused and old kept", func(t *testing.T) {
		bad := old
		bad.Good, bad.Bad, bad.StartAfter = 0.9, 0.8, 0
		err := s.Update(bad)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, "bad: must be greater than good")
		require.ErrorContains(t, err, "start_after")
		require.ErrorContains(t, err, "keeping current settings")
		require.Equal(t, old, s.Config())
		require.Equal(t, -28.0/120, s.Level())
	})

	t.Run("at rest moves to the new floor", func(t *testing.T) {
		cfg := old
		cfg.StartAfter = 10 * time.Second
		require.NoError(t, s.Update(cfg))
		require.Equal(t, -10.0/120, s.Level())
		require.NoError(t, s.Update(old))
		require.Equal(t, -28.0/120, s.Level())
	})

	t.Run("level is kept and clamped", func(t *testing.T) {
		s := newShedder(t, rawConfig())
		s.ObserveUtilization(at(0), 1)
		s.setLevel(0.5)
		cfg := s.Config()
		cfg.FullAfter = 60 * time.Second
		require.NoError(t, s.Update(cfg))
		require.Equal(t, 0.5, s.Level())
		s.setLevel(-0.2)
		cfg.StartAfter = 6 * time.Second // floor -0.1
		require.NoError(t, s.Update(cfg))
		require.Equal(t, -0.1, s.Level())
	})

	t.Run("takes effect on the next decision", func(t *testing.T) {
		s := newShedder(t, rawConfig())
		s.ObserveUtilization(at(0), 1)
		s.setLevel(1)
		require.False(t, s.Admit(at(0), TierRead))

		cfg := s.Config()
		cfg.Enabled = false // shadow mode
		require.NoError(t, s.Update(cfg))
		require.True(t, s.Admit(at(0), TierRead))
		require.Equal(t, 1.0, s.Level(), "the ramp keeps running in shadow mode")

		// Raising bad turns u=0.9 from overload into the dead zone.
		cfg = s.Config()
		cfg.Enabled = true
		require.NoError(t, s.Update(cfg))
		s.setLevel(0.5)
		s.ObserveUtilization(at(time.Second), 0.9)
		require.Greater(t, s.Level(), 0.5)
		cfg.Bad = 0.95
		require.NoError(t, s.Update(cfg))
		lvl := s.Level()
		s.ObserveUtilization(at(2*time.Second), 0.9)
		require.Equal(t, lvl, s.Level())

		// Classification rules are live too.
		require.Equal(t, TierRead, s.Classify("GET", "/x", noHeaders, false))
		cfg.Tiers.Paths = append(cfg.Tiers.Paths, PrefixRule{Prefix: "/x", Tier: TierTest})
		require.NoError(t, s.Update(cfg))
		require.Equal(t, TierTest, s.Classify("GET", "/x", noHeaders, false))
	})

	t.Run("config copy is isolated", func(t *testing.T) {
		cfg := s.Config()
		cfg.Tiers.Paths[0].Tier = TierTest
		require.Equal(t, TierCritical, s.Config().Tiers.Paths[0].Tier)
	})
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.FullAfter = -time.Second
	_, err := New(cfg, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestRunSamplesUntilCancelled(t *testing.T) {
	clock := atomic.Int64{}
	s := newShedder(t, rawConfig(), WithClock(func() time.Time {
		return at(time.Duration(clock.Add(1)) * time.Second) // 1 s per sample
	}))
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := s.Run(ctx, time.Millisecond, func() float64 {
		calls++
		if calls == 40 {
			cancel()
		}
		return 1
	})
	require.ErrorIs(t, err, context.Canceled)
	require.GreaterOrEqual(t, calls, 40)
	require.Greater(t, s.Level(), 0.0, "40 s of samples at u=1 is past start_after")

	require.ErrorIs(t, s.Run(context.Background(), 0, func() float64 { return 0 }), ErrInvalidConfig)
}

func TestAdmitConcurrentWithObserve(t *testing.T) {
	s := newShedder(t, rawConfig(), WithRand(rand.Float64))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			s.ObserveUtilization(at(time.Duration(i)*100*time.Millisecond), 1)
		}
	}()
	shed := 0
	for i := range 20000 {
		if !s.Admit(at(time.Duration(i)*10*time.Millisecond), mix[i%len(mix)]) {
			shed++
		}
	}
	<-done
	t.Logf("shed %d of 20000 while the ramp moved", shed)
}
