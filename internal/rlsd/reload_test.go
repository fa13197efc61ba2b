package rlsd_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
)

// A Kubernetes ConfigMap update swaps the ..data symlink to a new
// timestamped directory: the service follows it without a signal, and a
// set that does not load leaves the one in force.
func TestReloadFollowsDataSymlink(t *testing.T) {
	root := k8sConfig(t, map[string]string{"config.yaml": migrationConfig})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr(t),
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false", "USE_STATSD=false", "LOG_LEVEL=info",
	})
	limitOf := func() uint32 {
		r := p.call(t, "rl", "user", unique(t))
		if r.Statuses[0].CurrentLimit == nil {
			return 0
		}
		return r.Statuses[0].CurrentLimit.RequestsPerUnit
	}
	require.Equal(t, uint32(3), limitOf())

	dir := filepath.Join(root, "ratelimit", "config")
	swap := func(name, doc string) {
		stamp := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(stamp, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(stamp, "config.yaml"), []byte(doc), 0o644))
		tmp := filepath.Join(dir, "..data_tmp")
		require.NoError(t, os.Symlink(name, tmp))
		require.NoError(t, os.Rename(tmp, filepath.Join(dir, "..data")))
	}
	swap("..2026_01_02_00_00_00.000000001", `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 7}
`)
	waitFor(t, "the new limit in force", 30*time.Second, func() bool { return limitOf() == 7 })

	swap("..2026_01_03_00_00_00.000000001", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	waitFor(t, "the refused reload logged", 30*time.Second, func() bool {
		return strings.Contains(p.log.String(), "reload refused")
	})
	require.Equal(t, uint32(7), limitOf())
	require.Equal(t, pb.RateLimitResponse_OK, p.call(t, "rl", "user", unique(t)).OverallCode)
	p.stop(t)
}

// An empty configuration directory is served as the reference serves it:
// healthy, every descriptor answered OK. A drain with no delay ends on
// its own: one SIGTERM, exit 0.
func TestEmptyConfigurationServes(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "config"), 0o755))
	p := startRLS(t, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr(t), "RUNTIME_ROOT=" + root, "USE_STATSD=false", "EDGEGUARD_DRAIN_DELAY=0s"})
	r := p.call(t, "rl", "user", unique(t))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Nil(t, r.Statuses[0].CurrentLimit)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.exited(t)
}
