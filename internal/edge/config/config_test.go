package config

import (
	"bytes"
	"flag"
	"io"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
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
			"EDGEGUARD_KEY_SALT":      "0123456789abcdef",
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
		{[]string{"--rules", "r.yaml", "--consul", "127.0.0.1:8500"}, nil, []string{"--rules and --consul are exclusive"}},
		{[]string{"--workers", "0", "--redis-timeout", "0s", "--ipv6-prefix", "200"}, nil, []string{"workers: must be ≥ 1", "redis-timeout: must be > 0", "ipv6-prefix"}},
		{[]string{"--admin", ":8080"}, nil, []string{"admin: must differ from listen"}},
		{[]string{"stray"}, nil, []string{"unexpected arguments"}},
		{[]string{"--allow-methods", "GET,trace"}, nil, []string{`allow-methods: "GET" is not refused by default`}},
		{[]string{"--max-conns-per-ip", "-1", "--origin-max-conns", "-2"}, nil, []string{"max-conns-per-ip: must be ≥ 0", "origin-max-conns: must be ≥ 0"}},
		{[]string{"--h2-max-held-bytes", "65536"}, nil, []string{"h2-max-held-bytes: at least 1048576"}},
		{[]string{"--key-salt-file", "/nonexistent/salt"}, nil, []string{"key-salt-file"}},
		{[]string{"--path-semantics", "servlet+nginx"}, nil, []string{`path-semantics: path semantics "servlet+nginx": unknown path semantics "nginx"`}},
		{[]string{"--path-semantics", ""}, nil, []string{"path-semantics"}},
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
		"nodes-in-region", "trusted-proxies", "fail-mode", "origin-timeout", "origin-header-timeout", "origin-read-idle-timeout", "drain-delay", "legacy-headers", "workers",
		"redis-autopipeline", "consul", "consul-token", "consul-prefix", "rules-cache", "demo-origin", "key-salt", "key-salt-file",
		"trust-all-proxies", "allow-methods", "max-conns-per-ip", "origin-max-conns", "max-body-bytes",
		"listen-tls", "tls-cert-dir", "tls-default-cert", "tls-ticket-keys", "proxy-protocol-from"} {
		require.Regexp(t, `(?m)^  -`+name+`( |$)`, out.String())
	}
	require.Contains(t, out.String(), "EDGEGUARD_REDIS_MODE")
}

// A list flag on the command line replaces the environment's value (the
// flag wins, as for every other flag); repeated on the command line, it
// adds up.
func TestListFlagsReplaceEnvironment(t *testing.T) {
	e := env(map[string]string{
		"EDGEGUARD_TRUSTED_PROXIES": "192.168.0.0/16",
		"EDGEGUARD_ORIGIN":          "http://env:1",
		"EDGEGUARD_ALLOW_METHODS":   "TRACE",
	})
	cfg, err := ParseFlags([]string{"--trusted-proxies", "10.0.0.1", "--origin", "http://a:1", "--origin", "http://b:2", "--allow-methods", "CONNECT"}, e, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}, cfg.TrustedProxies)
	require.Equal(t, []string{"http://a:1", "http://b:2"}, cfg.Origins)
	require.Equal(t, []string{"CONNECT"}, cfg.AllowMethods)

	cfg, err = ParseFlags(nil, e, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}, cfg.TrustedProxies)
	require.Equal(t, []string{"http://env:1"}, cfg.Origins)
	require.Equal(t, []string{"TRACE"}, cfg.AllowMethods)
}

func TestTrustedProxiesNormalizedAndCatchAllRefused(t *testing.T) {
	parse := func(args ...string) (Config, error) {
		return ParseFlags(append([]string{"--demo-origin"}, args...), env(nil), &bytes.Buffer{})
	}
	for in, want := range map[string]string{
		"::ffff:10.1.2.3/128": "10.1.2.3/32",
		"::ffff:10.1.2.3":     "10.1.2.3/32",
		"::ffff:10.0.0.0/104": "10.0.0.0/8",
		"10.1.2.3/8":          "10.0.0.0/8",
		"2001:db8::/32":       "2001:db8::/32",
	} {
		cfg, err := parse("--trusted-proxies", in)
		require.NoError(t, err, in)
		require.Equal(t, []netip.Prefix{netip.MustParsePrefix(want)}, cfg.TrustedProxies, in)
	}
	for _, in := range []string{"0.0.0.0/0", "::/0", "::ffff:0.0.0.0/96", "10.0.0.0/8,::/0"} {
		_, err := parse("--trusted-proxies", in)
		require.ErrorContains(t, err, "trusts every address", in)
	}
	cfg, err := parse("--trusted-proxies", "0.0.0.0/0", "--trust-all-proxies")
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, cfg.TrustedProxies)
	_, err = parse("--trusted-proxies", "::ffff:1.2.3.4/90")
	require.ErrorContains(t, err, "IPv4-mapped")
}

