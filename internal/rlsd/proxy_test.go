package rlsd_test

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// The proxy (plain `edge`) reads EDGEGUARD_* variables, never the
// reference's: REDIS_URL and its kin are common platform variables, and
// only `edge rls` reads them.
func TestProxyIgnoresReferenceVariables(t *testing.T) {
	reference := []string{
		"REDIS_URL=redis://10.9.9.9:6379", "REDIS_TYPE=CLUSTER", "REDIS_SOCKET_TYPE=tcp", "REDIS_AUTH=secret",
		"GRPC_PORT=9999", "PORT=9998", "RUNTIME_ROOT=/nonexistent", "SHADOW_MODE=true", "LOG_LEVEL=error",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "MERGE_DOMAIN_CONFIG=true",
	}
	cfg, err := config.ParseArgs([]string{"--demo-origin"}, reference, io.Discard)
	require.NoError(t, err)
	require.Empty(t, cfg.Redis, "REDIS_URL read by the proxy")
	require.Equal(t, limiter.ModeStandalone, cfg.RedisMode)
	require.Empty(t, cfg.RLS.Listen)
	require.Empty(t, cfg.RLS.ConfigDir)
	require.False(t, cfg.RLS.Shadow)
	require.False(t, cfg.RLS.MergeDomains)
	require.Equal(t, "off", cfg.RLS.Headers)
	require.Equal(t, "info", cfg.LogLevel)

	// Its own variables are read from the same environment.
	cfg, err = config.ParseArgs([]string{"--demo-origin"}, append(reference, "EDGEGUARD_REDIS=redis://10.1.1.1:6379", "EDGEGUARD_KEY_SALT=0123456789abcdef0123456789abcdef"), io.Discard)
	require.NoError(t, err)
	require.Equal(t, "redis://10.1.1.1:6379", cfg.Redis, "EDGEGUARD_REDIS is the proxy's")
}
