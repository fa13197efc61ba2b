package limiter_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// The store's call metrics count commands as Redis counts them: a check of
// three keys against one master goes as one call of the batch script
// carrying three decisions, a check of one key as one call carrying one;
// Redis's own EVALSHA count agrees with edgeguard_limiter_store_calls_total.
func TestStoreCallsCountCommandsNotKeys(t *testing.T) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	c, err := limiter.NewRedisClient(srv.URL(), limiter.ModeStandalone)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	st := redisStore(t, c)
	require.NoError(t, st.Load(ctx(t)))
	require.NoError(t, c.ConfigResetStat(ctx(t)).Err())
	reg := prometheus.NewPedanticRegistry()
	lim, err := limiter.New(st, limiter.Config{Timeout: 10 * time.Second}, reg, nil)
	require.NoError(t, err)
	t.Cleanup(lim.Close)

	p := testenv.KeyPrefix(t)
	check := func(key string) limiter.Check {
		return limiter.Check{Limit: limiter.Limit{Key: p + key, Algorithm: limit.FixedWindow, Limit: 100, Window: time.Minute}, Cost: 1}
	}
	_, err = lim.Decide(ctx(t), []limiter.Check{check("a"), check("b"), check("c")})
	require.NoError(t, err)
	_, err = lim.Decide(ctx(t), []limiter.Check{check("d")})
	require.NoError(t, err)

	want := map[string]float64{
		"edgeguard_limiter_store_calls_total":          2,
		"edgeguard_limiter_store_call_decisions_total": 4,
		"edgeguard_limiter_store_decisions_total":      4,
	}
	for name, v := range want {
		got, err := testutil.GatherAndCount(reg, name)
		require.NoError(t, err)
		require.Equal(t, 1, got, name)
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == name {
				require.Equal(t, v, mf.GetMetric()[0].GetCounter().GetValue(), name)
			}
		}
	}
	require.EqualValues(t, 2, evalShaCalls(t, c), "Redis served as many EVALSHA as the edge counted")
}

// evalShaCalls reads the EVALSHA count from INFO commandstats.
func evalShaCalls(t *testing.T, c redis.UniversalClient) int64 {
	info, err := c.Info(ctx(t), "commandstats").Result()
	require.NoError(t, err)
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls=")
		if ok {
			n, err := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}
