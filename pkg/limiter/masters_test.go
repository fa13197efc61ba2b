package limiter

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// failoverRig is three limiters (edges) on one Cluster, each with a client
// of its own, deciding one fixed window limit of 60 a day.
type failoverRig struct {
	t        *testing.T
	ctx      context.Context
	cl       *testenv.Cluster
	l        Limit
	key      string // the limit's Redis key
	lims     []*Limiter
	clients  []*redis.ClusterClient
	admitted int
}

const rigEdges, rigLimit = 3, 60

// rigDeadline is the rig's store deadline (Config.Timeout).
const rigDeadline = 5 * time.Second

func newFailoverRig(t *testing.T, ctx context.Context, name string, alg limit.Algorithm) *failoverRig {
	cl, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	// A day's window, and a minute of room in it first (it starts again
	// at midnight UTC): the run's counts stay in one window.
	r := &failoverRig{t: t, ctx: ctx, cl: cl, l: lim(testenv.KeyPrefix(t)+name, alg, rigLimit, 24*time.Hour)}
	testenv.EarlyInWindow(24*time.Hour, time.Minute)
	for range rigEdges {
		c, err := NewRedisClient(cl.URL(), ModeCluster)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		conn, _, _ := AutoPipelined(c)
		st, err := NewRedisStore(conn, "")
		require.NoError(t, err)
		require.NoError(t, st.Load(ctx))
		// Redis decides every call: these tests follow the restore, call
		// by call. Past the store deadline the fallback would decide (a
		// denial: an exact limit the store answered within its window gets
		// no share), and under make test-busy a first call on the new
		// master (a redirect, a dial, the restore) outlasted the default
		// 250 ms in 4 of 20 runs. So the deadline here is one no stall
		// reaches; the failover at the default deadline, fallback
		// included, is the fault matrix's (internal/faults: "failover
		// under writes"). Its logs (a store failing, and why) go with the
		// test's output.
		li, err := New(st, Config{Timeout: rigDeadline}, nil, slog.New(slog.NewTextHandler(t.Output(), nil)))
		require.NoError(t, err)
		t.Cleanup(li.Close)
		r.lims = append(r.lims, li)
		r.clients = append(r.clients, c.(*redis.ClusterClient))
		r.key = st.Keys(r.l)[0]
	}
	return r
}

// decide asks n times, the i-th through edge(i); Redis decides each.
func (r *failoverRig) decide(n int, edge func(i int) int) {
	for i := range n {
		e := edge(i)
		v, err := r.lims[e].Decide(r.ctx, []Check{{Limit: r.l, Cost: 1, Nodes: rigEdges}})
		require.NoError(r.t, err)
		require.NotEqual(r.t, SourceFallback, v.Checks[0].Source, "Redis decides every call")
		if v.Allowed {
			r.admitted++
		}
		if testing.Verbose() {
			r.t.Logf("edge %d: allowed %v remaining %d", e, v.Allowed, v.Checks[0].Remaining)
		}
	}
}

// count is what c holds for the limit: every window's field (a fixed
// window), the current window's count (a sliding window, whose previous
// window is empty: the run stays in one window), a bucket's level now,
// rounded up (60 a day refill one unit in 24 minutes: the run's level is
// its admissions).
func (r *failoverRig) count(c *redis.Client) int {
	if r.l.Algorithm.Spec().Bucket {
		return r.level(c)
	}
	if r.l.Algorithm == limit.SlidingWindow {
		n, err := c.HGet(r.ctx, r.key, "n").Int()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(r.t, err)
		return n
	}
	n := 0
	for _, v := range c.HGetAll(r.ctx, r.key).Val() {
		x, err := strconv.Atoi(v)
		require.NoError(r.t, err)
		n += x
	}
	return n
}

// level is a bucket's level on c now, in units rounded up: a token
// bucket's theoretical arrival time ahead of now, or a leaky bucket's
// level less what leaked since its last leak.
func (r *failoverRig) level(c *redis.Client) int {
	now, err := c.Time(r.ctx).Result()
	require.NoError(r.t, err)
	rate := float64(r.l.Limit) / float64(r.l.Window.Microseconds()) // units per µs
	var level float64
	if r.l.Algorithm == limit.TokenBucket {
		tat, err := c.Get(r.ctx, r.key).Float64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(r.t, err)
		level = (tat - float64(now.UnixMicro())) * rate
	} else {
		h, err := c.HMGet(r.ctx, r.key, "l", "t").Result()
		require.NoError(r.t, err)
		if h[0] == nil {
			return 0
		}
		l, err := strconv.ParseFloat(h[0].(string), 64)
		require.NoError(r.t, err)
		at, err := strconv.ParseFloat(h[1].(string), 64)
		require.NoError(r.t, err)
		level = l - max(0, float64(now.UnixMicro())-at)*rate
	}
	return int(math.Ceil(level - 1e-9))
}

