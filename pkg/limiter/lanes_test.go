package limiter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// Concurrent lone Takes over a batching connection leave in shared batch
// calls, and every algorithm decides in a batch what it decides alone: 96
// callers, one fresh key each and one key they all share, on every
// deployment. Every take is at one explicit instant, so the minute's fixed
// window cannot start again between two of them (a run straddling the
// boundary would count the shared key in two windows); what is under test
// is the batching, not the clock. That instant leaves 10 s of its window:
// a fixed window's key expires on Redis's clock when the window of its
// first take ends, so an instant 18 ms before the end lost each own key's
// first two takes before its third ran (a busy run of make test).
func TestLanesBatchLoneTakes(t *testing.T) {
	const callers, shared = 96, 40
	for _, mode := range allModes {
		for _, alg := range limit.All() {
			t.Run(string(mode)+"/"+alg.String(), func(t *testing.T) {
				st := connStore(t, autoPipelined(t, client(mode)))
				require.NoError(t, st.Load(ctx(t)))
				p := testenv.KeyPrefix(t)
				one := limiter.Limit{Key: p + "shared", Algorithm: alg, Limit: shared, Window: time.Minute}
				testenv.EarlyInWindow(time.Minute, 10*time.Second)
				at := time.Now()
				before, _ := st.LaneBatches()
				var mu sync.Mutex
				var admitted int64
				var wg sync.WaitGroup
				for i := range callers {
					wg.Go(func() {
						own := one
						own.Key, own.Limit = p+strconv.Itoa(i), 3
						for _, l := range []limiter.Limit{own, one, own} {
							ds, err := st.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1, At: at}})
							if !assertNoError(t, err) {
								return
							}
							if l.Key == one.Key {
								mu.Lock()
								admitted += ds[0].Admitted
								mu.Unlock()
							} else if !ds[0].Allowed {
								t.Errorf("%s: own key denied: %+v", l.Key, ds[0])
							}
						}
						ds, err := st.Take(ctx(t), []limiter.Request{{Limit: own, Cost: 1, At: at}})
						if assertNoError(t, err) && (!ds[0].Allowed || ds[0].Remaining != 0) {
							t.Errorf("%s: third take: %+v, want admitted with 0 remaining", own.Key, ds[0])
						}
					})
				}
				wg.Wait()
				require.EqualValues(t, shared, admitted, "the shared key admits exactly its limit")
				after, _ := st.LaneBatches()
				require.Greater(t, after, before, "some takes left in batches")
			})
		}
	}
}