// The demo origin only on request: a node without --origin refuses to
// start rather than serve the demo in production.
func TestOriginOrDemoRequired(t *testing.T) {
	_, err := ParseFlags(nil, env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "origin: required")
	require.ErrorContains(t, err, "--demo-origin")
	cfg, err := ParseFlags([]string{"--demo-origin"}, env(nil), &bytes.Buffer{})
	require.NoError(t, err)
	require.True(t, cfg.DemoOrigin)
	require.Empty(t, cfg.Origins)
	_, err = ParseFlags([]string{"--demo-origin", "--origin", "http://o:1"}, env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "exclusive")
}

func TestOriginTLSFlags(t *testing.T) {
	cfg, err := ParseFlags([]string{"--origin", "https://o:443", "--origin-tls-server-name", "origin.internal",
		"--origin-ca-file", "/etc/edge/origin-ca.pem"}, env(nil), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, "origin.internal", cfg.OriginTLSServerName)
	require.Equal(t, "/etc/edge/origin-ca.pem", cfg.OriginCAFile)
	require.False(t, cfg.OriginTLSInsecureSkipVerify, "verification is on by default")
	cfg, err = ParseFlags([]string{"--origin", "https://o:443", "--origin-tls-insecure-skip-verify"}, env(nil), &bytes.Buffer{})
	require.NoError(t, err)
	require.True(t, cfg.OriginTLSInsecureSkipVerify)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--origin", "http://o:80", "--origin-ca-file", "ca.pem"}, "no --origin is https"},
		{[]string{"--demo-origin", "--origin-tls-insecure-skip-verify"}, "no --origin is https"},
		{[]string{"--origin", "https://o", "--origin-ca-file", "ca.pem", "--origin-tls-insecure-skip-verify"}, "exclusive"},
		{[]string{"--origin", "https://o", "--origin-tls-server-name", "o:443"}, "origin-tls-server-name"},
		{[]string{"--origin", "https://o", "--origin-tls-server-name", "bad name"}, "origin-tls-server-name"},
	} {
		_, err := ParseFlags(tc.args, env(nil), &bytes.Buffer{})
		require.ErrorContains(t, err, tc.want, "%q", tc.args)
	}
}

