package behavior

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func defaults(t testing.TB) Params {
	s := DefaultSettings()
	require.Empty(t, s.Validate())
	return ParamsOf(&s)
}

func TestSettingsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string // fields named, in order
	}{
		{"empty section takes the defaults", `{}`, nil},
		{"everything spelled out", `{mode: enforce, horizon: 30s, burst_window: 2s, cooldown: 2m, hysteresis: 0.5,
		  weights: {burst: 2, replay: 0, scan: 1.5, denial: 3}, thresholds: {elevated: 1, suspicious: 2, blocked: 3},
		  signals: {burst_free: 0.5, burst_span: 2, replay_gap: 1s, replay_free: 0, replay_span: 5, scan_free: 10, scan_span: 10, denial_free: 1, denial_span: 2},
		  levels: {elevated: {limit_factor: 0.7}, suspicious: {limit_factor: 0.2, lowest_tier: true}, blocked: {block: true}}}`, nil},
		{"unknown mode", `{mode: strict}`, []string{"behaviour.mode"}},
		{"horizon too short", `{horizon: 1s, burst_window: 500ms}`, []string{"behaviour.horizon"}},
		{"burst window past the horizon", `{horizon: 10s, burst_window: 20s}`, []string{"behaviour.burst_window"}},
		{"sub-millisecond cooldown", `{cooldown: 1500us}`, []string{"behaviour.cooldown"}},
		{"hysteresis above 1", `{hysteresis: 1.5}`, []string{"behaviour.hysteresis"}},
		{"negative weight", `{weights: {scan: -1}}`, []string{"behaviour.weights.scan"}},
		{"thresholds out of order", `{thresholds: {elevated: 2, suspicious: 1}}`, []string{"behaviour.thresholds.suspicious"}},
		{"blocked not above suspicious", `{thresholds: {suspicious: 3}}`, []string{"behaviour.thresholds.blocked"}},
		{"bad spans and frees", `{signals: {scan_span: -2, denial_free: -1, replay_gap: 0s}}`, []string{"behaviour.signals.scan_span", "behaviour.signals.denial_free"}},
		{"limit factors", `{levels: {elevated: {limit_factor: 1.5}, suspicious: {limit_factor: -0.1}}}`, []string{"behaviour.levels.elevated.limit_factor", "behaviour.levels.suspicious.limit_factor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Settings
			require.NoError(t, yaml.Unmarshal([]byte(tc.yaml), &s))
			var fields []string
			for _, p := range s.Validate() {
				fields = append(fields, p.Field)
				require.NotEmpty(t, p.Msg)
			}
			require.Equal(t, tc.want, fields)
			// Validating again changes nothing (the defaults are in).
			c := s.Clone()
			c.Validate()
			require.Equal(t, &s, c)
		})
	}
}

func TestDurationRefusesBareNumbers(t *testing.T) {
	var s Settings
	err := yaml.Unmarshal([]byte(`{horizon: 60}`), &s)
	require.ErrorContains(t, err, `invalid duration "60"`)
}

func TestStep(t *testing.T) {
	p := defaults(t) // thresholds 0.5, 1, 2; hysteresis 0.8; cool-down 60 s
	const s = 1000   // ms
	for _, tc := range []struct {
		name  string
		from  Hold
		score int64
		now   int64
		want  Hold
	}{
		{"normal stays normal", Hold{}, 499, 10 * s, Hold{Normal, 10 * s}},
		{"up to elevated at its threshold", Hold{}, 500, 10 * s, Hold{Elevated, 10 * s}},
		{"straight up to blocked", Hold{}, 2000, 10 * s, Hold{Blocked, 10 * s}},
		{"within hysteresis: held, refreshed", Hold{Suspicious, 0}, 800, 100 * s, Hold{Suspicious, 100 * s}},
		{"below hysteresis, cool-down running: held", Hold{Suspicious, 0}, 799, 59 * s, Hold{Suspicious, 0}},
		{"below hysteresis, cool-down over: down to what the score holds", Hold{Suspicious, 0}, 400, 60 * s, Hold{Elevated, 60 * s}},
		{"cool-down over, nothing left: normal", Hold{Blocked, 0}, 0, 60 * s, Hold{Normal, 60 * s}},
		{"higher score while held: up", Hold{Elevated, 0}, 1000, 5 * s, Hold{Suspicious, 5 * s}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, p.Step(tc.from, tc.score, tc.now))
		})
	}
}

// obsAt is a one-request observation.
func obsAt(h Hasher, path string, q int64) Obs {
	return Obs{N: 1, Judge: 1, Q: q, Routes: []uint64{h.Route(path)}, FP: h.Fingerprint("GET", path, "", nil)}
}

