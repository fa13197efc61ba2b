package behavior_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/lua"
	"github.com/edgeguard/edgeguard/pkg/behavior"
)

// One standalone Redis for the package's tests, started on first use.
var srv struct {
	once sync.Once
	s    *testenv.Standalone
	c    *redis.Client
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if srv.c != nil {
		_ = srv.c.Close()
	}
	if srv.s != nil {
		_ = srv.s.Close()
	}
	os.Exit(code)
}

func client(t testing.TB) *redis.Client {
	srv.once.Do(func() {
		srv.s, srv.err = testenv.StartStandalone(testenv.StandaloneOptions{})
		if srv.err == nil {
			srv.c = redis.NewClient(&redis.Options{Addr: srv.s.Addr})
		}
	})
	require.NoError(t, srv.err)
	return srv.c
}

func params(t testing.TB) (behavior.Params, behavior.ScriptArgs) {
	s := behavior.DefaultSettings()
	require.Empty(t, s.Validate())
	p := behavior.ParamsOf(&s)
	return p, behavior.NewScriptArgs(&p)
}

var script = func() *redis.Script {
	src, err := lua.Plain(lua.Behaviour)
	if err != nil {
		panic(err)
	}
	return redis.NewScript(src)
}()

// runScript applies o to id's state in Redis at now (ms).
func runScript(t testing.TB, c redis.Cmdable, args behavior.ScriptArgs, keys []string, o behavior.Obs, now int64) behavior.Verdict {
	t.Helper()
	vals, err := script.Run(context.Background(), c, keys, args.Args(o, now)...).Int64Slice()
	require.NoError(t, err)
	v, err := behavior.ParseReply(vals)
	require.NoError(t, err)
	return v
}

// TestScriptMatchesModel drives lua/behaviour.lua and State with the same
// random updates (requests over a few routes, scans, replays, 429s, batches
// judged by an edge, pauses past the horizon and the cool-down) and wants
// the same reading after every one.
func TestScriptMatchesModel(t *testing.T) {
	c := client(t)
	p, args := params(t)
	h := behavior.NewHasher([]byte("differential-salt"))
	for seed := range uint64(6) {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 99))
			keys := behavior.Keys(testenv.KeyPrefix(t), fmt.Sprintf("diff-%d", seed))
			var s behavior.State
			now := int64(1_700_000_000_000) + r.Int64N(60_000)
			exact, differ := 0, 0
			for step := range 400 {
				switch x := r.IntN(100); {
				case x < 3:
					now += 20_000 + r.Int64N(100_000) // a pause: halves and levels age
				default:
					now += r.Int64N(1500)
				}
				var o behavior.Obs
				switch x := r.IntN(100); {
				case x < 50: // an ordinary request over a few routes
					o = behavior.Obs{N: 1, Judge: 1, Q: 50, Routes: []uint64{h.Route(fmt.Sprintf("/r/%d", r.IntN(12)))}, FP: h.Fingerprint("GET", fmt.Sprintf("/r/%d", r.IntN(12)), "", nil)}
				case x < 65: // a scan
					path := fmt.Sprintf("/s/%d/%d", step, r.IntN(1000))
					o = behavior.Obs{N: 1, Judge: 1, Q: 50, Routes: []uint64{h.Route(path)}, FP: h.Fingerprint("GET", path, "", nil)}
				case x < 80: // a replay
					o = behavior.Obs{N: 1, Judge: 1, Q: 50, Routes: []uint64{h.Route("/login")}, FP: h.Fingerprint("POST", "/login", "", []byte("u=a&p=b"))}
				case x < 88: // a 429
					o = behavior.Obs{RetryMs: 1000 * (1 + r.Int64N(20))}
				default: // a batch an edge judged
					n := 1 + r.Int64N(30)
					o = behavior.Obs{N: n, Early: r.Int64N(n + 1), Q: 50, Routes: []uint64{h.Route("/b/1"), h.Route("/b/2")}}
				}
				want := s.Observe(&p, o, now)
				got := runScript(t, c, args, keys, o, now)
				require.InDelta(t, want.Raw.Burst, got.Raw.Burst, 0.001, "step %d", step)
				require.Equal(t, want.Raw.Replay, got.Raw.Replay, "step %d", step)
				require.Equal(t, want.Raw.Denial, got.Raw.Denial, "step %d", step)
				// The route sketch is a HyperLogLog: its count may be
				// off by one or two where the model counts exactly,
				// and so may the score and, near a threshold, the level.
				require.InDelta(t, want.Raw.Scan, got.Raw.Scan, 2, "step %d", step)
				require.InDelta(t, want.Score, got.Score, 2*1000/p.ScanSpan+1, "step %d", step)
				if want.Raw.Scan == got.Raw.Scan {
					exact++
				}
				if want.Level != got.Level || want.HoldMs != got.HoldMs {
					differ++
				}
			}
			t.Logf("%d of 400 steps with the sketch's count exact; %d with another level or hold", exact, differ)
			require.GreaterOrEqual(t, exact, 360)
			require.LessOrEqual(t, differ, 8)
		})
	}
}

// TestScriptMemory measures, with MEMORY USAGE, what one client costs in
// Redis: a web client, a scanner and a replaying client, each after a
// horizon's worth of requests; and checks every key has a TTL.
func TestScriptMemory(t *testing.T) {
	c := client(t)
	p, args := params(t)
	h := behavior.NewHasher([]byte("memory-salt"))
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		route func(i int) string
		n     int
	}{
		{"web client: 120 requests over 20 routes", func(i int) string { return fmt.Sprintf("/page/%d", i%20) }, 120},
		{"scanner: 300 distinct routes", func(i int) string { return fmt.Sprintf("/scan/%d", i) }, 300},
		{"replay: one request 120 times", func(int) string { return "/login" }, 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := behavior.Keys("eg:", behavior.Identity([]byte(testenv.KeyPrefix(t)), behavior.KindIP, tc.name))
			now := int64(1_700_000_000_000)
			for i := range tc.n {
				path := tc.route(i)
				o := behavior.Obs{N: 1, Judge: 1, Q: 100, Routes: []uint64{h.Route(path)}, FP: h.Fingerprint("GET", path, "", nil)}
				runScript(t, c, args, keys, o, now+int64(i)*(p.HorizonMs/int64(tc.n))/2)
			}
			total := int64(0)
			for _, k := range keys {
				if c.Exists(ctx, k).Val() == 0 {
					require.NotEqual(t, keys[0], k, "no state written")
					continue
				}
				n, err := c.MemoryUsage(ctx, k).Result()
				require.NoError(t, err)
				total += n
				ttl := c.PTTL(ctx, k).Val()
				require.Positive(t, ttl, "%s has no TTL", k)
			}
			t.Logf("%s: %d bytes", tc.name, total)
			require.LessOrEqual(t, total, int64(1024))
		})
	}
}