// A batch sent to a master whose slot is moving: the take whose key has
// already left for the importing master wrote nothing where it was sent and
// is decided there, through the routed call's ASK redirection; the rest of
// the batch is decided on the master it was sent to. A restore for that key
// fails instead (it is owed again): routed, the plain script would run it
// as a take of what it may restore.
func TestLanesBatchFollowsMovingSlot(t *testing.T) {
	cl, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	c, err := limiter.NewRedisClient(cl.URL(), limiter.ModeCluster)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	cc := c.(*redis.ClusterClient)
	st := connStore(t, autoPipelined(t, c))
	require.NoError(t, st.Load(ctx(t)))

	p := testenv.KeyPrefix(t)
	moving := limiter.Limit{Key: p + "moving", Algorithm: limit.FixedWindow, Limit: 5, Window: time.Minute}
	key := st.Keys(moving)[0]
	src, err := cc.MasterForKey(ctx(t), key)
	require.NoError(t, err)
	// Takes on keys the same master serves and keeps.
	var reqs []limiter.Request
	for i := 0; len(reqs) < 5; i++ {
		l := limiter.Limit{Key: p + strconv.Itoa(i), Algorithm: limit.TokenBucket, Limit: 5, Window: time.Minute}
		if m, err := cc.MasterForKey(ctx(t), st.Keys(l)[0]); err == nil && m.Options().Addr == src.Options().Addr {
			reqs = append(reqs, limiter.Request{Limit: l, Cost: 1})
		}
	}
	reqs = append(reqs[:2], append([]limiter.Request{{Limit: moving, Cost: 1}}, reqs[2:]...)...)

	masters, err := cl.Masters(ctx(t))
	require.NoError(t, err)
	var dstAddr string
	for _, m := range masters {
		if m != src.Options().Addr {
			dstAddr = m
			break
		}
	}
	dst := redis.NewClient(&redis.Options{Addr: dstAddr})
	t.Cleanup(func() { _ = dst.Close() })
	slot, err := src.ClusterKeySlot(ctx(t), key).Result()
	require.NoError(t, err)
	srcID, err := src.Do(ctx(t), "CLUSTER", "MYID").Text()
	require.NoError(t, err)
	dstID, err := dst.Do(ctx(t), "CLUSTER", "MYID").Text()
	require.NoError(t, err)
	require.NoError(t, dst.Do(ctx(t), "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	require.NoError(t, src.Do(ctx(t), "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	t.Cleanup(func() {
		for _, n := range []*redis.Client{src, dst} {
			_ = n.Do(context.Background(), "CLUSTER", "SETSLOT", slot, "STABLE").Err()
		}
	})

	restore := limiter.Request{Limit: moving, Cost: 3, Restore: true, Remaining: 2}
	out, errs := st.TakeBatched(ctx(t), src, append(slices.Clone(reqs), restore))
	for i, r := range reqs {
		require.NoError(t, errs[i], r.Limit.Key)
		require.Equal(t, []int64{1, 4}, out[i][:2], "%s: admitted 1, 4 remaining", r.Limit.Key)
	}
	require.ErrorContains(t, errs[len(reqs)], "non local key", "the restore is not sent as a take")
	n, err := src.ClusterCountKeysInSlot(ctx(t), int(slot)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing written on the master the slot is leaving")
	conn := dst.Conn()
	defer conn.Close()
	var exists, del *redis.IntCmd
	_, err = conn.Pipelined(ctx(t), func(p redis.Pipeliner) error {
		p.Do(ctx(t), "ASKING")
		exists = p.Exists(ctx(t), key)
		p.Do(ctx(t), "ASKING")
		del = p.Del(ctx(t), key)
		return nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, exists.Val(), "the moving take was decided on the importing master")
	require.EqualValues(t, 1, del.Val())
}

// pairStore sends every Take with a second request on a key of its own, so
// a standalone store sends it as one call of the batch script.
type pairStore struct {
	*limiter.RedisStore
	filler limiter.Limit
}

func (p pairStore) Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	ds, err := p.RedisStore.Take(ctx, append(slices.Clone(reqs), limiter.Request{Limit: p.filler, Cost: 1}))
	if err != nil {
		return nil, err
	}
	return ds[:len(reqs)], nil
}

// TestDifferentialMemoryRedis's random sequences through the batch script:
// every algorithm decides in a batch exactly what its Go twin decides.
func TestBatchScriptDifferential(t *testing.T) {
	red := redisStore(t, client(limiter.ModeStandalone))
	for _, alg := range limit.All() {
		t.Run(alg.String(), func(t *testing.T) {
			filler := limiter.Limit{Key: testenv.KeyPrefix(t) + "filler", Algorithm: limit.FixedWindow, Limit: 1_000_000, Window: time.Hour}
			differential(t, pairStore{red, filler}, rand.New(rand.NewPCG(11, uint64(alg))), alg, 150)
		})
	}
}

// While Redis does not answer, a lane queues a bounded number of calls; the
// next fails at once (the limiter's fallback decides it) instead of growing
// the queue, and the queued ones are decided once Redis answers.
func TestLaneQueueIsBounded(t *testing.T) {
	defer limiter.SetMaxLaneQueue(3)()
	st := connStore(t, autoPipelined(t, client(limiter.ModeStandalone)))
	require.NoError(t, st.Load(ctx(t)))
	p := testenv.KeyPrefix(t)
	pauser := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr})
	defer pauser.Close()
	require.NoError(t, pauser.Do(ctx(t), "CLIENT", "PAUSE", 300, "ALL").Err())
	take := func(i int) error {
		l := limiter.Limit{Key: p + strconv.Itoa(i), Algorithm: limit.FixedWindow, Limit: 10, Window: time.Minute}
		ds, err := st.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1}})
		if err == nil && ds[0].Remaining != 9 {
			err = fmt.Errorf("take %d: %+v", i, ds[0])
		}
		return err
	}
	done := make(chan error, limiter.LoneDirect+3)
	waitFor := func(what string, ok func() bool) {
		require.Eventually(t, ok, 2*time.Second, time.Millisecond, what)
	}
	for i := range limiter.LoneDirect {
		go func() { done <- take(i) }()
	}
	waitFor("the lane's places are taken", func() bool { return st.LoneInFlight() == limiter.LoneDirect })
	for i := range 3 {
		go func() { done <- take(limiter.LoneDirect + i) }()
	}
	waitFor("three calls queue", func() bool { return st.LaneQueued() == 3 })
	start := time.Now()
	err := take(99)
	require.ErrorIs(t, err, limiter.ErrLaneFull)
	require.Less(t, time.Since(start), 100*time.Millisecond, "the full queue fails the call at once")
	for range limiter.LoneDirect + 3 {
		require.NoError(t, <-done)
	}
}

