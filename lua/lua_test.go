package lua

import (
	"context"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	c := redis.NewClient(&redis.Options{Addr: rd.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// algorithms lists the embedded algorithm scripts (every .lua file but the
// shared parts and the behaviour script).
func algorithms(t *testing.T) []string {
	entries, err := files.ReadDir(".")
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), path.Ext(e.Name()))
		if name != "prelude" && name != "members" && name != "tally" && name != Behaviour {
			out = append(out, name)
		}
	}
	require.GreaterOrEqual(t, len(out), 6)
	return out
}

// Every script Redis is given compiles there: each algorithm's, the batch
// of all of them, and the behaviour script.
func TestEveryScriptLoads(t *testing.T) {
	c := redisClient(t)
	ctx := context.Background()
	var algs []Alg
	for i, name := range algorithms(t) {
		src, err := Source(name)
		require.NoError(t, err, name)
		require.NoError(t, c.ScriptLoad(ctx, src).Err(), name)
		algs = append(algs, Alg{Code: i + 1, Name: name, Keys: 1, Args: 9})
	}
	batch, err := Batch(algs)
	require.NoError(t, err)
	require.NoError(t, c.ScriptLoad(ctx, batch).Err())
	bh, err := Plain(Behaviour)
	require.NoError(t, err)
	require.NoError(t, c.ScriptLoad(ctx, bh).Err())

	_, err = Source("nope")
	require.ErrorContains(t, err, `"nope"`)
	_, err = Batch([]Alg{{Code: 1, Name: "nope"}})
	require.Error(t, err)
}

// Every algorithm of the registry has its script embedded here, every
// embedded algorithm script belongs to an algorithm, and each name this
// package exports reads a script.
func TestScriptsMatchTheRegistry(t *testing.T) {
	var named []string
	for _, a := range limit.All() {
		named = append(named, a.Spec().Script)
	}
	require.ElementsMatch(t, named, algorithms(t))
	for _, name := range []string{SlidingLog, SlidingWindow, GCRA, FixedWindow, Concurrency} {
		require.Contains(t, named, name)
		src, err := Source(name)
		require.NoError(t, err, name)
		require.Contains(t, src, "server_now", "%s: the clock is part of the script", name)
	}
	bh, err := Plain(Behaviour)
	require.NoError(t, err)
	require.NotEmpty(t, bh)
}

// A call with missing or malformed arguments is refused before it touches
// the key, with the scripts' own error.
func TestBadArgumentsRefused(t *testing.T) {
	c := redisClient(t)
	ctx := context.Background()
	for _, name := range algorithms(t) {
		src, err := Source(name)
		require.NoError(t, err)
		for _, argv := range [][]any{
			{},
			{"take", "0", "x", "1000000", "0", "1", "1", "id", "1"},   // limit not a number
			{"take", "0", "10", "-5", "0", "1", "1", "id", "1"},       // window <= 0
			{"take", "0", "10", "1000000", "0", "-1", "1", "id", "1"}, // cost < 0
		} {
			err := c.Eval(ctx, src, []string{"{k}:" + name}, argv...).Err()
			require.ErrorContains(t, err, "edgeguard: bad script arguments", "%s %v", name, argv)
		}
		n, err := c.Exists(ctx, "{k}:"+name).Result()
		require.NoError(t, err)
		require.Zero(t, n, "%s: a refused call wrote nothing", name)
	}
}

// The fixed window's script on its own: at an explicit time (µs), limit 2 in
// a 1 s window, 250 ms into it: two admitted, the third told to come back
// when the window ends (whole ms, never early), and a denial leaves the count.
func TestFixedWindowScript(t *testing.T) {
	c := redisClient(t)
	ctx := context.Background()
	src, err := Source(FixedWindow)
	require.NoError(t, err)
	takeAt := func(nowUs string) []int64 {
		r, err := c.Eval(ctx, src, []string{"{k}:fw"}, "take", nowUs, "2", "1000000", "0", "1", "1", "id", "1").Int64Slice()
		require.NoError(t, err)
		require.Len(t, r, 5, "{admitted, remaining, reset_ms, retry_ms, state}")
		return r
	}
	// The window starts at 10,000,000 ms; state is its start.
	require.Equal(t, []int64{1, 1, 750, 0, 10000000}, takeAt("10000250000"))
	require.Equal(t, []int64{1, 0, 750, 0, 10000000}, takeAt("10000250100"))
	require.Equal(t, []int64{0, 0, 750, 750, 10000000}, takeAt("10000250200"))
	require.Equal(t, []int64{0, 0, 750, 750, 10000000}, takeAt("10000250900"), "from the whole ms before now: never early")
	require.Equal(t, []int64{0, 0, 749, 749, 10000000}, takeAt("10000251000"))
	count, err := c.HGet(ctx, "{k}:fw", "10000000").Int64()
	require.NoError(t, err)
	require.EqualValues(t, 2, count, "the denials gave back what they added")
}

