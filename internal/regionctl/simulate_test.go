package regionctl

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// The replay runs the shedder's own ramp: under sustained full utilization
// sampled once a second, S climbs from -start_after/full_after at
// 1/full_after per second and the lowest tier is cut first.
func TestReplayFollowsTheRamp(t *testing.T) {
	cfg := shedder.DefaultConfig()
	cfg.StartAfter, cfg.FullAfter = 2*time.Second, 20*time.Second
	t0 := time.Unix(1_800_000_000, 0)
	var rec recording
	for i := 0; i <= 30; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		rec.util = append(rec.util, sample{at, 1})
		// What the edge would have recorded: the exact ramp.
		rec.level = append(rec.level, sample{at, min(-0.1+float64(i)/20, 1)})
		rec.offered[shedder.TierTest] = append(rec.offered[shedder.TierTest], sample{at, float64(100 * i)})
		rec.offered[shedder.TierRead] = append(rec.offered[shedder.TierRead], sample{at, float64(100 * i)})
	}
	res := replay(cfg, rec, 1)
	require.Less(t, res.deviation, 1e-9, "the replay is the ramp itself")
	require.InDelta(t, 1.0, res.MaxLevel, 1e-9)
	require.Equal(t, 3000.0, res.Offered["test"])
	require.Positive(t, res.Shed["test"])
	require.Greater(t, res.Shed["test"], res.Shed["read"], "test is cut before read")
	require.Zero(t, res.Shed["critical"])
	require.True(t, res.FirstShed.After(t0.Add(2*time.Second)), "nothing is shed for start_after: first at %v", res.FirstShed)
	require.True(t, res.FirstShed.Before(t0.Add(4*time.Second)), "shedding starts soon after start_after: first at %v", res.FirstShed)

	// A different start_after reproduces nothing of this recording.
	cfg.StartAfter = 10 * time.Second
	require.Greater(t, replay(cfg, rec, 1).deviation, 0.05)

	// Without a recorded level there is nothing to reproduce.
	rec.level = nil
	require.True(t, math.IsInf(replay(cfg, rec, 1).deviation, 1))
}

// The adaptive origin limit is replayed on the recorded origin latency:
// learned in either case, refusing only when the settings enable it, never
// critical, and pulled down when the latency rises.
func TestReplayAdaptiveLimit(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var rec recording
	for i := 0; i <= 20; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		rec.util = append(rec.util, sample{at, 0.3})
		rec.offered[shedder.TierRead] = append(rec.offered[shedder.TierRead], sample{at, float64(1800 * i)})
		rec.offered[shedder.TierCritical] = append(rec.offered[shedder.TierCritical], sample{at, float64(200 * i)})
		rtt := 0.020
		if i > 10 {
			rtt = 0.080 // the origin queues: 4× its no-queue latency
		}
		rec.sampleRTT = append(rec.sampleRTT, sample{at, rtt})
		rec.adaptiveLimit = append(rec.adaptiveLimit, sample{at, 42})
	}
	cfg := shedder.DefaultConfig()
	off := replay(cfg, rec, 1)
	require.NotNil(t, off.Adaptive)
	require.False(t, off.Adaptive.Enabled)
	require.Zero(t, off.Adaptive.Refused["read"], "learned, never enforced")
	require.Equal(t, 42.0, *off.Adaptive.Recorded)
	require.Greater(t, off.Adaptive.MaxLimit, float64(cfg.Adaptive.InitialLimit), "2000 req/s at 20 ms needs about 40 in flight: the limit grows")

	cfg.Adaptive.Enabled = true
	on := replay(cfg, rec, 1)
	t.Logf("enforced: limit %.1f..%.1f, final %.1f, refused %v; learned only: limit %.1f..%.1f", on.Adaptive.MinLimit, on.Adaptive.MaxLimit, on.Adaptive.FinalLimit, on.Adaptive.Refused, off.Adaptive.MinLimit, off.Adaptive.MaxLimit)
	require.True(t, on.Adaptive.Enabled)
	require.Positive(t, on.Adaptive.Refused["read"])
	require.Zero(t, on.Adaptive.Refused["critical"])
	require.Less(t, on.Adaptive.MinLimit, on.Adaptive.MaxLimit/2, "the latency rise pulls the limit down")

	// No recorded latency: nothing to replay.
	rec.sampleRTT = nil
	require.Nil(t, replay(cfg, rec, 1).Adaptive)
}

func TestSimulateRejectsBadInput(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no flags":      {[]string{"shedder", "simulate"}, "--region is required"},
		"bad time":      {[]string{"shedder", "simulate", "--region", "r", "--pop", "p", "--prometheus", "http://x", "--from", "yesterday", "--to", "2"}, `--from: "yesterday" is neither`},
		"to < from":     {[]string{"shedder", "simulate", "--region", "r", "--pop", "p", "--prometheus", "http://x", "--from", "20", "--to", "10"}, "--to must be after --from"},
		"not kv":        {[]string{"shedder", "simulate", "--region", "r", "--pop", "p", "--prometheus", "http://x", "--from", "1", "--to", "2", "good"}, `"good" is not key=value`},
		"no prometheus": {[]string{"shedder", "simulate", "--region", "r", "--pop", "p", "--from", "1", "--to", "2"}, "--prometheus"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Main(tc.args, func(string) string { return "" }, &out, &errOut)
			require.Equal(t, ExitUsage, code)
			require.Contains(t, errOut.String(), tc.want)
		})
	}
}
