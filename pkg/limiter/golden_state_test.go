package limiter_test

// Redis states written by earlier releases, decided by this tree's scripts.
//
// testdata/redis-states/<release>/<case>.json holds, for each case, what a
// release's scripts left in Redis after a few takes at a fixed time: every
// key with its type, its value (string, hash fields, sorted-set members and
// scores) and its TTL. TestRedisStatesOfReleases restores each state into a
// real Redis and checks that this tree's store names the same keys and
// continues the count from it: a state with 7 of 10 used admits exactly 3
// more. An edge upgraded in place meets exactly these states.
//
// The files are written by the release's own scripts: the generator copies
// this file into the release's tree and runs it there with -update-golden
// (the release comes from CHANGELOG.md, as the mixed-version test finds it):
//
//	go test -tags golden ./internal/mixedversion -run TestWriteRedisStates
//
// Run alone (writing any tree's own states, e.g. into a scratch directory):
//
//	go test ./pkg/limiter -run TestRedisStatesOfReleases -update-golden -golden-out DIR

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

var (
	goldenUpdate = flag.Bool("update-golden", false, "write this tree's Redis states to -golden-out instead of checking the stored ones")
	goldenOut    = flag.String("golden-out", "", "with -update-golden: the directory the states are written to")
)

// goldenT0 is when the states are written: 10 minutes into an hour (every
// window of the cases is an hour), and goldenCheck a second later, when
// they are decided.
var (
	goldenT0    = time.Date(2026, 11, 25, 12, 10, 0, 0, time.UTC)
	goldenCheck = goldenT0.Add(time.Second)
)

// goldenCase is one algorithm's state: the takes that write it, and what
// this tree must admit on it at goldenCheck.
type goldenCase struct {
	name  string
	limit limiter.Limit
	// takes write the state: cost units (one request's need: need, 0 =
	// cost) at goldenT0 + at.
	takes []goldenTake
	// probe, at goldenCheck: singles are takes of one unit until one is
	// denied (at most the limit); a carve is one take of carve units, need 1.
	carve int64
	want  int64 // units admitted by the probe
}

type goldenTake struct {
	at         time.Duration
	cost, need int64
}

func goldenCases() []goldenCase {
	h := time.Hour
	lim := func(alg string) limiter.Limit {
		a, err := limit.Parse(alg)
		if err != nil {
			panic(err)
		}
		return limiter.Limit{Key: "golden-" + alg, Algorithm: a, Limit: 10, Window: h}
	}
	seven := []goldenTake{{0, 1, 0}, {0, 1, 0}, {0, 1, 0}, {0, 1, 0}, {0, 1, 0}, {0, 1, 0}, {0, 1, 0}}
	carved := func(alg string) limiter.Limit { l := lim(alg); l.Key += "-carved"; return l }
	slidingPrev := lim("sliding_window")
	slidingPrev.Key += "-previous"
	return []goldenCase{
		{name: "fixed_window", limit: lim("fixed_window"), takes: seven, want: 3},
		// A leased edge carves a batch: one take of several units, need 1.
		{name: "fixed_window_carved", limit: carved("fixed_window"), takes: []goldenTake{{0, 7, 1}}, carve: 5, want: 3},
		{name: "sliding_window", limit: lim("sliding_window"), takes: seven, want: 3},
		// 6 in the window before, 4 in this one: at 601 s of 3600 the
		// previous counts 6 × 2999/3600 = 4.998, so 1 more fits.
		{name: "sliding_window_previous", limit: slidingPrev, takes: []goldenTake{{-h, 6, 1}, {0, 4, 1}}, want: 1},
		{name: "token_bucket", limit: lim("token_bucket"), takes: seven, want: 3},
		{name: "token_bucket_carved", limit: carved("token_bucket"), takes: []goldenTake{{0, 7, 1}}, carve: 5, want: 3},
		{name: "leaky_bucket", limit: lim("leaky_bucket"), takes: seven, want: 3},
		{name: "sliding_log", limit: lim("sliding_log"), takes: seven, want: 3},
		{name: "concurrency", limit: lim("concurrency"), takes: seven, want: 3},
	}
}

// goldenFile is one case's state as a release left it.
type goldenFile struct {
	Case      string      `json:"case"`
	Algorithm string      `json:"algorithm"`
	Key       string      `json:"key"` // limiter.Limit.Key
	Limit     int64       `json:"limit"`
	WindowMs  int64       `json:"window_ms"`
	WrittenAt time.Time   `json:"written_at"` // goldenT0
	Keys      []goldenKey `json:"keys"`
}

// goldenKey is one Redis key: its full name, type and value, and its TTL
// rounded to the second (0: none).
type goldenKey struct {
	Name   string            `json:"name"`
	Type   string            `json:"type"` // string, hash or zset
	String string            `json:"string,omitempty"`
	Hash   map[string]string `json:"hash,omitempty"`
	ZSet   []goldenMember    `json:"zset,omitempty"`
	TTLSec int64             `json:"ttl_s"`
}

type goldenMember struct {
	Member string `json:"member"`
	Score  string `json:"score"` // decimal, exact
}