// Identity reads the run_id and master_replid lines INFO sends (CRLF
// line ends), and is "" when either is missing.
func TestIdentity(t *testing.T) {
	server := "# Server\r\nredis_version:7.0.15\r\nrun_id:5b9b0dad583c769707f6c332b7803cdddd7274fd\r\ntcp_port:6379\r\n"
	repl := "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:8f870f59663f3415d59664770519817a8c2ddd38\r\nmaster_replid2:0000000000000000000000000000000000000000\r\n"
	require.Equal(t, "5b9b0dad583c769707f6c332b7803cdddd7274fd:8f870f59663f3415d59664770519817a8c2ddd38", Identity(server, repl))
	require.Empty(t, Identity(server, "# Replication\r\nrole:master\r\n"))
	require.Empty(t, Identity("", repl))
}

// A fixed or sliding window's take made after a sign of a master change
// (ARGV[8] '1') tallies what it admits, per window, for the server that
// runs it, and says who that is; its refund takes the units back off the
// tally. A batch restore of an answer another server gave adds the tally of
// its window; a restore of this server's own answer, or of one whose server
// is unknown, does not. Before the sliding window was tallied, a restore
// from an edge that moved over last absorbed what the others had admitted
// on the new master: 639 and 642 admitted of 600 in 2 of 11 runs of
// failover under writes × Sentinel × sliding_window (internal/faults).
func TestWindowTallyAndRestore(t *testing.T) {
	c := redisClient(t)
	ctx := context.Background()
	self := serverIdentity(t, c)
	const now, ws = "10000250000", "10000000" // µs; the window's start in ms
	for _, tc := range []struct {
		name  string
		keys  []string
		reset int64     // ms: when the window's count stops deciding
		count [2]string // the hash and field holding the window's count
	}{
		{FixedWindow, []string{"{k}:fw"}, 750, [2]string{"{k}:fw", ws}},
		{SlidingWindow, []string{"{k}:sw:cur", "{k}:sw:prev"}, 1750, [2]string{"{k}:sw:cur", "n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, c.FlushAll(ctx).Err())
			src, err := Source(tc.name)
			require.NoError(t, err)
			// take asks for one request of cost units.
			take := func(cost, post string) []any {
				r, err := c.Eval(ctx, src, tc.keys, "take", now, "10", "1000000", "0", cost, cost, post).Slice()
				require.NoError(t, err)
				return r
			}
			tallyKey := tc.keys[0] + ":post:" + self
			tally := func() int64 { return hashCount(t, c, tallyKey, ws) }

			require.Len(t, take("2", "0"), 5, "an untallied take answers as before")
			require.Zero(t, tally())
			r := take("3", "1")
			require.Equal(t, []any{int64(3), int64(5), tc.reset, int64(0), int64(10000000), self}, r, "a tallied take says who ran it")
			require.EqualValues(t, 3, tally())
			ttl, err := c.PTTL(ctx, tallyKey).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, time.Duration(0))
			require.LessOrEqual(t, ttl, time.Duration(tc.reset)*time.Millisecond, "the tally ends when its window's count stops deciding")
			require.Equal(t, int64(0), take("6", "1")[0], "denied")
			require.EqualValues(t, 3, tally(), "a denial tallies nothing")
			_, err = c.Eval(ctx, src, tc.keys, "refund", "0", "10", "1000000", "0", "1", ws, "1").Result()
			require.NoError(t, err)
			require.EqualValues(t, 2, tally(), "a tallied refund takes its units off the tally")

			// The count is 4 (2 untallied, 3 tallied, 1 given back), 2 of
			// them tallied. Restores of an answer that said 5 remained (a
			// count of 5):
			batch, err := Batch([]Alg{{Code: 1, Name: tc.name, Keys: len(tc.keys), Args: 8}})
			require.NoError(t, err)
			restore := func(answeredBy string) int64 {
				args := append([]any{1, -1}, toAny(tc.keys)...)
				args = append(args, "take", now, "10", "1000000", "0", "5", "5", "0", answeredBy)
				r, err := c.Eval(ctx, batch, nil, args...).Slice()
				require.NoError(t, err)
				return r[0].([]any)[0].(int64)
			}
			require.Zero(t, restore(self), "its own server kept the answer")
			require.EqualValues(t, 1, restore(""), "an unknown server: raised to the answer")
			require.EqualValues(t, 2, restore("another:one"), "another server's answer: the tally on top")
			count, err := c.HGet(ctx, tc.count[0], tc.count[1]).Int64()
			require.NoError(t, err)
			require.EqualValues(t, 7, count, "the answer's 5 and the 2 tallied here since")
			require.Zero(t, restore("another:one"), "restored twice: nothing missing")

			// A batch reads the server's identity once, for its restores
			// and its tallied takes alike: two INFO sections, whatever the
			// calls.
			infoCalls := func() int64 {
				s, err := c.Info(ctx, "commandstats").Result()
				require.NoError(t, err)
				n, err := strconv.ParseInt(regexp.MustCompile(`cmdstat_info:calls=(\d+)`).FindStringSubmatch(s)[1], 10, 64)
				require.NoError(t, err)
				return n
			}
			before := infoCalls()
			tk := append(append([]any{1}, toAny(tc.keys)...), "take", now, "10", "1000000", "0", "1", "1", "1")
			args := append([]any{4}, tk...)
			args = append(args, tk...)
			args = append(append(args, -1), toAny(tc.keys)...)
			args = append(args, "take", now, "10", "1000000", "0", "5", "5", "0", "another:one")
			args = append(args, tk...)
			rs, err := c.Eval(ctx, batch, nil, args...).Slice()
			require.NoError(t, err)
			require.Len(t, rs, 4)
			require.Equal(t, self, rs[3].([]any)[5], "a tallied take in a batch says who ran it")
			require.EqualValues(t, 2+1, infoCalls()-before, "one reading of INFO server and replication per batch (and this count's own INFO)")
		})
	}
}