func roundRobin(i int) int { return i % rigEdges }

// lose has every edge admit 30 on the key's master and its replica, then
// edge 0 admit 15 more that the replica never applies, and the replica
// take over: it holds 30.
func (r *failoverRig) lose() (replica *redis.Client) {
	r.decide(30, roundRobin)
	master, replica := pauseReplica(r.t, r.ctx, r.cl, r.key)
	r.decide(15, func(int) int { return 0 })
	require.Equal(r.t, 45, r.admitted)
	require.Equal(r.t, 45, r.count(master))
	takeOver(r.t, r.ctx, r.cl, r.key, replica)
	require.Equal(r.t, 30, r.count(replica), "the promoted replica lacks the last 15")
	return replica
}

// A Cluster master acknowledges increments its replica never gets (the
// replica, paused, stops applying what its master sends), and the replica
// is promoted (CLUSTER FAILOVER TAKEOVER): the new master lacks them. The
// edge that made them restores its last answer on it, so it counts what
// the edges admitted and the limit holds exactly.
func TestFailoverRestoresLastAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := newFailoverRig(t, ctx, "failover", limit.FixedWindow)
	replica := r.lose()

	// The edge that made them asks first: its first call finds the new
	// master (a redirect, or its slot map reloaded meanwhile) and the
	// next restores its last answer, with what the first took there on
	// top. Then every edge asks, far past the limit.
	r.decide(2, func(int) int { return 0 })
	r.decide(60, roundRobin)
	require.Equal(t, rigLimit, r.admitted, "admitted across the failover")
	require.Equal(t, r.admitted, r.count(replica), "the new master counts what the edges admitted")
}

// An edge that reaches the promoted replica first admits there before the
// edge that made the lost increments restores its last answer. The restore
// adds what was admitted on the new master since the change (the calls
// made after a sign of it are tallied there, per window) to that answer,
// instead of raising the count to the answer alone, which would absorb
// those admissions: the new master counts every unit the edges admitted,
// and the limit holds exactly. Windows and buckets alike: before the
// sliding window was tallied, edge 0's restore raised its count to 45 and
// absorbed edge 1's 5 (the new master counted 46 of the 51 admitted); so
// did a bucket's restore raise the new master's level, before the buckets
// were tallied.
func TestFailoverRestoreKeepsTheNewMastersAdmissions(t *testing.T) {
	for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow, limit.TokenBucket, limit.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) { failoverKeepsTheNewMastersAdmissions(t, alg) })
	}
}

func failoverKeepsTheNewMastersAdmissions(t *testing.T, alg limit.Algorithm) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := newFailoverRig(t, ctx, "absorbed", alg)
	replica := r.lose()

	// Every edge's slot map names the new master, so each edge's first
	// call there follows a sign of the change (a master it had not seen).
	for _, c := range r.clients {
		c.ReloadState(ctx)
		require.Eventually(t, func() bool {
			n, err := c.MasterForKey(ctx, r.key)
			return err == nil && n.Options().Addr == replica.Options().Addr
		}, 10*time.Second, 20*time.Millisecond, "an edge's slot map names the new master")
	}
	// Edge 1 admits 5 on the new master; then edge 0 restores its last
	// answer (45) with its next call, and every edge asks past the limit.
	r.decide(5, func(int) int { return 1 })
	require.Equal(t, 50, r.admitted)
	require.Equal(t, 35, r.count(replica))
	r.decide(1, func(int) int { return 0 })
	require.Equal(t, 51, r.count(replica), "edge 0's restore kept what edge 1 admitted on the new master")
	r.decide(60, roundRobin)
	require.Equal(t, rigLimit, r.admitted, "admitted across the failover")
	require.Equal(t, r.admitted, r.count(replica), "the new master counts what the edges admitted")
}