// A full lane is this edge's own back-pressure, not a failing store: with
// a healthy Redis, calls turned away by a full queue are decided by the
// fallback (reason lane_full) and never open the breaker.
func TestFullLaneIsNotAStoreFailure(t *testing.T) {
	defer limiter.SetMaxLaneQueue(1)()
	st := connStore(t, autoPipelined(t, client(limiter.ModeStandalone)))
	require.NoError(t, st.Load(ctx(t)))
	reg := prometheus.NewRegistry()
	l, err := limiter.New(st, limiter.Config{Timeout: time.Second, BreakerFailures: 1}, reg, nil)
	require.NoError(t, err)
	defer l.Close()
	p := testenv.KeyPrefix(t)
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			lim := limiter.Limit{Key: p + strconv.Itoa(i%40), Algorithm: limit.FixedWindow, Limit: 1000, Window: time.Minute}
			_, _ = l.Decide(context.Background(), []limiter.Check{{Limit: lim, Cost: 1}})
		})
	}
	wg.Wait()
	get := func(name, label, value string) float64 {
		fams, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			sum := 0.0
			for _, m := range f.GetMetric() {
				for _, lp := range m.GetLabel() {
					if label == "" || lp.GetName() == label && lp.GetValue() == value {
						sum += m.GetCounter().GetValue()
						break
					}
				}
				if label == "" && len(m.GetLabel()) == 0 {
					sum += m.GetCounter().GetValue()
				}
			}
			return sum
		}
		return 0
	}
	require.Zero(t, get("edgeguard_limiter_breaker_opens_total", "", ""), "back-pressure opened the breaker")
	require.Positive(t, get("edgeguard_limiter_fallback_total", "reason", "lane_full"), "the queue bound of 1 turned calls away")
	require.Zero(t, get("edgeguard_limiter_fallback_total", "reason", "breaker_open"))
	require.Zero(t, get("edgeguard_limiter_store_errors_total", "class", "unreachable"))
}

// A script blocks Redis while it runs: a batch that added hundreds of
// thousands of ZSET members would hold every other client past Redis's
// busy threshold (BUSY). Batches are bounded by the members they may add as
// well as by their number of calls: eight sliding-log takes of 5,000 units
// go as four calls of the batch script, not one, and each is decided as
// alone.
func TestBatchesAreBoundedByWork(t *testing.T) {
	c := client(limiter.ModeStandalone)
	st := redisStore(t, c)
	require.NoError(t, st.Load(ctx(t)))
	p := testenv.KeyPrefix(t)
	reqs := make([]limiter.Request, 8)
	for i := range reqs {
		reqs[i] = limiter.Request{Limit: limiter.Limit{Key: p + strconv.Itoa(i), Algorithm: limit.SlidingLog, Limit: 100_000, Window: time.Minute}, Cost: 5_000}
	}
	calls := func() int64 {
		info, err := c.Info(ctx(t), "commandstats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		return 0
	}
	before := calls()
	out, errs := st.TakeBatched(ctx(t), c, reqs)
	require.EqualValues(t, 4, calls()-before, "two takes of 5,000 members per call of the batch script")
	for i := range reqs {
		require.NoError(t, errs[i])
		require.EqualValues(t, 5_000, out[i][0], "take %d admitted whole", i)
	}
}