// With Redis, a salt is required: an unsalted hash of an IPv4 address can
// be enumerated back.
func TestKeySaltRequiredWithRedis(t *testing.T) {
	base := []string{"--origin", "http://o:1", "--redis", "redis://127.0.0.1:6379"}
	_, err := ParseFlags(base, env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "key-salt: required with --redis")
	_, err = ParseFlags(base, env(map[string]string{"EDGEGUARD_KEY_SALT": "short"}), &bytes.Buffer{})
	require.ErrorContains(t, err, "at least 16")

	cfg, err := ParseFlags(base, env(map[string]string{"EDGEGUARD_KEY_SALT": "0123456789abcdef-env"}), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef-env", cfg.KeySalt)

	file := filepath.Join(t.TempDir(), "salt")
	require.NoError(t, os.WriteFile(file, []byte("0123456789abcdef-file\n"), 0o600))
	cfg, err = ParseFlags(append(base, "--key-salt-file", file), env(nil), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef-file", cfg.KeySalt, "read from the file, trailing newline dropped")

	_, err = ParseFlags(append(base, "--key-salt-file", filepath.Join(t.TempDir(), "missing")), env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "key-salt-file")
	_, err = ParseFlags(append(base, "--key-salt-file", file), env(map[string]string{"EDGEGUARD_KEY_SALT": "0123456789abcdef"}), &bytes.Buffer{})
	require.ErrorContains(t, err, "exclusive")

	_, err = ParseFlags([]string{"--demo-origin"}, env(nil), &bytes.Buffer{})
	require.NoError(t, err, "the memory store needs no salt")
}

// Batching is on by default and can be turned off; asked for without Redis
// (its default value, as a flag or a variable) it is no error.
func TestRedisAutopipelineDefault(t *testing.T) {
	cfg, err := ParseFlags([]string{"--demo-origin"}, env(nil), &bytes.Buffer{})
	require.NoError(t, err, "the default needs no Redis")
	require.True(t, cfg.RedisAutopipeline)
	withRedis := []string{"--redis", "redis://h:6379", "--demo-origin"}
	salt := map[string]string{"EDGEGUARD_KEY_SALT": "0123456789abcdef"}
	cfg, err = ParseFlags(withRedis, env(salt), &bytes.Buffer{})
	require.NoError(t, err)
	require.True(t, cfg.RedisAutopipeline)
	cfg, err = ParseFlags(append(withRedis, "--redis-autopipeline=false"), env(salt), &bytes.Buffer{})
	require.NoError(t, err)
	require.False(t, cfg.RedisAutopipeline)
	cfg, err = ParseFlags(withRedis, env(map[string]string{"EDGEGUARD_REDIS_AUTOPIPELINE": "false", "EDGEGUARD_KEY_SALT": "0123456789abcdef"}), &bytes.Buffer{})
	require.NoError(t, err)
	require.False(t, cfg.RedisAutopipeline)
	_, err = ParseFlags([]string{"--demo-origin"}, env(map[string]string{"EDGEGUARD_REDIS_AUTOPIPELINE": "true"}), &bytes.Buffer{})
	require.NoError(t, err, "a setting given its default value never errors")
}

// Secrets never come from the command line (every local user can read a
// process's arguments): each is refused there and read from its variable or
// file instead.
func TestSecretsNotOnTheCommandLine(t *testing.T) {
	base := []string{"--demo-origin"}
	for _, args := range [][]string{
		{"--key-salt", "0123456789abcdef"},
		{"--consul-token", "s3cr3t"},
		{"--admin-token", "s3cr3t"},
		{"--redis", "redis://:s3cr3t@127.0.0.1:6379"},
		{"--redis", "redis://127.0.0.1:26379?master_name=m&sentinel_password=s3cr3t", "--redis-mode", "sentinel"},
	} {
		t.Run(args[0], func(t *testing.T) {
			_, err := ParseFlags(append(base, args...), env(map[string]string{"EDGEGUARD_KEY_SALT": "0123456789abcdef"}), &bytes.Buffer{})
			require.ErrorContains(t, err, "visible to every local user")
		})
	}

	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(v+"\n"), 0o600))
		return p
	}
	cfg, err := ParseFlags(append(base, "--redis", "redis://127.0.0.1:6379", "--key-salt-file", write("salt", "0123456789abcdef"),
		"--admin-token-file", write("admin", "adm1n"), "--consul-token-file", write("consul", "c0nsul")),
		env(map[string]string{"EDGEGUARD_REDIS_PASSWORD": "p@ss word", "REDIS_PASSWORD": "not ours"}), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef", cfg.KeySalt)
	require.Equal(t, "adm1n", cfg.AdminToken)
	require.Equal(t, "c0nsul", cfg.ConsulToken)
	u, err := url.Parse(cfg.Redis)
	require.NoError(t, err)
	pw, _ := u.User.Password()
	require.Equal(t, "p@ss word", pw, "EDGEGUARD_REDIS_PASSWORD goes into the URL go-redis reads")
	require.Empty(t, cfg.RedisPassword, "read into the URL")

	// REDIS_PASSWORD, read before, is never read: an edge that relied on
	// it is refused rather than reaching Redis without a password; with a
	// password from elsewhere, or without Redis, it is not looked at.
	_, err = ParseFlags(append(base, "--redis", "redis://127.0.0.1:6379", "--key-salt-file", write("salt", "0123456789abcdef")),
		env(map[string]string{"REDIS_PASSWORD": "p"}), &bytes.Buffer{})
	require.ErrorContains(t, err, "REDIS_PASSWORD is no longer read")
	cfg, err = ParseFlags(append(base, "--redis", "redis://:own@127.0.0.1:6379", "--key-salt-file", write("salt", "0123456789abcdef")),
		env(map[string]string{"REDIS_PASSWORD": "p"}), &bytes.Buffer{})
	require.ErrorContains(t, err, "a password in --redis is visible", "the URL's own password stays refused on the command line")
	cfg, err = ParseFlags(base, env(map[string]string{"REDIS_PASSWORD": "p"}), &bytes.Buffer{})
	require.NoError(t, err, "no Redis: a platform's REDIS_PASSWORD is none of the edge's business")
	require.Empty(t, cfg.Redis)
	_, err = ParseFlags(append(base, "--redis-password", "x"), env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "redis-password: a secret on the command line")

	cfg, err = ParseFlags(base, env(map[string]string{"EDGEGUARD_ADMIN_TOKEN": "from-env", "EDGEGUARD_REDIS": "redis://:pw@127.0.0.1:6379", "EDGEGUARD_KEY_SALT": "0123456789abcdef"}), &bytes.Buffer{})
	require.NoError(t, err, "the environment is the place for them")
	require.Equal(t, "from-env", cfg.AdminToken)

	_, err = ParseFlags(append(base, "--redis-password-file", write("pw", "x")), env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "without --redis")
}