func TestRedisStatesOfReleases(t *testing.T) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer srv.Close()
	opt, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	rc := redis.NewClient(opt)
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The default prefix: the keys an edge writes.
	store, err := limiter.NewRedisStore(limiter.Conn(rc), "")
	require.NoError(t, err)

	if *goldenUpdate {
		require.NotEmpty(t, *goldenOut, "-update-golden needs -golden-out DIR")
		writeGoldenStates(t, ctx, rc, store, *goldenOut)
		return
	}

	dirs, err := filepath.Glob(filepath.Join("testdata", "redis-states", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, dirs, "no release's Redis states under testdata/redis-states")
	for _, dir := range dirs {
		for _, c := range goldenCases() {
			t.Run(filepath.Base(dir)+"/"+c.name, func(t *testing.T) {
				data, err := os.ReadFile(filepath.Join(dir, c.name+".json"))
				require.NoError(t, err, "every release has a state of every case")
				var g goldenFile
				require.NoError(t, json.Unmarshal(data, &g))
				require.Equal(t, c.limit.Key, g.Key)
				require.Equal(t, c.limit.Algorithm.String(), g.Algorithm)
				require.NotEmpty(t, g.Keys, "the release wrote no state")
				// The state lives under the names this tree reads.
				for _, k := range g.Keys {
					require.Contains(t, store.Keys(c.limit), k.Name, "a key the release wrote is one this tree reads")
				}
				require.NoError(t, rc.FlushDB(ctx).Err())
				restoreGolden(t, ctx, rc, g.Keys)
				require.Equal(t, c.want, probeGolden(t, ctx, store, c), "units admitted on the release's state")
			})
		}
	}
}

// probeGolden takes from c's limit at goldenCheck as c.probe says and
// returns the units admitted.
func probeGolden(t *testing.T, ctx context.Context, store *limiter.RedisStore, c goldenCase) int64 {
	t.Helper()
	take := func(cost, need int64) limiter.Decision {
		d, err := store.Take(ctx, []limiter.Request{{Limit: c.limit, Cost: cost, Need: need, At: goldenCheck}})
		require.NoError(t, err)
		return d[0]
	}
	if c.carve > 0 {
		return take(c.carve, 1).Admitted
	}
	var admitted int64
	for range c.limit.Limit + 1 {
		d := take(1, 0)
		if !d.Allowed {
			require.Positive(t, d.RetryAfter, "a denial says when to come back")
			return admitted
		}
		admitted += d.Admitted
	}
	t.Fatalf("%d singles in a row admitted on a limit of %d", admitted, c.limit.Limit)
	return admitted
}

func restoreGolden(t *testing.T, ctx context.Context, rc *redis.Client, keys []goldenKey) {
	t.Helper()
	for _, k := range keys {
		switch k.Type {
		case "string":
			require.NoError(t, rc.Set(ctx, k.Name, k.String, 0).Err())
		case "hash":
			require.NotEmpty(t, k.Hash, k.Name)
			require.NoError(t, rc.HSet(ctx, k.Name, k.Hash).Err())
		case "zset":
			require.NotEmpty(t, k.ZSet, k.Name)
			for _, m := range k.ZSet {
				score, err := strconv.ParseFloat(m.Score, 64)
				require.NoError(t, err, "%s: score %q", k.Name, m.Score)
				require.NoError(t, rc.ZAdd(ctx, k.Name, redis.Z{Score: score, Member: m.Member}).Err())
			}
		default:
			t.Fatalf("%s: type %q is none of string, hash, zset", k.Name, k.Type)
		}
		if k.TTLSec > 0 {
			require.NoError(t, rc.Expire(ctx, k.Name, time.Duration(k.TTLSec)*time.Second).Err())
		}
	}
}

// writeGoldenStates runs every case's takes with this tree's store and
// writes what they leave in Redis under dir.
func writeGoldenStates(t *testing.T, ctx context.Context, rc *redis.Client, store *limiter.RedisStore, dir string) {
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, c := range goldenCases() {
		require.NoError(t, rc.FlushDB(ctx).Err())
		for _, tk := range c.takes {
			d, err := store.Take(ctx, []limiter.Request{{Limit: c.limit, Cost: tk.cost, Need: tk.need, At: goldenT0.Add(tk.at)}})
			require.NoError(t, err)
			require.Equal(t, tk.cost, d[0].Admitted, "%s: the state's takes are admitted", c.name)
		}
		g := goldenFile{Case: c.name, Algorithm: c.limit.Algorithm.String(), Key: c.limit.Key,
			Limit: c.limit.Limit, WindowMs: c.limit.Window.Milliseconds(), WrittenAt: goldenT0}
		names, err := rc.Keys(ctx, "*").Result()
		require.NoError(t, err)
		slices.Sort(names)
		for _, name := range names {
			g.Keys = append(g.Keys, dumpGolden(t, ctx, rc, name))
		}
		data, err := json.MarshalIndent(g, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, c.name+".json"), append(data, '\n'), 0o644))
	}
}

func dumpGolden(t *testing.T, ctx context.Context, rc *redis.Client, name string) goldenKey {
	t.Helper()
	typ, err := rc.Type(ctx, name).Result()
	require.NoError(t, err)
	k := goldenKey{Name: name, Type: typ}
	switch typ {
	case "string":
		k.String, err = rc.Get(ctx, name).Result()
	case "hash":
		k.Hash, err = rc.HGetAll(ctx, name).Result()
	case "zset":
		var zs []redis.Z
		zs, err = rc.ZRangeWithScores(ctx, name, 0, -1).Result()
		for _, z := range zs {
			// Scores are µs, below 2^53: exact in a float64 and in its
			// shortest decimal form.
			k.ZSet = append(k.ZSet, goldenMember{Member: fmt.Sprint(z.Member), Score: strconv.FormatFloat(z.Score, 'f', -1, 64)})
		}
	default:
		err = fmt.Errorf("type %q", typ)
	}
	require.NoError(t, err, name)
	ttl, err := rc.PTTL(ctx, name).Result()
	require.NoError(t, err)
	if ttl > 0 {
		k.TTLSec = int64((ttl + time.Second - 1) / time.Second)
	}
	return k
}
