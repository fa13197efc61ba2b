package accuracy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// t0 is on a 10 s boundary, so fixed windows of 1 s and 10 s start there.
var t0 = time.Unix(1_700_000_000, 0)

func ms(v float64) time.Time { return t0.Add(time.Duration(v * float64(time.Millisecond))) }

var far = t0.Add(24 * time.Hour)

func admit(policy string, sent, recv float64) Event {
	return Event{Region: "eu-west", PoP: "ams", Sent: ms(sent), Recv: ms(recv), Status: 200, Applied: []string{policy}}
}

func deny(policy string, sent, recv float64, retry time.Duration) Event {
	return Event{Region: "eu-west", PoP: "ams", Sent: ms(sent), Recv: ms(recv), Status: 429,
		Applied: []string{policy}, Violated: []string{policy}, ViolatedRead: true, RetryAfter: retry, HasRetry: true}
}

func failed(sent, recv float64) Event {
	return Event{Region: "eu-west", PoP: "ams", Sent: ms(sent), Recv: ms(recv)}
}

var (
	log3 = Policy{Name: "log", Algorithm: SlidingLog, Quota: 3, Window: time.Second, ClientKeyed: true}
	fw2  = Policy{Name: "fw", Algorithm: FixedWindow, Quota: 2, Window: 10 * time.Second, ClientKeyed: true}
	tb   = Policy{Name: "tb", Algorithm: TokenBucket, Quota: 5, Window: time.Second, ClientKeyed: true}
	sw   = Policy{Name: "sw", Algorithm: SlidingWindow, Quota: 3, Window: time.Second, ClientKeyed: true}
	host = Policy{Name: "host", Algorithm: SlidingLog, Quota: 3, Window: time.Second} // keyed on the host: not the client's alone
)

func kinds(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Kind+"/"+f.Policy)
	}
	return out
}

func run(policies []Policy, events ...Event) ([]Finding, *Checker) {
	c := New(policies)
	for _, ev := range events {
		c.Record(ev)
	}
	return c.Flush(far), c
}