// The config file holds any flag by its name; the command line wins over
// the environment, which wins over the file, which wins over the default.
func TestConfigFilePrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "edge.yaml")
	require.NoError(t, os.WriteFile(file, []byte("demo-origin: true\nredis-timeout: 50ms\ntrusted-proxies: [10.0.0.0/8, 192.0.2.1]\nworkers: 7\n"), 0o600))
	args := []string{"--config", file}
	cfg, err := ParseFlags(args, env(nil), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 50*time.Millisecond, cfg.RedisTimeout, "the file over the default")
	require.Equal(t, 7, cfg.Workers)
	require.Len(t, cfg.TrustedProxies, 2, "a YAML list")
	require.Equal(t, DefaultConfig().IdleTimeout, cfg.IdleTimeout, "what the file omits keeps its default")

	cfg, err = ParseFlags(args, env(map[string]string{"EDGEGUARD_REDIS_TIMEOUT": "70ms"}), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 70*time.Millisecond, cfg.RedisTimeout, "the environment over the file")

	cfg, err = ParseFlags(append(args, "--redis-timeout", "90ms"), env(map[string]string{"EDGEGUARD_REDIS_TIMEOUT": "70ms"}), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 90*time.Millisecond, cfg.RedisTimeout, "the command line over both")

	cfg, err = ParseFlags(nil, env(map[string]string{"EDGEGUARD_CONFIG": file}), &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 7, cfg.Workers, "the file named in the environment")
}

// Unknown keys and misspelled variables are refused with the nearest name,
// every problem at once.
func TestConfigRefusesUnknownNames(t *testing.T) {
	file := filepath.Join(t.TempDir(), "edge.yaml")
	require.NoError(t, os.WriteFile(file, []byte("demo-origin: true\nredis-timout: 50ms\nworkers: -3\nlisten: {a: b}\n"), 0o600))
	_, err := ParseFlags([]string{"--config", file}, env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "line 2: redis-timout: unknown setting (did you mean redis-timeout?)")
	require.ErrorContains(t, err, "line 4: listen: want a value or a list of values")
	require.ErrorContains(t, err, "workers: must be ≥ 1 (got -3)")

	_, err = ParseArgs([]string{"--demo-origin"}, []string{"EDGEGUARD_REDIS_TIMOUT=1s", "EDGEGUARD_CACHE=/x", "EDGEGUARD_H2SPEC=/x/h2spec", "EDGEGUARD_PEBBLE=/x", "PATH=/bin"}, &bytes.Buffer{})
	require.EqualError(t, err, "EDGEGUARD_REDIS_TIMOUT: no such setting (did you mean EDGEGUARD_REDIS_TIMEOUT?)")
	_, err = ParseArgs(nil, []string{"EDGEGUARD_DEMO_ORIGIN=yes"}, &bytes.Buffer{})
	require.EqualError(t, err, `EDGEGUARD_DEMO_ORIGIN: want true or false, got "yes"`)
}

func TestTLSFlagsValidated(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen-tls", ":8443"}, "listen-tls: needs --tls-cert-dir"},
		{[]string{"--tls-cert-dir", "/etc/edgeguard/certs"}, "given without --listen-tls"},
		{[]string{"--proxy-protocol-from", "0.0.0.0/0"}, "proxy-protocol-from: 0.0.0.0/0"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := ParseFlags(append([]string{"--demo-origin"}, tc.args...), env(nil), io.Discard)
			require.ErrorContains(t, err, tc.want)
		})
	}
	c, err := ParseFlags([]string{"--demo-origin", "--listen-tls", ":8443", "--tls-cert-dir", "/certs", "--proxy-protocol-from", "10.1.0.0/16,::ffff:10.2.0.1"}, env(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.1/32")}, c.ProxyProtocolFrom)
}
