package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// A Cluster master acknowledges increments its replica never gets (the
// replica, paused, stops applying what its master sends), and the replica
// is promoted (CLUSTER FAILOVER TAKEOVER): the new master lacks them. The
// edge that made them restores its last answer on it, so it counts what
// the edges admitted and the limit holds exactly.
func TestFailoverRestoresLastAnswers(t *testing.T) {
	cl, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	defer func() { _ = cl.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const edges, limitN = 3, 60
	// A day's fixed window, and a minute of room in it first (it starts
	// again at midnight UTC): the run's counts stay in one window.
	l := lim(testenv.KeyPrefix(t)+"failover", limit.FixedWindow, limitN, 24*time.Hour)
	testenv.EarlyInWindow(24*time.Hour, time.Minute)
	var lims []*Limiter
	var store *RedisStore
	for range edges {
		c, err := NewRedisClient(cl.URL(), ModeCluster)
		require.NoError(t, err)
		defer c.Close()
		conn, _, _ := AutoPipelined(c)
		st, err := NewRedisStore(conn, "")
		require.NoError(t, err)
		require.NoError(t, st.Load(ctx))
		li, err := New(st, Config{}, nil, nil)
		require.NoError(t, err)
		defer li.Close()
		lims, store = append(lims, li), st
	}
	admitted := 0
	decide := func(n int, edge func(i int) int) {
		for i := range n {
			e := edge(i)
			v, err := lims[e].Decide(ctx, []Check{{Limit: l, Cost: 1, Nodes: edges}})
			require.NoError(t, err)
			require.NotEqual(t, SourceFallback, v.Checks[0].Source, "Redis decides every call")
			if v.Allowed {
				admitted++
			}
			if testing.Verbose() {
				t.Logf("edge %d: allowed %v remaining %d", e, v.Allowed, v.Checks[0].Remaining)
			}
		}
	}
	key := store.Keys(l)[0]
	count := func(c *redis.Client) int {
		n := 0
		for _, v := range c.HGetAll(ctx, key).Val() {
			x, err := strconv.Atoi(v)
			require.NoError(t, err)
			n += x
		}
		return n
	}

	roundRobin := func(i int) int { return i % edges }
	first := func(int) int { return 0 }

	// 30 admitted by every edge, on the master and its replica.
	decide(30, roundRobin)
	m, err := cl.MasterForKey(ctx, key)
	require.NoError(t, err)
	master := redis.NewClient(&redis.Options{Addr: m})
	defer master.Close()
	require.EqualValues(t, 1, master.Do(ctx, "WAIT", 1, 5000).Val(), "the count reached the replica")
	replicaAddr := replicaOf(t, ctx, master)
	replica := redis.NewClient(&redis.Options{Addr: replicaAddr})
	defer replica.Close()

	// 15 more by one edge, which the replica never applies; then it
	// takes over.
	require.NoError(t, replica.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err())
	decide(15, first)
	require.Equal(t, 45, admitted)
	require.Equal(t, 45, count(master))
	require.NoError(t, replica.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err())
	require.Eventually(t, func() bool {
		now, err := cl.MasterForKey(ctx, key)
		return err == nil && now == replicaAddr
	}, 10*time.Second, 20*time.Millisecond, "the replica took over")
	require.NoError(t, replica.Do(ctx, "CLIENT", "UNPAUSE").Err())
	require.NoError(t, cl.WaitHealthy(ctx))
	require.Equal(t, 30, count(replica), "the promoted replica lacks the last 15")

	// The edge that made them asks first: its first call finds the new
	// master (a redirect, or its slot map reloaded meanwhile) and the
	// next restores its last answer, with what the first took there on
	// top. Then every edge asks, far past the limit. (Another edge's call
	// on the new master before that restore would be absorbed by it: the
	// restore raises the count to what the edge saw, it does not add.)
	decide(2, first)
	decide(60, roundRobin)
	require.Equal(t, limitN, admitted, "admitted across the failover")
	require.Equal(t, admitted, count(replica), "the new master counts what the edges admitted")
}