func TestHandBuiltTimelines(t *testing.T) {
	tests := []struct {
		name   string
		policy Policy
		events []Event
		want   []string
	}{
		// sliding_log, q=3 per 1 s.
		{"4 admissions whose intervals fit in 950 ms", log3, []Event{
			admit("log", 0, 10), admit("log", 200, 230), admit("log", 500, 520), admit("log", 900, 950),
		}, []string{"over_admission/log"}},
		{"4 admissions spanning 1050 ms from first send to last receipt: may be legal", log3, []Event{
			admit("log", 0, 10), admit("log", 200, 230), admit("log", 500, 520), admit("log", 990, 1050),
		}, nil},
		{"3 admissions in the window is the quota", log3, []Event{
			admit("log", 0, 5), admit("log", 1, 6), admit("log", 2, 7),
		}, nil},
		{"a denial with one admission in the window", log3, []Event{
			admit("log", 0, 10), deny("log", 100, 110, time.Second),
		}, []string{"false_denial/log"}},
		{"a denial after three admissions", log3, []Event{
			admit("log", 0, 10), admit("log", 20, 30), admit("log", 40, 50), deny("log", 100, 110, time.Second),
		}, nil},
		{"a denial after two admissions and an error that may have been admitted", log3, []Event{
			admit("log", 0, 10), admit("log", 20, 30), failed(40, 5040), deny("log", 100, 110, time.Second),
		}, nil},
		{"a denial whose window may still hold an admission received just before it opened", log3, []Event{
			admit("log", 0, 10), admit("log", 20, 30), admit("log", 40, 1001), deny("log", 1005, 1010, time.Second),
		}, nil},
		{"the oldest admission has certainly left the window", log3, []Event{
			admit("log", 0, 10), admit("log", 20, 30), admit("log", 40, 50), deny("log", 1060, 1070, time.Second),
		}, []string{"false_denial/log"}},
		{"an admission sent before the denial was answered counts as possible", log3, []Event{
			admit("log", 0, 10), admit("log", 20, 30), deny("log", 100, 200, time.Second), admit("log", 150, 300),
		}, nil},
		{"retry after Retry-After, nothing admitted in between, denied again", log3, []Event{
			admit("log", 0, 5), admit("log", 1, 6), admit("log", 2, 7),
			deny("log", 100, 105, time.Second), deny("log", 1110, 1115, time.Second),
		}, []string{"false_denial/log", "broken_promise/log"}},
		{"retry before Retry-After is not a test of the promise", log3, []Event{
			admit("log", 0, 5), admit("log", 1, 6), admit("log", 2, 7),
			deny("log", 100, 105, time.Second), deny("log", 900, 905, time.Second),
		}, nil},
		{"another request of the client admitted in between: the promise is void", log3, []Event{
			admit("log", 0, 5), admit("log", 1, 6), admit("log", 2, 7),
			deny("log", 100, 105, time.Second), admit("log", 1004, 1009), admit("log", 1050, 1052), admit("log", 1060, 1080),
			deny("log", 1110, 1115, time.Second),
		}, nil},

		// fixed_window, q=2 per 10 s aligned on t0.
		{"three admissions inside one fixed window", fw2, []Event{
			admit("fw", 1000, 1010), admit("fw", 2000, 2010), admit("fw", 9000, 9010),
		}, []string{"over_admission/fw"}},
		{"two per window across a boundary (the documented 2x burst)", fw2, []Event{
			admit("fw", 8000, 8010), admit("fw", 9000, 9010), admit("fw", 10100, 10110), admit("fw", 10200, 10210),
		}, nil},
		{"an admission straddling the boundary may belong to the old window", fw2, []Event{
			admit("fw", 9995, 10005), admit("fw", 10100, 10110), admit("fw", 10200, 10210),
		}, nil},
		{"a denial in a fresh window with nothing admitted", fw2, []Event{
			admit("fw", 1000, 1010), admit("fw", 2000, 2010), deny("fw", 10100, 10110, time.Second),
		}, []string{"false_denial/fw"}},
		{"a denial straddling a boundary may have been decided in the full window", fw2, []Event{
			admit("fw", 1000, 1010), admit("fw", 2000, 2010), deny("fw", 9990, 10010, time.Second),
		}, nil},

		// Approximate algorithms: promises only.
		{"sliding_window over quota is not over-admission", sw, []Event{
			admit("sw", 0, 1), admit("sw", 2, 3), admit("sw", 4, 5), admit("sw", 6, 7), admit("sw", 8, 9),
		}, nil},
		{"token_bucket broken promise", tb, []Event{
			deny("tb", 0, 1, time.Second), deny("tb", 1001, 1002, time.Second),
		}, []string{"broken_promise/tb"}},
		{"not keyed on the client alone: nothing is checked", host, []Event{
			admit("host", 0, 1), admit("host", 2, 3), admit("host", 4, 5), admit("host", 6, 7),
			deny("host", 8, 9, time.Second), deny("host", 1100, 1101, time.Second),
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := run([]Policy{tc.policy}, tc.events...)
			require.Equal(t, tc.want, kinds(got), "%+v", got)
		})
	}
}

// jittered builds a client's timeline from the server's decision instants:
// each request is sent up to 15 ms before and received up to 15 ms after.
func jittered(r *rand.Rand, policy string, decisions []float64) []Event {
	out := make([]Event, len(decisions))
	for i, d := range decisions {
		out[i] = admit(policy, d-15*r.Float64(), d+15*r.Float64())
	}
	return out
}

func TestJitteredSteadyTraffic(t *testing.T) {
	q5 := Policy{Name: "log", Algorithm: SlidingLog, Quota: 5, Window: time.Second, ClientKeyed: true}
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		var exact, over []float64
		for i := range 60 {
			exact = append(exact, float64(i)*200) // 5 per second exactly: what a sliding log admits
			over = append(over, float64(i)*190)   // 6 in 950 ms: one too many
		}
		got, c := run([]Policy{q5}, jittered(r, "log", exact)...)
		require.Empty(t, got, "seed %d: exactly the quota must not fire", seed)
		require.Equal(t, int64(60), c.Stats().CheckedCounts)
		require.Zero(t, c.Stats().PromisesTested, "no 429, no promise")

		got, _ = run([]Policy{q5}, jittered(r, "log", over)...)
		require.NotEmpty(t, got, "seed %d: 6 admissions in 950 ms must fire", seed)
		for _, f := range got {
			require.Equal(t, OverAdmission, f.Kind)
		}
	}
}