func TestSignals(t *testing.T) {
	p := defaults(t)
	h := NewHasher([]byte("salt-salt-salt-salt"))
	const t0 = int64(1_700_000_000_000)
	t.Run("scan: distinct routes, suspicious by 48", func(t *testing.T) {
		var s State
		var v Verdict
		first := -1
		for i := range 60 {
			v = s.Observe(&p, obsAt(h, fmt.Sprintf("/p/%d", i), 100), t0+int64(i)*100)
			if v.Level >= Suspicious && first < 0 {
				first = i + 1
			}
		}
		require.Equal(t, int64(60), v.Raw.Scan)
		require.Equal(t, 48, first, "scan_free 24 + scan_span 24 distinct routes")
	})
	t.Run("replay: identical requests, not distinct ones", func(t *testing.T) {
		var same, distinct State
		var vs, vd Verdict
		for i := range 20 {
			vs = same.Observe(&p, obsAt(h, "/login", 100), t0+int64(i)*200)
			vd = distinct.Observe(&p, obsAt(h, fmt.Sprintf("/p/%d", i), 100), t0+int64(i)*200)
		}
		require.Equal(t, int64(19), vs.Raw.Replay)
		require.Equal(t, Suspicious, vs.Level) // (19-3)/10 = 1.6 points
		require.Equal(t, int64(0), vd.Raw.Replay)
		require.Equal(t, Normal, vd.Level)
		// A run ends when the gap passes.
		v := same.Observe(&p, obsAt(h, "/login", 100), t0+20*200+p.ReplayGapMs+1)
		require.Equal(t, int64(0), v.Raw.Replay)
	})
	t.Run("denial loop: requests before Retry-After, blocked, then normal after the cool-down", func(t *testing.T) {
		var s State
		now := t0
		s.Observe(&p, Obs{RetryMs: 10_000}, now) // a 429: come back in 10 s
		var v Verdict
		blockedAt := -1
		for i := range 20 {
			now += 100
			v = s.Observe(&p, Obs{N: 1, Judge: 1, Q: 100}, now) // the denial signal alone
			if v.Level == Blocked && blockedAt < 0 {
				blockedAt = i + 1
			}
		}
		require.Equal(t, 13, blockedAt, "denial_free 3 + 2 points × denial_span 5")
		require.Equal(t, Blocked, s.Peek(&p, now+p.CooldownMs-1).Level)
		require.Equal(t, Normal, s.Peek(&p, now+max(p.CooldownMs, p.HorizonMs)).Level)
	})
	t.Run("burst: more than the quota within the burst window", func(t *testing.T) {
		var s State
		var v Verdict
		for i := range 160 {
			v = s.Observe(&p, Obs{N: 1, Judge: 1, Q: 100}, t0+int64(i)*10)
		}
		require.InDelta(t, 1.6, v.Raw.Burst, 1e-9)
		require.Equal(t, Elevated, v.Level) // 0.6 points
	})
}

func TestTrackerIsBounded(t *testing.T) {
	p := defaults(t)
	tr := NewTracker(p, 1024, nil, nil)
	h := NewHasher(nil)
	r := rand.New(rand.NewPCG(1, 2))
	now := int64(1_700_000_000_000)
	for i := range 200_000 {
		id := Identity(nil, KindIP, fmt.Sprintf("10.%d.%d.%d", r.IntN(256), r.IntN(256), r.IntN(256)))
		tr.Observe(id, obsAt(h, "/", 10), now+int64(i))
		tr.Pend(id, Obs{N: 1}, now+int64(i))
	}
	require.LessOrEqual(t, tr.Len(), 1024)
	require.LessOrEqual(t, len(tr.Drain()), 1024, "pending updates are bounded too")
}

func TestTrackerJudgesTheHigherView(t *testing.T) {
	p := defaults(t)
	tr := NewTracker(p, 0, nil, nil)
	now := int64(1_700_000_000_000)
	tr.Observe("a", Obs{N: 1, Judge: 1}, now)
	lv, _ := tr.Judge("a", now)
	require.Equal(t, Normal, lv)
	// The region says suspicious, holding for 30 s.
	tr.Remote("a", Verdict{Level: Suspicious, HoldMs: 30_000}, now, 1000)
	lv, was := tr.Judge("a", now+1)
	require.Equal(t, Suspicious, lv)
	require.Equal(t, Normal, was)
	lv, _ = tr.Judge("a", now+30_001)
	require.Equal(t, Normal, lv, "a reading is trusted only while it holds")
}

func TestIdentity(t *testing.T) {
	a := Identity([]byte("s1"), KindIP, "203.0.113.7")
	require.Len(t, a, 22)
	require.NotEqual(t, a, Identity([]byte("s2"), KindIP, "203.0.113.7"), "salted")
	require.NotEqual(t, a, Identity([]byte("s1"), KindAPIKey, "203.0.113.7"), "kinds apart")
	require.False(t, strings.ContainsAny(a, "{}:"))
	h := NewHasher([]byte("s"))
	require.NotEqual(t, h.Fingerprint("GET", "/a", "x=1", nil), h.Fingerprint("GET", "/a", "x=2", nil))
	require.NotEqual(t, h.Fingerprint("POST", "/a", "", []byte("1")), h.Fingerprint("POST", "/a", "", []byte("2")))
	require.NotEqual(t, h.Fingerprint("GET", "/ab", "", nil), h.Fingerprint("GET", "/a", "b", nil))
	require.True(t, slices.Contains([]uint64{h.Route("/a")}, h.Route("/a")))
	_ = time.Second
}
