package limit_test

import (
	"strconv"
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

// take runs the algorithm over memory, as the memory store does, for one
// request of cost units (admitted whole or not at all).
func take(l limit.Limit, st *limit.State, nowUs, cost int64) limit.Result {
	return takeAs(l, st, nowUs, cost, "id")
}

// takeAs is take with the id the call's members are named after.
func takeAs(l limit.Limit, st *limit.State, nowUs, cost int64, id string) limit.Result {
	a := limit.ArgsFor(l, nowUs)
	a.Cost, a.Need, a.ID = cost, cost, id
	return l.Algorithm.Spec().Take(st, a, st != nil && !st.Expired(nowUs))
}

// t0 is a time (µs) on a boundary of every window below.
const t0 = int64(10_000_000_000)

// step is one request of a table of times: cost units at t0+at, and the
// outcome {admitted, remaining, reset ms, retry ms, state}.
type step struct {
	at   time.Duration
	cost int64
	want limit.Result
}

// Each algorithm's decisions on a table of times, worked out by hand from
// its definition (the comment on each row), not read back from the code.
func TestDecisionsOnATableOfTimes(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name  string
		l     limit.Limit
		steps []step
	}{
		{
			// 10 per second: a token every 100 ms, 10 at most.
			name: "token bucket",
			l:    limit.Limit{Key: "k", Algorithm: limit.TokenBucket, Limit: 10, Window: time.Second},
			steps: []step{
				{0, 1, limit.Result{Admitted: 1, Remaining: 9, ResetMs: 100}},                       // full again in 100 ms
				{0, 9, limit.Result{Admitted: 9, Remaining: 0, ResetMs: 1000}},                      // the rest of the burst
				{50 * ms, 1, limit.Result{Remaining: 0, ResetMs: 950, RetryMs: 50}},                 // the next token in 50 ms
				{100 * ms, 1, limit.Result{Admitted: 1, Remaining: 0, ResetMs: 1000}},               // one token back
				{2100 * ms, 3, limit.Result{Admitted: 3, Remaining: 7, ResetMs: 300}},               // full again, never above 10
				{2100 * ms, 8, limit.Result{Admitted: 0, Remaining: 7, ResetMs: 300, RetryMs: 100}}, // whole or not at all
			},
		},
		{
			// 10 per second with a bucket of 2.
			name: "token bucket with a burst",
			l:    limit.Limit{Key: "k", Algorithm: limit.TokenBucket, Limit: 10, Window: time.Second, Burst: 2},
			steps: []step{
				{0, 1, limit.Result{Admitted: 1, Remaining: 1, ResetMs: 100}},
				{0, 2, limit.Result{Remaining: 1, ResetMs: 100, RetryMs: 100}}, // two fit once one more is back
				{100 * ms, 2, limit.Result{Admitted: 2, Remaining: 0, ResetMs: 200}},
				{100 * ms, 3, limit.Result{Remaining: 0, ResetMs: 200, RetryMs: 200}}, // more than the bucket: the time until it is full
			},
		},
		{
			// A bucket of 10 leaking 10 per second (1 per 100 ms).
			name: "leaky bucket",
			l:    limit.Limit{Key: "k", Algorithm: limit.LeakyBucket, Limit: 10, Window: time.Second},
			steps: []step{
				{0, 4, limit.Result{Admitted: 4, Remaining: 6, ResetMs: 400}},         // level 4, empty in 400 ms
				{100 * ms, 7, limit.Result{Admitted: 7, Remaining: 0, ResetMs: 1000}}, // 3 left + 7 = full
				{150 * ms, 1, limit.Result{Remaining: 0, ResetMs: 950, RetryMs: 50}},  // 9.5: room for 1 in 50 ms
				{200 * ms, 1, limit.Result{Admitted: 1, Remaining: 0, ResetMs: 1000}}, // 9 + 1
				{700 * ms, 2, limit.Result{Admitted: 2, Remaining: 3, ResetMs: 700}},  // 5 leaked since +200 ms: 5 + 2
			},
		},
		{
			// 10 per second, the previous window weighted by what is left of it.
			name: "sliding window",
			l:    limit.Limit{Key: "k", Algorithm: limit.SlidingWindow, Limit: 10, Window: time.Second},
			steps: []step{
				{0, 6, limit.Result{Admitted: 6, Remaining: 4, ResetMs: 2000, State: 10_000_000}},
				// 6 + 5 > 10; next window, 6·(1000−e)/1000 + 5 ≤ 10 from e = 167 ms.
				{500 * ms, 5, limit.Result{Remaining: 4, ResetMs: 1500, RetryMs: 667, State: 10_000_000}},
				// 6·750/1000 = 4.5 of the previous: 5 fit.
				{1250 * ms, 5, limit.Result{Admitted: 5, Remaining: 0, ResetMs: 1750, State: 10_001_000}},
				// 6·500/1000 = 3 of the previous, 5 now: 2 fit.
				{1500 * ms, 1, limit.Result{Admitted: 1, Remaining: 1, ResetMs: 1500, State: 10_001_000}},
				// Two windows later nothing is left of either.
				{3100 * ms, 1, limit.Result{Admitted: 1, Remaining: 9, ResetMs: 1900, State: 10_003_000}},
			},
		},
		{
			// At most 3 in any second.
			name: "sliding log",
			l:    limit.Limit{Key: "k", Algorithm: limit.SlidingLog, Limit: 3, Window: time.Second},
			steps: []step{
				{0, 1, limit.Result{Admitted: 1, Remaining: 2, ResetMs: 1000}},
				{200 * ms, 2, limit.Result{Admitted: 2, Remaining: 0, ResetMs: 1000}},
				{500 * ms, 1, limit.Result{Remaining: 0, ResetMs: 700, RetryMs: 500}},  // the first leaves the window at +1 s
				{1000 * ms, 1, limit.Result{Admitted: 1, Remaining: 0, ResetMs: 1000}}, // it has
				{1100 * ms, 2, limit.Result{Remaining: 0, ResetMs: 900, RetryMs: 100}}, // room for 2 once both from +200 ms leave
				{1100 * ms, 4, limit.Result{Remaining: 0, ResetMs: 900, RetryMs: 900}}, // never fits: until the log is empty
			},
		},
		{
			// 2 per epoch-aligned second.
			name: "fixed window",
			l:    limit.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 2, Window: time.Second},
			steps: []step{
				{250 * ms, 1, limit.Result{Admitted: 1, Remaining: 1, ResetMs: 750, State: 10_000_000}},
				{900 * ms, 2, limit.Result{Remaining: 1, ResetMs: 100, RetryMs: 100, State: 10_000_000}},
				{999 * ms, 1, limit.Result{Admitted: 1, Remaining: 0, ResetMs: 1, State: 10_000_000}},
				{1000 * ms, 2, limit.Result{Admitted: 2, Remaining: 0, ResetMs: 1000, State: 10_001_000}}, // a new window, all of it
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.l.Validate())
			var st limit.State
			for i, s := range tc.steps {
				got := takeAs(tc.l, &st, t0+s.at.Microseconds(), s.cost, strconv.Itoa(i))
				require.Equal(t, s.want, got, "step %d: cost %d at +%s", i, s.cost, s.at)
			}
		})
	}
}

