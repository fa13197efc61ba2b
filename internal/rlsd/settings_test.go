package rlsd

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

func TestDefaultsAreTheReferences(t *testing.T) {
	s, err := FromEnv(nil)
	require.NoError(t, err)
	require.Equal(t, 8080, s.Port)
	require.Equal(t, 8081, s.GRPCPort)
	require.Equal(t, 6070, s.DebugPort)
	require.Equal(t, "0.0.0.0", s.GRPCHost)
	require.True(t, s.UseStatsd)
	require.Equal(t, 10*time.Second, s.StatsFlushInterval)
	require.Equal(t, 0.8, s.NearLimitRatio)
	require.Equal(t, DefaultDrainDelay, s.DrainDelay)
	require.Equal(t, "/srv/runtime_data/current/config", s.ConfigDir())
	require.Equal(t, "/srv/runtime_data/current", s.WatchDir())
	require.Equal(t, "unix", s.RedisSocketType)
	require.Equal(t, "RateLimit-Limit", s.LimitHeader)
	require.Empty(t, s.Unsupported)
	url, mode, err := s.Redis()
	require.NoError(t, err)
	require.Equal(t, limiter.ModeStandalone, mode)
	require.Equal(t, "unix:///var/run/nutcracker/ratelimit.sock?dial_timeout=10s&pool_size=10", url)
	_, err = limiter.NewRedisClient(url, mode)
	require.NoError(t, err)
}

func TestRedisSettings(t *testing.T) {
	for name, c := range map[string]struct {
		env  []string
		url  string
		mode limiter.Mode
	}{
		"single": {[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_AUTH=pw", "REDIS_POOL_SIZE=20", "REDIS_TIMEOUT=2s"},
			"redis://:pw@redis:6379?dial_timeout=2s&pool_size=20", limiter.ModeStandalone},
		"user and TLS": {[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6380", "REDIS_AUTH=app:pw", "REDIS_TLS=true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true"},
			"rediss://app:pw@redis:6380?dial_timeout=10s&pool_size=10&skip_verify=true", limiter.ModeStandalone},
		"cluster": {[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=cluster", "REDIS_URL=a:7000,b:7001,c:7002"},
			"redis://a:7000?addr=b%3A7001&addr=c%3A7002&dial_timeout=10s&pool_size=10", limiter.ModeCluster},
		"sentinel": {[]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster,s1:26379,s2:26379"},
			"redis://s1:26379?addr=s2%3A26379&dial_timeout=10s&master_name=mymaster&pool_size=10", limiter.ModeSentinel},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := FromEnv(c.env)
			require.NoError(t, err)
			url, mode, err := s.Redis()
			require.NoError(t, err)
			require.Equal(t, c.url, url)
			require.Equal(t, c.mode, mode)
			_, err = limiter.NewRedisClient(url, mode)
			require.NoError(t, err)
		})
	}
	for name, env := range map[string][]string{
		"sentinel without a master": {"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SENTINEL", "REDIS_URL=s1:26379"},
		"unknown type":              {"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=MEMCACHE", "REDIS_URL=r:6379"},
		"cluster on a socket":       {"REDIS_TYPE=CLUSTER", "REDIS_URL=/a.sock,/b.sock"},
		"not host:port":             {"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis"},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := FromEnv(env)
			require.NoError(t, err)
			_, _, err = s.Redis()
			require.Error(t, err)
		})
	}
}