// A bucket's take made after a sign of a master change tallies what it
// admits for the server that runs it, in one count (field 0: a level has no
// window) kept a window past the take; its refund takes off what it gives
// back. A batch restore of an answer another server gave adds the tally, as
// for a window. Before the buckets were tallied, failover under writes ×
// Sentinel × token_bucket admitted 615 of 600 (bound 609) in 1 of 20 runs
// (internal/faults): an edge that moved over late raised the new master's
// level to its last answer, absorbing what the others had taken there.
func TestBucketTallyAndRestore(t *testing.T) {
	c := redisClient(t)
	ctx := context.Background()
	self := serverIdentity(t, c)
	// Every call is dated at one instant, so nothing leaks or refills
	// between them: 10 per second, a capacity of 10, 100 ms a unit.
	const now = "10000250000"
	for _, tc := range []struct{ name, key string }{{GCRA, "{k}:tb"}, {LeakyBucket, "{k}:lb"}} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, c.FlushAll(ctx).Err())
			src, err := Source(tc.name)
			require.NoError(t, err)
			take := func(cost, need, post string) []any {
				r, err := c.Eval(ctx, src, []string{tc.key}, "take", now, "10", "1000000", "0", cost, need, post).Slice()
				require.NoError(t, err)
				return r
			}
			tallyKey := tc.key + ":post:" + self
			tally := func() int64 { return hashCount(t, c, tallyKey, "0") }

			require.Len(t, take("2", "2", "0"), 5, "an untallied take answers as before")
			require.Zero(t, tally())
			require.Equal(t, []any{int64(3), int64(5), int64(500), int64(0), int64(0), self}, take("3", "3", "1"), "a tallied take says who ran it")
			require.EqualValues(t, 3, tally())
			ttl, err := c.PTTL(ctx, tallyKey).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, time.Duration(0))
			require.LessOrEqual(t, ttl, time.Second, "the tally lives a window past its last take")
			require.Equal(t, int64(0), take("6", "6", "1")[0], "denied")
			require.EqualValues(t, 3, tally(), "a denial tallies nothing")
			_, err = c.Eval(ctx, src, []string{tc.key}, "refund", now, "10", "1000000", "0", "1", "0", "1").Result()
			require.NoError(t, err)
			require.EqualValues(t, 2, tally(), "a tallied refund takes what it gives back off the tally")
			_, err = c.Eval(ctx, src, []string{tc.key}, "refund", now, "10", "1000000", "0", "1", "0", "0").Result()
			require.NoError(t, err)
			require.EqualValues(t, 2, tally(), "an untallied refund leaves it")
			require.Len(t, take("1", "1", "0"), 5)

			// The level is 4 (2 untallied, 3 tallied, 2 given back, 1
			// more untallied), 2 of them tallied. Restores of an answer
			// that said 5 remained (a level of 5):
			batch, err := Batch([]Alg{{Code: 1, Name: tc.name, Keys: 1, Args: 8}})
			require.NoError(t, err)
			restore := func(answeredBy string) int64 {
				r, err := c.Eval(ctx, batch, nil, 1, -1, tc.key, "take", now, "10", "1000000", "0", "5", "5", "0", answeredBy).Slice()
				require.NoError(t, err)
				return r[0].([]any)[0].(int64)
			}
			require.Zero(t, restore(self), "its own server kept the answer")
			require.EqualValues(t, 1, restore(""), "an unknown server: raised to the answer")
			require.EqualValues(t, 2, restore("another:one"), "another server's answer: the tally on top")
			require.EqualValues(t, 3, take("0", "1", "0")[1], "the answer's 5 and the 2 tallied here since")
			require.Zero(t, restore("another:one"), "restored twice: nothing missing")
		})
	}
}

// serverIdentity is c's server's identity, as the scripts read it.
func serverIdentity(t *testing.T, c *redis.Client) string {
	ctx := context.Background()
	server, err := c.Info(ctx, "server").Result()
	require.NoError(t, err)
	repl, err := c.Info(ctx, "replication").Result()
	require.NoError(t, err)
	self := Identity(server, repl)
	require.NotEmpty(t, self)
	return self
}

// hashCount is a hash field's count, 0 when it is absent.
func hashCount(t *testing.T, c *redis.Client, key, field string) int64 {
	n, err := c.HGet(context.Background(), key, field).Int64()
	if err == redis.Nil {
		return 0
	}
	require.NoError(t, err)
	return n
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