// Concurrency holds a unit from admission until it is released, or until
// the window (the stale-slot TTL) passes for a unit never released.
func TestConcurrencyHoldsUntilReleased(t *testing.T) {
	l := limit.Limit{Key: "k", Algorithm: limit.Concurrency, Limit: 2, Window: 10 * time.Second}
	require.NoError(t, l.Validate())
	var st limit.State
	at := func(d time.Duration) int64 { return t0 + d.Microseconds() }
	require.Equal(t, limit.Result{Admitted: 1, Remaining: 1, ResetMs: 10_000}, takeAs(l, &st, at(0), 1, "a"))
	require.Equal(t, limit.Result{Admitted: 1, Remaining: 0, ResetMs: 9_000}, takeAs(l, &st, at(time.Second), 1, "b"))
	require.Equal(t, limit.Result{Remaining: 0, ResetMs: 8_000, RetryMs: 1_000}, takeAs(l, &st, at(2*time.Second), 1, "c"),
		"full: retry capped at 1 s, a response usually ends sooner than a slot goes stale")

	// a's response ends: its slot is free at once.
	rel := limit.ArgsFor(l, at(2500*time.Millisecond))
	rel.Cost, rel.ID, rel.First = 1, "a", 1
	require.True(t, l.Algorithm.Spec().Refund(&st, rel))
	require.Equal(t, limit.Result{Admitted: 1, Remaining: 0, ResetMs: 8_500}, takeAs(l, &st, at(2500*time.Millisecond), 1, "d"))

	// b is never released (its edge died): it goes stale 10 s after it was taken.
	require.Equal(t, limit.Result{Remaining: 0, ResetMs: 1, RetryMs: 1}, takeAs(l, &st, at(10999*time.Millisecond), 1, "e"))
	require.Equal(t, limit.Result{Admitted: 1, Remaining: 0, ResetMs: 1_500}, takeAs(l, &st, at(11*time.Second), 1, "f"))
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
