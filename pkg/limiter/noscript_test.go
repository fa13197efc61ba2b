package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// takeN takes one unit n times and returns how many were admitted.
func takeN(t *testing.T, st limiter.Store, l limiter.Limit, n int) int64 {
	var admitted int64
	for range n {
		ds, err := st.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1}})
		require.NoError(t, err)
		admitted += ds[0].Admitted
	}
	return admitted
}

// Script caches vanish on SCRIPT FLUSH, restarts and failovers. Decisions must
// carry on, and the commands that met NOSCRIPT must run exactly once.
func TestNoScriptAfterFlush(t *testing.T) {
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster, limiter.ModeSentinel} {
		t.Run(string(mode), func(t *testing.T) {
			c := client(mode)
			st := redisStore(t, c)
			p := testenv.KeyPrefix(t)
			// Keys spread over every master of a Cluster, in one pipeline.
			var reqs []limiter.Request
			for i := range 12 {
				l := limiter.Limit{Key: p + string(rune('a'+i)), Algorithm: limit.SlidingLog, Limit: 5, Window: time.Minute}
				reqs = append(reqs, limiter.Request{Limit: l, Cost: 1})
			}
			for round := int64(1); round <= 5; round++ {
				require.NoError(t, c.ScriptFlush(ctx(t)).Err())
				ds, err := st.Take(ctx(t), reqs)
				require.NoError(t, err)
				for _, d := range ds {
					require.True(t, d.Allowed)
					require.Equal(t, 5-round, d.Remaining, "counted exactly once per round")
				}
			}
			ds, err := st.Take(ctx(t), reqs[:1])
			require.NoError(t, err)
			require.False(t, ds[0].Allowed)
		})
	}
}

// Only the node that lost its scripts re-runs its commands: flush one Cluster
// master and the calls on the others are not repeated.
func TestNoScriptOnOneClusterNode(t *testing.T) {
	c := client(limiter.ModeCluster).(*redis.ClusterClient)
	st := redisStore(t, c)
	require.NoError(t, st.Load(ctx(t)))
	p := testenv.KeyPrefix(t)
	var reqs []limiter.Request
	for i := range 12 {
		reqs = append(reqs, limiter.Request{Limit: limiter.Limit{Key: p + string(rune('a'+i)), Algorithm: limit.FixedWindow, Limit: 100, Window: time.Hour}, Cost: 1})
	}
	masters, err := clusterSrv().Masters(ctx(t))
	require.NoError(t, err)
	one := redis.NewClient(&redis.Options{Addr: masters[0]})
	defer one.Close()
	require.NoError(t, one.ScriptFlush(ctx(t)).Err())
	ds, err := st.Take(ctx(t), reqs)
	require.NoError(t, err)
	for _, d := range ds {
		require.EqualValues(t, 99, d.Remaining)
	}
}

// A Sentinel failover (SENTINEL FAILOVER, then a crash of the new master)
// promotes a replica whose script cache may be empty: decisions continue and
// the total admitted across the failovers is exactly the limit.
func TestNoScriptAcrossSentinelFailover(t *testing.T) {
	d, err := testenv.StartSentinel(testenv.SentinelOptions{})
	require.NoError(t, err)
	defer d.Close()
	c, err := limiter.NewRedisClient(d.URL(), limiter.ModeSentinel)
	require.NoError(t, err)
	defer c.Close()
	st := redisStore(t, c)
	l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingLog, Limit: 30, Window: time.Hour}

	admitted := takeN(t, st, l, 10)
	_, err = d.Failover(ctx(t))
	require.NoError(t, err)
	admitted += takeEventually(t, st, l, 10)
	require.EqualValues(t, 20, admitted)
	admitted += takeEventually(t, st, l, 15)
	require.EqualValues(t, 30, admitted, "exactly the limit: nothing counted twice, nothing lost")
}

// A Cluster master crash: its replica takes over the slots (and, once the
// write was replicated, the counts). Decisions on those slots continue.
func TestNoScriptAcrossClusterFailover(t *testing.T) {
	d, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	defer d.Close()
	c, err := limiter.NewRedisClient(d.URL(), limiter.ModeCluster)
	require.NoError(t, err)
	defer c.Close()
	st := redisStore(t, c)
	l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingLog, Limit: 30, Window: time.Hour}
	admitted := takeN(t, st, l, 10)

	master, err := d.MasterForKey(ctx(t), st.Keys(l)[0])
	require.NoError(t, err)
	direct := redis.NewClient(&redis.Options{Addr: master})
	acked, err := direct.Do(ctx(t), "WAIT", 1, 5000).Int()
	direct.Close()
	require.NoError(t, err)
	require.Equal(t, 1, acked, "replica has the counts before the crash")
	_, err = d.KillMasterAndWaitFailover(ctx(t), master)
	require.NoError(t, err)

	admitted += takeEventually(t, st, l, 25)
	require.EqualValues(t, 30, admitted, "exactly the limit: nothing counted twice, nothing lost")
}

// takeEventually takes one unit n times, retrying calls that fail while the
// client follows a failover (a failed call counts nothing).
func takeEventually(t *testing.T, st limiter.Store, l limiter.Limit, n int) int64 {
	var admitted int64
	deadline := time.Now().Add(30 * time.Second)
	for range n {
		var lastErr error
		require.Eventually(t, func() bool {
			c, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			ds, err := st.Take(c, []limiter.Request{{Limit: l, Cost: 1}})
			if lastErr = err; err != nil {
				// A call that fails while the client follows the
				// failover is tried again; an invalid limit ends it.
				return errors.Is(err, limiter.ErrInvalidLimit)
			}
			admitted += ds[0].Admitted
			return true
		}, time.Until(deadline), 50*time.Millisecond, "takes still failing after the failover")
		require.NoError(t, lastErr)
	}
	return admitted
}
