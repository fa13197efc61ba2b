package limit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Every registered algorithm parses back from its name, and nothing else
// parses.
func TestRegistryNames(t *testing.T) {
	require.Len(t, limit.All(), len(limit.Names()))
	for _, name := range limit.Names() {
		a, err := limit.Parse(name)
		require.NoError(t, err, name)
		require.Equal(t, name, a.String())
		require.True(t, a.Valid())
		text, err := a.MarshalText()
		require.NoError(t, err)
		require.Equal(t, name, string(text))
		require.NotEmpty(t, a.Spec().Script, name)
		require.NotNil(t, a.Spec().Take, name)
	}
	_, err := limit.Parse("nope")
	require.ErrorIs(t, err, limit.ErrUnknownAlgorithm)
	require.False(t, limit.Algorithm(0).Valid())
}

// Problems names the rule field of every bad value, all at once.
func TestProblemsNameTheField(t *testing.T) {
	fields := func(l limit.Limit) []string {
		var out []string
		for _, p := range l.Problems() {
			out = append(out, p.Field)
		}
		return out
	}
	ok := limit.Limit{Key: "k", Algorithm: limit.SlidingLog, Limit: 10, Window: time.Second}
	require.Empty(t, ok.Problems())
	require.NoError(t, ok.Validate())

	for name, tc := range map[string]struct {
		l    limit.Limit
		want []string
	}{
		"no algorithm":             {limit.Limit{Key: "k", Limit: 1, Window: time.Second}, []string{"algorithm"}},
		"zero limit":               {limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Window: time.Second}, []string{"limit"}},
		"log too big":              {limit.Limit{Key: "k", Algorithm: limit.SlidingLog, Limit: limit.MaxMembers + 1, Window: time.Second}, []string{"limit"}},
		"window too short":         {limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 1, Window: time.Microsecond}, []string{"window"}},
		"window too long":          {limit.Limit{Key: "k", Algorithm: limit.SlidingWindow, Limit: 1, Window: 25 * time.Hour}, []string{"window"}},
		"fixed window past a year": {limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 1, Window: 367 * 24 * time.Hour}, []string{"window"}},
		"window not whole ms":      {limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 1, Window: 1500 * time.Microsecond}, []string{"window"}},
		"burst where none":         {limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 1, Window: time.Second, Burst: 5}, []string{"burst"}},
		"min_interval where none":  {limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 1, Window: time.Second, MinInterval: time.Millisecond}, []string{"min_interval"}},
		"several at once":          {limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Window: time.Microsecond, Burst: -1}, []string{"limit", "window", "burst"}},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.want, fields(tc.l))
			want := limit.ErrInvalidLimit
			if !tc.l.Algorithm.Valid() {
				want = limit.ErrUnknownAlgorithm
			}
			require.ErrorIs(t, tc.l.Validate(), want)
		})
	}
}

// take runs the algorithm over memory, as the memory store does.
func take(l limit.Limit, st *limit.State, nowUs, cost int64) limit.Outcome {
	a := limit.ArgsFor(l, nowUs)
	a.Cost, a.Need, a.ID = cost, 1, "id"
	return l.Algorithm.Spec().Take(st, a, st != nil && !st.Expired(nowUs))
}

// A fixed window admits Limit per epoch-aligned window, tells a denied
// request to come back at the next window, and starts over there.
func TestFixedWindowOverMemory(t *testing.T) {
	l := limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 3, Window: time.Second}
	var st limit.State
	start := int64(10_000_250_000) // 250 ms into a window (µs)
	for i := range 3 {
		o := take(l, &st, start+int64(i)*1000, 1)
		require.EqualValues(t, 1, o.Admitted, i)
		require.EqualValues(t, 2-i, o.Remaining, i)
	}
	o := take(l, &st, start+3000, 1)
	require.Zero(t, o.Admitted)
	require.EqualValues(t, 747, o.RetryMs, "the rest of the window")
	require.Equal(t, o.ResetMs, o.RetryMs)
	o = take(l, &st, start+750_000, 1)
	require.EqualValues(t, 1, o.Admitted, "the next window")
	require.EqualValues(t, 2, o.Remaining)
}

// The sliding log keeps min_interval between admissions and says how long
// is left of it.
func TestSlidingLogMinIntervalOverMemory(t *testing.T) {
	l := limit.Limit{Key: "k", Algorithm: limit.SlidingLog, Limit: 10, Window: time.Minute, MinInterval: 100 * time.Millisecond}
	var st limit.State
	require.EqualValues(t, 1, take(l, &st, 1_000_000, 1).Admitted)
	o := take(l, &st, 1_040_000, 1)
	require.Zero(t, o.Admitted)
	require.EqualValues(t, 60, o.RetryMs)
	require.EqualValues(t, 1, take(l, &st, 1_100_000, 1).Admitted, "min_interval after the last admission")
}