func TestPromisesTestedCountsKeptAndBroken(t *testing.T) {
	_, c := run([]Policy{log3},
		admit("log", 0, 5), admit("log", 1, 6), admit("log", 2, 7),
		deny("log", 100, 105, time.Second), // promise: not before 1105
		deny("log", 500, 505, time.Second), // too early: tests nothing (promise: 1505)
		admit("log", 1200, 1210),           // after the first promise: kept
		admit("log", 1300, 1310),           // an admission came in between: tests nothing
	)
	s := c.Stats()
	require.Equal(t, int64(1), s.PromisesTested)
	require.Zero(t, s.Findings[BrokenPromise])
}

func TestScopeAndRegionSplitTimelines(t *testing.T) {
	perPoP := Policy{Name: "pop", Algorithm: SlidingLog, Quota: 2, Window: time.Second, ClientKeyed: true, PerPoP: true}
	perRegion := perPoP
	perRegion.Name, perRegion.PerPoP = "region", false
	at := func(policy, region, pop string, sent float64) Event {
		ev := admit(policy, sent, sent+1)
		ev.Region, ev.PoP = region, pop
		return ev
	}
	events := func(p string) []Event {
		return []Event{
			at(p, "eu-west", "ams", 0), at(p, "eu-west", "ams", 10),
			at(p, "eu-west", "fra", 20), at(p, "eu-west", "fra", 30),
			at(p, "us-east", "iad", 40), at(p, "us-east", "iad", 50), // a roaming client: its own counter in us-east
		}
	}
	got, _ := run([]Policy{perPoP}, events("pop")...)
	require.Empty(t, got)
	got, _ = run([]Policy{perRegion}, events("region")...)
	require.Equal(t, []string{"over_admission/region", "over_admission/region"}, kinds(got), "ams+fra share the region's counter")
	require.Equal(t, "eu-west", got[0].Region)

	ev := admit("region", 0, 1)
	ev.Client = 2
	got, _ = run([]Policy{perRegion}, append(events("region")[:2], ev)...)
	require.Empty(t, got, "another client has its own counter")
}

func TestRecordClassifiesResponses(t *testing.T) {
	c := New([]Policy{log3})
	shed := admit("log", 0, 1)
	shed.Status, shed.Applied = 503, nil
	unread := deny("log", 2, 3, time.Second)
	unread.ViolatedRead = false
	stranger := admit("nope", 4, 5)
	c.Record(shed)
	c.Record(unread)
	c.Record(stranger)
	c.Record(failed(6, 7))
	c.Record(admit("log", 8, 9))
	s := c.Stats()
	require.Equal(t, int64(5), s.Events)
	require.Equal(t, int64(1), s.Unattributed)
	require.Equal(t, int64(1), s.UnknownPolicy)
	require.Equal(t, int64(1), s.Unknown)
	require.Equal(t, int64(2), s.Admissions)
	require.Equal(t, int64(0), s.Denials)
}

func TestFlushWaitsForSettledTimeAndCountsLateEvents(t *testing.T) {
	c := New([]Policy{log3})
	c.Record(admit("log", 0, 10))
	c.Record(deny("log", 100, 110, time.Second))
	// Settled before the denial was received: it is not judged yet, since
	// an admission sent before it may still be in flight.
	require.Empty(t, c.Flush(ms(50)))
	require.Equal(t, int64(1), c.Stats().CheckedCounts, "only the admission was evaluated")
	require.False(t, c.Record(admit("log", 60, 400)))
	require.False(t, c.Record(admit("log", 70, 420)))
	require.Empty(t, c.Flush(far), "the late admissions fill the window: not a false denial")

	require.True(t, c.Record(admit("log", 30, 100)), "sent before the settled time")
	require.Equal(t, int64(1), c.Stats().Late)
}