func TestSettingsErrorsAndUnsupported(t *testing.T) {
	_, err := FromEnv([]string{"PORT=http", "USE_STATSD=maybe", "NEAR_LIMIT_RATIO=2", "REDIS_TIMEOUT=soon", "EDGEGUARD_DRAIN_DELAY=5"})
	require.ErrorContains(t, err, "PORT")
	require.ErrorContains(t, err, "EDGEGUARD_DRAIN_DELAY")
	require.ErrorContains(t, err, "USE_STATSD")
	require.ErrorContains(t, err, "NEAR_LIMIT_RATIO")
	require.ErrorContains(t, err, "REDIS_TIMEOUT")
	for _, v := range []string{"0", "-1s"} {
		_, err = FromEnv([]string{"REDIS_TIMEOUT=" + v})
		require.ErrorContains(t, err, "REDIS_TIMEOUT=")
		require.ErrorContains(t, err, "want a positive duration", v)
	}

	s, err := FromEnv([]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "BACKEND_TYPE=memcache", "USE_DOG_STATSD=true", "TRACING_EXPORTER_PROTOCOL=grpc",
		"RESPONSE_DYNAMIC_METADATA=true", "MEMCACHE_HOST_PORT=m:11211", "CONFIG_TYPE_X=1"})
	require.NoError(t, err)
	require.Equal(t, []string{"BACKEND_TYPE", "CONFIG_TYPE", "MEMCACHE_HOST_PORT", "RESPONSE_DYNAMIC_METADATA", "TRACING_EXPORTER_PROTOCOL", "USE_DOG_STATSD"}, s.Unsupported)
	// At the reference's defaults they change nothing and are not named.
	s, err = FromEnv([]string{"CONFIG_TYPE=FILE", "BACKEND_TYPE=REDIS", "USE_DOG_STATSD=false", "TRACING_ENABLED=", "GRPC_UDS="})
	require.NoError(t, err)
	require.Empty(t, s.Unsupported)

	s, err = FromEnv([]string{"DISABLE_STATS=true", "USE_STATSD=true", "USE_PROMETHEUS=true"})
	require.NoError(t, err)
	require.False(t, s.UseStatsd)
	require.False(t, s.UsePrometheus)

	s, err = FromEnv([]string{"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=limits", "RUNTIME_WATCH_ROOT=false"})
	require.NoError(t, err)
	require.Equal(t, "/data/ratelimit/limits", s.ConfigDir())
	require.Equal(t, s.ConfigDir(), s.WatchDir())
	require.Equal(t, []string{"REDIS_PERSECOND", "REDIS_PERSECOND_URL"}, PerSecondVars([]string{"REDIS_URL=x", "REDIS_PERSECOND_URL=y", "REDIS_PERSECOND=true"}))
}

// The reference's counters for one descriptor, limit 10 and ratio 0.8
// (near from 8 on).
func TestCountsAsTheReference(t *testing.T) {
	l := &rlsconfig.Limit{Path: "rl.user", RequestsPerUnit: 10}
	shadow := &rlsconfig.Limit{Path: "rl.user", RequestsPerUnit: 10, Shadow: true}
	for name, c := range map[string]struct {
		o    rls.Observation
		want counts
	}{
		"first hit":          {rls.Observation{Limit: l, Hits: 1, Remaining: 9}, counts{1, 0, 0, 1, 0}},
		"up to the near one": {rls.Observation{Limit: l, Hits: 1, Remaining: 2}, counts{1, 0, 0, 1, 0}},
		"past near":          {rls.Observation{Limit: l, Hits: 1, Remaining: 1}, counts{1, 0, 1, 1, 0}},
		"across near":        {rls.Observation{Limit: l, Hits: 4, Remaining: 0}, counts{4, 0, 2, 4, 0}},
		"over, from full":    {rls.Observation{Limit: l, Hits: 3, Over: true, Remaining: 0}, counts{3, 3, 0, 0, 0}},
		"over, across":       {rls.Observation{Limit: l, Hits: 5, Over: true, Remaining: 3}, counts{5, 2, 2, 0, 0}},
		"shadow over":        {rls.Observation{Limit: shadow, Hits: 2, Over: true, Remaining: 0}, counts{2, 2, 0, 0, 2}},
		"never admissible":   {rls.Observation{Limit: &rlsconfig.Limit{Path: "rl.zero"}, Hits: 1, Over: true, Remaining: -1}, counts{1, 1, 0, 0, 0}},
		// A look (hits_addend 0): the reference adds its 0 hits to every counter.
		"look, within": {rls.Observation{Limit: l, Hits: 0, Remaining: 1}, counts{}},
		"look, over":   {rls.Observation{Limit: shadow, Hits: 0, Over: true, Remaining: 0}, counts{}},
		"look, never":  {rls.Observation{Limit: &rlsconfig.Limit{Path: "rl.zero"}, Hits: 0, Over: true, Remaining: -1}, counts{}},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, c.want, countsOf(c.o, 0.8))
		})
	}
}
