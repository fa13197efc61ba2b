package testenv

import (
	"context"
	"io/fs"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

func TestKeyPrefix(t *testing.T) {
	t.Run("odd {name}/with:chars", func(t *testing.T) {
		a, b := KeyPrefix(t), KeyPrefix(t)
		require.NotEqual(t, a, b)
		require.Regexp(t, `^TestKeyPrefix_odd__name__with_chars-[0-9a-f]{8}:$`, a)
	})
	t.Run(strings.Repeat("long", 40), func(t *testing.T) {
		p := KeyPrefix(t)
		require.Len(t, p, 64)
		require.True(t, strings.HasPrefix(p, "TestKeyPrefix_longlong"), p)
	})
}

func TestStartFailureReportsLog(t *testing.T) {
	t.Parallel()
	bin, err := servers.Lookup("redis-server")
	require.NoError(t, err)
	d, err := newDeployment("broken")
	require.NoError(t, err)

	_, err = d.spawn(t.Context(), spec{name: "redis", bin: bin, config: func([]int) string { return "no-such-directive yes" }})
	require.Error(t, err)
	require.Contains(t, err.Error(), "no-such-directive", "error should quote the server log")
	assertClosed(t, d.Close, d)
}

func TestSpawnRetriesBusyPort(t *testing.T) {
	t.Parallel()
	bin, err := servers.Lookup("redis-server")
	require.NoError(t, err)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	d, err := newDeployment("retry")
	require.NoError(t, err)

	// The first attempt is pointed at a taken port, as if another process
	// had grabbed the one FreePorts picked.
	attempts := 0
	p, err := d.spawn(t.Context(), spec{name: "redis", bin: bin, config: func([]int) string {
		attempts++
		if attempts == 1 {
			return "port " + strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
		}
		return ""
	}})
	require.NoError(t, err)
	require.Equal(t, 2, attempts)
	require.NoError(t, withClient(t.Context(), p.addr, func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}))
	assertClosed(t, d.Close, d, p.addr)
}

func TestStandalone(t *testing.T) {
	t.Parallel()
	s, err := StartStandalone(StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()

	opt, err := redis.ParseURL(s.URL())
	require.NoError(t, err)
	c := redis.NewClient(opt)
	defer c.Close()
	key := KeyPrefix(t) + "k"
	require.NoError(t, c.Set(ctx, key, "v", 0).Err())
	got, err := c.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "v", got)

	assertClosed(t, s.Close, s.d, s.Addr)
}

