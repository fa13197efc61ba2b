package rlsd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// REDIS_TYPE=SENTINEL with the reference's REDIS_URL,
// "mastername,sentinel:port,sentinel:port": the limits count in the
// master the sentinels name.
func TestSentinel(t *testing.T) {
	s, err := testenv.StartSentinel(testenv.SentinelOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	root := k8sConfig(t, map[string]string{"config.yaml": `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1}
`})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_TYPE=SENTINEL",
		"REDIS_URL=" + s.MasterName + "," + strings.Join(s.SentinelAddrs(), ","),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false",
	})
	user := unique(t)
	require.Equal(t, pb.RateLimitResponse_OK, p.call(t, "rl", "user", user).OverallCode)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, p.call(t, "rl", "user", user).OverallCode)
	// Counted in Redis, not in the local fallback.
	require.NotContains(t, p.log.String(), "not reachable")
	p.stop(t)
}

// REDIS_TYPE=CLUSTER with the reference's REDIS_URL, the seeds comma
// separated.
func TestCluster(t *testing.T) {
	c, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	root := k8sConfig(t, map[string]string{"config.yaml": migrationConfig})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_TYPE=CLUSTER",
		"REDIS_URL=" + strings.Join(c.Addrs(), ","),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false",
		"LOG_LEVEL=debug",
	})
	user := unique(t)
	for range 3 {
		require.Equal(t, pb.RateLimitResponse_OK, p.call(t, "rl", "user", user).OverallCode)
	}
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, p.call(t, "rl", "user", user).OverallCode)
	require.NotContains(t, p.log.String(), "not reachable")
	p.stop(t)
}

// A Redis that cannot decide makes each call a gRPC UNAVAILABLE, as the
// reference answers an error, so Envoy's failure_mode_deny decides: no
// replica admits the whole limit on its own.
func TestRedisDownIsUnavailable(t *testing.T) {
	root := k8sConfig(t, map[string]string{"config.yaml": "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n"})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + testenv.ClosedAddr(t),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false",
	})
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := pb.NewRateLimitServiceClient(p.conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "rl",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: unique(t)}}}}})
		cancel()
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	}
	require.Contains(t, p.log.String(), "answering UNAVAILABLE until it is")
	p.stop(t)
}
