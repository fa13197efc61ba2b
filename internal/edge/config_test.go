package edge

import (
	"bytes"
	"flag"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limiter"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseFlagsAndEnv(t *testing.T) {
	cfg, err := ParseFlags(
		[]string{"--listen", ":9000", "--origin", "http://a:1,http://b:2", "--origin", "http://c:3", "--trusted-proxies", "10.0.0.0/8, 192.0.2.1"},
		env(map[string]string{
			"EDGEGUARD_REDIS_MODE":    "cluster",
			"EDGEGUARD_REDIS":         "redis://h:7000",
			"EDGEGUARD_LISTEN":        ":7777", // the flag wins
			"EDGEGUARD_REDIS_TIMEOUT": "7ms",
			"EDGEGUARD_FAIL_MODE":     "closed",
		}), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, ":9000", cfg.Listen)
	require.Equal(t, []string{"http://a:1", "http://b:2", "http://c:3"}, cfg.Origins)
	require.Equal(t, limiter.ModeCluster, cfg.RedisMode)
	require.Equal(t, 7*time.Millisecond, cfg.RedisTimeout)
	require.Equal(t, limiter.FailClosed, cfg.FailMode)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32")}, cfg.TrustedProxies)
}

func TestParseFlagsRejectsBadInput(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"--redis-mode", "raft"}, nil, []string{"unknown redis mode"}},
		{[]string{"--fail-mode", "maybe"}, nil, []string{"unknown fail mode"}},
		{[]string{"--trusted-proxies", "10.0.0.0/8,not-an-ip"}, nil, []string{`"not-an-ip" is not an address or CIDR`}},
		{nil, map[string]string{"EDGEGUARD_REDIS_TIMEOUT": "soon"}, []string{"EDGEGUARD_REDIS_TIMEOUT"}},
		{[]string{"--redis-mode", "cluster"}, nil, []string{"redis-mode: cluster needs --redis"}},
		{[]string{"--redis-autopipeline"}, nil, []string{"redis-autopipeline: needs --redis"}},
		{[]string{"--rules", "r.yaml", "--consul", "127.0.0.1:8500"}, nil, []string{"--rules and --consul are exclusive"}},
		{[]string{"--workers", "0", "--redis-timeout", "0s", "--ipv6-prefix", "200"}, nil, []string{"workers: must be ≥ 1", "redis-timeout: must be > 0", "ipv6-prefix"}},
		{[]string{"--admin", ":8080"}, nil, []string{"admin: must differ from listen"}},
		{[]string{"stray"}, nil, []string{"unexpected arguments"}},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			_, err := ParseFlags(c.args, env(c.env), &bytes.Buffer{})
			require.Error(t, err)
			for _, w := range c.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := ParseFlags([]string{"--help"}, env(nil), &out)
	require.ErrorIs(t, err, flag.ErrHelp)
	for _, name := range []string{"listen", "admin", "origin", "redis", "redis-mode", "redis-timeout", "rules", "region", "pop",
		"nodes-in-region", "trusted-proxies", "fail-mode", "origin-timeout", "drain-delay", "legacy-headers", "workers",
		"redis-autopipeline", "consul", "consul-token", "consul-prefix", "rules-cache"} {
		require.Regexp(t, `(?m)^  -`+name+`( |$)`, out.String())
	}
	require.Contains(t, out.String(), "EDGEGUARD_REDIS_MODE")
}