func TestStandalonePassword(t *testing.T) {
	t.Parallel()
	s, err := StartStandalone(StandaloneOptions{Password: "s3cr:t@"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()

	opt, err := redis.ParseURL(s.URL())
	require.NoError(t, err)
	good := redis.NewClient(opt)
	defer good.Close()
	require.NoError(t, good.Ping(ctx).Err())

	wrong := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "wrong", MaxRetries: -1})
	defer wrong.Close()
	err = wrong.Ping(ctx).Err()
	require.Error(t, err)
	require.Contains(t, err.Error(), "WRONGPASS")

	assertClosed(t, s.Close, s.d, s.Addr)
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c, err := StartCluster(ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()

	opt, err := redis.ParseClusterURL(c.URL())
	require.NoError(t, err)
	require.ElementsMatch(t, c.Addrs(), opt.Addrs)
	// A refused dial does not make go-redis reload the slot map (only MOVED
	// and friends do), so with the default 60s reload interval the client
	// would keep dialing the dead master for up to a minute.
	opt.ClusterStateReloadInterval = 500 * time.Millisecond
	client := redis.NewClusterClient(opt)
	defer client.Close()

	masters, err := c.Masters(ctx)
	require.NoError(t, err)
	require.Len(t, masters, 3)

	// One key per master, so the writes below reach every shard.
	prefix := KeyPrefix(t)
	keyOf := make(map[string]string)
	for i := 0; len(keyOf) < len(masters); i++ {
		require.Less(t, i, 1000, "no key found for every master")
		key := prefix + strconv.Itoa(i)
		m, err := c.MasterForKey(ctx, key)
		require.NoError(t, err)
		if _, ok := keyOf[m]; !ok {
			keyOf[m] = key
		}
	}
	for _, key := range keyOf {
		require.NoError(t, client.Set(ctx, key, "before", 0).Err())
	}

	victim := masters[0]
	// Replication is asynchronous; make sure the key survives the crash.
	require.NoError(t, withClient(ctx, victim, func(ctx context.Context, rc *redis.Client) error {
		return rc.Do(ctx, "WAIT", 1, 5000).Err()
	}))
	start := time.Now()
	newMaster, err := c.KillMasterAndWaitFailover(ctx, victim)
	require.NoError(t, err)
	t.Logf("cluster failover took %v", time.Since(start))
	require.NotEqual(t, victim, newMaster)
	require.Contains(t, c.Addrs(), newMaster)

	masters, err = c.Masters(ctx)
	require.NoError(t, err)
	require.Len(t, masters, 3)
	require.Contains(t, masters, newMaster)
	require.NotContains(t, masters, victim)
	m, err := c.MasterForKey(ctx, keyOf[victim])
	require.NoError(t, err)
	require.Equal(t, newMaster, m)

	start = time.Now()
	for _, key := range keyOf {
		writeEventually(ctx, t, client, key)
	}
	t.Logf("cluster client recovered after %v", time.Since(start))
	got, err := client.Get(ctx, keyOf[victim]).Result()
	require.NoError(t, err)
	require.Equal(t, "after", got)

	assertClosed(t, c.Close, c.d, c.Addrs()...)
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	s, err := StartSentinel(SentinelOptions{MasterName: "edge"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()

	opt, err := redis.ParseFailoverURL(s.URL())
	require.NoError(t, err)
	require.Equal(t, "edge", opt.MasterName)
	require.ElementsMatch(t, s.SentinelAddrs(), opt.SentinelAddrs)
	client := redis.NewFailoverClient(opt)
	defer client.Close()
	key := KeyPrefix(t) + "k"
	require.NoError(t, client.Set(ctx, key, "initial", 0).Err())

	first, err := s.MasterAddr(ctx)
	require.NoError(t, err)

	start := time.Now()
	second, err := s.Failover(ctx)
	require.NoError(t, err)
	t.Logf("SENTINEL FAILOVER took %v", time.Since(start))
	require.NotEqual(t, first, second)
	writeEventually(ctx, t, client, key)
	got, err := s.MasterAddr(ctx)
	require.NoError(t, err)
	require.Equal(t, second, got)

	// Failover waited for the old master to rejoin as a replica, so it is
	// the one left to promote.
	start = time.Now()
	third, err := s.KillMaster(ctx)
	require.NoError(t, err)
	t.Logf("failover after killing the master took %v", time.Since(start))
	require.Equal(t, first, third)
	writeEventually(ctx, t, client, key)

	assertClosed(t, s.Close, s.d, append(s.SentinelAddrs(), first, second)...)
}

// writeEventually retries a write until the client has found the new master.
func writeEventually(ctx context.Context, t *testing.T, c redis.Cmdable, key string) {
	t.Helper()
	err := proc.PollEvery(ctx, 50*time.Millisecond, "a write of "+key+" after failover", func(ctx context.Context) error {
		return c.Set(ctx, key, "after", 0).Err()
	})
	require.NoError(t, err)
}

// assertClosed closes the deployment twice and checks that nothing is left:
// no process, no listener, no temp dir.
func assertClosed(t *testing.T, closeFn func() error, d *deployment, addrs ...string) {
	t.Helper()
	require.NoError(t, closeFn())
	require.NoError(t, closeFn(), "Close must be idempotent")
	for _, p := range d.procs {
		require.False(t, p.alive(), "process for %s still running", p.addr)
	}
	for _, addr := range slices.Compact(slices.Sorted(slices.Values(addrs))) {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
		}
		require.Error(t, err, "%s still accepts connections", addr)
	}
	_, err := os.Stat(d.dir)
	require.ErrorIs(t, err, fs.ErrNotExist)
}