func TestPruneKeepsMemoryBounded(t *testing.T) {
	c := New([]Policy{log3})
	for i := range 10000 {
		c.Record(admit("log", float64(i)*1000, float64(i)*1000+5))
		if i%100 == 0 {
			c.Flush(ms(float64(i) * 1000))
		}
	}
	c.Flush(ms(1e7 + 1))
	for _, tl := range c.timelines {
		require.Less(t, len(tl.entries), 100)
	}
	require.Empty(t, c.Flush(far))
	require.Equal(t, int64(10000), c.Stats().CheckedCounts)
}

func TestFindingsCarryTheirEvidence(t *testing.T) {
	got, _ := run([]Policy{log3},
		admit("log", 0, 10), admit("log", 200, 230), admit("log", 500, 520), admit("log", 900, 950),
		deny("log", 2000, 2010, time.Second),
	)
	require.Equal(t, []string{"over_admission/log", "false_denial/log"}, kinds(got))
	require.Len(t, got[0].Evidence, 4)
	require.Equal(t, ms(0), got[0].Evidence[0].Sent)
	require.Equal(t, ms(950), got[0].Evidence[3].Recv)
	require.Empty(t, got[1].Evidence, "nothing could count for the denial at 2 s")
}

func in(region string, ev Event) Event {
	ev.Region = region
	return ev
}

// A leased rule is held to ⌊q·(1+t)⌋, not q; a global rule's admissions
// count across regions, a region rule's in each region alone.
func TestLeasedAndGlobalBounds(t *testing.T) {
	leased := Policy{Name: "leased", Algorithm: FixedWindow, Quota: 10, Window: 10 * time.Second, ClientKeyed: true, Tolerance: 0.2}
	global := leased
	global.Name, global.Global = "global", true
	region := leased
	region.Name = "region"
	require.EqualValues(t, 12, leased.Bound())
	require.EqualValues(t, fw2.Quota, fw2.Bound(), "an exact rule's bound is its quota")

	admissions := func(policy string, n int, regions ...string) []Event {
		var out []Event
		for i := range n {
			out = append(out, in(regions[i%len(regions)], admit(policy, float64(10*i), float64(10*i+5))))
		}
		return out
	}
	t.Run("leased within its tolerance", func(t *testing.T) {
		fs, c := run([]Policy{leased}, admissions("leased", 12, "eu-west")...)
		require.Empty(t, kinds(fs))
		require.EqualValues(t, 12, c.Stats().CheckedCounts)
	})
	t.Run("leased past its tolerance", func(t *testing.T) {
		fs, _ := run([]Policy{leased}, admissions("leased", 13, "eu-west")...)
		require.Equal(t, []string{"over_admission/leased"}, kinds(fs))
		require.Contains(t, fs[0].Detail, "bound 12")
	})
	t.Run("global counts across regions", func(t *testing.T) {
		fs, c := run([]Policy{global}, admissions("global", 13, "eu-west", "us-east")...)
		require.Equal(t, []string{"over_admission/global"}, kinds(fs))
		ps := c.Stats().ByPolicy["global"]
		require.EqualValues(t, 13, ps.MostInWindow, "the most admissions in one window, over both regions")
		require.EqualValues(t, 13, ps.Admissions)
		require.EqualValues(t, 1, ps.Findings[OverAdmission])
	})
	t.Run("region rule counts each region alone", func(t *testing.T) {
		fs, _ := run([]Policy{region}, admissions("region", 13, "eu-west", "us-east")...)
		require.Empty(t, kinds(fs))
	})
	t.Run("global false denial sees every region's admissions", func(t *testing.T) {
		evs := admissions("global", 9, "eu-west", "us-east")
		evs = append(evs, in("us-east", deny("global", 200, 205, time.Second)))
		fs, _ := run([]Policy{global}, evs...)
		require.Equal(t, []string{"false_denial/global"}, kinds(fs))
		evs = admissions("global", 10, "eu-west", "us-east")
		evs = append(evs, in("us-east", deny("global", 200, 205, time.Second)))
		fs, c := run([]Policy{global}, evs...)
		require.Empty(t, kinds(fs))
		ps := c.Stats().ByPolicy["global"]
		require.EqualValues(t, 10, ps.MostInWindow)
		require.EqualValues(t, 1, ps.Denials)
		require.Zero(t, ps.Findings[FalseDenial])
	})
}
