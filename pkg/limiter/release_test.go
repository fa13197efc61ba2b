package limiter

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// flakyRefunds fails the first refunds it is asked for, as a Redis blip
// would.
type flakyRefunds struct {
	Store
	fails atomic.Int64
	tries atomic.Int64
}

func (s *flakyRefunds) Refund(ctx context.Context, leases []Lease) error {
	s.tries.Add(1)
	if s.fails.Add(-1) >= 0 {
		return errors.New("connection reset")
	}
	return s.Store.Refund(ctx, leases)
}

// ReleaseAsync returns at once; a failed release is retried until the
// store takes it, so the slot is free again without waiting for its TTL.
func TestReleaseAsyncRetries(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{})
	flaky := &flakyRefunds{Store: st}
	flaky.fails.Store(2)
	l.store = flaky
	c := lim("conc", limit.Concurrency, 1, time.Minute)
	v, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v.Allowed)
	l.ReleaseAsync(v)
	l.ReleaseAsync(v) // a lease is given back once
	l.Close()         // waits for the release under way
	require.Equal(t, int64(3), flaky.tries.Load(), "two failures, then the release went through")
	require.Equal(t, 2.0, testutil.ToFloat64(l.metrics.releaseRetries))
	v2, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v2.Allowed, "the slot is free")
}

// A release a Cluster master acknowledged, then lost in a failover (the
// master replicates asynchronously: its replica, paused here, never got the
// release, and is promoted), would hold its slot until the TTL. The limiter
// keeps acknowledged releases with the master they went to, and sends them
// again once their key is served by another master: no slot stays held.
func TestReleaseLostInFailoverIsSentAgain(t *testing.T) {
	cl, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	defer func() { _ = cl.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := NewRedisClient(cl.URL(), ModeCluster)
	require.NoError(t, err)
	defer c.Close()
	st, err := NewRedisStore(Conn(c), "")
	require.NoError(t, err)
	require.NoError(t, st.Load(ctx))
	reg := prometheus.NewRegistry()
	l, err := New(st, Config{}, reg, nil)
	require.NoError(t, err)
	defer l.Close()
	slots := lim(testenv.KeyPrefix(t)+"slots", limit.Concurrency, 2, time.Minute)
	key := st.Keys(slots)[0]
	decide := func() Verdict {
		v, err := l.Decide(ctx, []Check{{Limit: slots, Cost: 1, Nodes: 1}})
		require.NoError(t, err)
		return v
	}

	v := decide()
	require.True(t, v.Allowed)
	require.Equal(t, SourceStore, v.Checks[0].Source)
	// The replica stops applying what its master sends; the master
	// acknowledges the release alone.
	master, replica := pauseReplica(t, ctx, cl, key)
	l.ReleaseAsync(v)
	require.Eventually(t, func() bool { return master.ZCard(ctx, key).Val() == 0 }, 10*time.Second, 10*time.Millisecond, "the master acknowledged the release")
	takeOver(t, ctx, cl, key, replica)
	replicaAddr := replica.Options().Addr

	// The edge keeps deciding: its slot map follows the failover, and a
	// decision reaches the promoted master.
	require.Eventually(t, func() bool {
		moved := st.Shard(slots) == replicaAddr
		l.ReleaseAsync(decide())
		return moved
	}, 10*time.Second, 20*time.Millisecond)
	var held int64
	require.Eventually(t, func() bool {
		held = replica.ZCard(ctx, key).Val()
		return held == 0
	}, 10*time.Second, 20*time.Millisecond, "a slot is still held on the promoted master")
	require.GreaterOrEqual(t, testutil.ToFloat64(l.metrics.releasesResent), 1.0)
}

// pauseReplica waits until the replica of key's master has what the master
// holds (WAIT), then holds the replica's writes (CLIENT PAUSE WRITE): it
// stops applying what its master sends, and the master acknowledges alone.
func pauseReplica(t *testing.T, ctx context.Context, cl *testenv.Cluster, key string) (master, replica *redis.Client) {
	t.Helper()
	m, err := cl.MasterForKey(ctx, key)
	require.NoError(t, err)
	master = redis.NewClient(&redis.Options{Addr: m})
	t.Cleanup(func() { _ = master.Close() })
	require.EqualValues(t, 1, master.Do(ctx, "WAIT", 1, 5000).Val(), "the key reached the replica")
	replica = redis.NewClient(&redis.Options{Addr: replicaOf(t, ctx, master)})
	t.Cleanup(func() { _ = replica.Close() })
	require.NoError(t, replica.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err())
	return master, replica
}

// takeOver promotes the paused replica (CLUSTER FAILOVER TAKEOVER), lets
// it write again and waits until it serves key in a healthy cluster.
func takeOver(t *testing.T, ctx context.Context, cl *testenv.Cluster, key string, replica *redis.Client) {
	t.Helper()
	require.NoError(t, replica.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err())
	require.Eventually(t, func() bool {
		now, err := cl.MasterForKey(ctx, key)
		return err == nil && now == replica.Options().Addr
	}, 10*time.Second, 20*time.Millisecond, "the replica took over")
	require.NoError(t, replica.Do(ctx, "CLIENT", "UNPAUSE").Err())
	require.NoError(t, cl.WaitHealthy(ctx))
}

// replicaOf is the address of master's replica (ROLE).
func replicaOf(t *testing.T, ctx context.Context, master *redis.Client) string {
	role, err := master.Do(ctx, "ROLE").Slice()
	require.NoError(t, err)
	require.Equal(t, "master", role[0])
	replicas := role[2].([]any)
	require.NotEmpty(t, replicas)
	r := replicas[0].([]any)
	return net.JoinHostPort(r[0].(string), r[1].(string))
}
