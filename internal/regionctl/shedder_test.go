package regionctl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/shedder"
)

func TestShedder(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	r := run(t, "shedder", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "defaults")
	require.Contains(t, r.stdout, "good=0.7\n")

	r = run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "good=0.75", "start_after=10s", "--message", "calmer")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "eu-west: ok: shedder settings updated (good=0.75 start_after=10s)")

	pair := kv(t, euWest, p+"shedder/eu-west")
	require.NotNil(t, pair)
	cfg, err := shedder.ParseConfig(pair.Value)
	require.NoError(t, err, "%s", pair.Value)
	require.Equal(t, 0.75, cfg.Good)
	require.Equal(t, 10*time.Second, cfg.StartAfter)
	require.Equal(t, shedder.DefaultConfig().Bad, cfg.Bad)
	require.Nil(t, kv(t, usEast, p+"shedder/eu-west"))

	r = run(t, "shedder", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "good=0.75\n")
	require.Contains(t, r.stdout, "start_after=10s\n")
	require.Contains(t, r.stdout, "tiers.paths=/healthcheck:critical:trusted,/internal/synthetic:test\n")

	r = run(t, "shedder", "get", "--prefix", p, "--region", "eu-west", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, true, m["stored"])
	require.Equal(t, 0.75, m["settings"].(map[string]any)["good"])
	require.Equal(t, "10s", m["settings"].(map[string]any)["start_after"])

	// Every bad value is listed; nothing is written.
	r = run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "good=2", "queue_size=-1", "colour=blue")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "shedder settings: invalid (3 problems); nothing was written")
	require.Contains(t, r.stderr, "colour: unknown setting")
	r = run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "good=2", "queue_size=-1")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "good: must be in (0, 1), got 2")
	require.Contains(t, r.stderr, "queue_size: must be >= 0, got -1")
	require.Equal(t, pair.ModifyIndex, kv(t, euWest, p+"shedder/eu-west").ModifyIndex)

	r = run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "good")
	require.Equal(t, ExitUsage, r.code, r)

	// A history entry of kind shedder.
	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--kind", "shedder", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	e := decodeJSON(t, r.stdout)["entries"].([]any)[0].(map[string]any)
	require.Equal(t, "shedder", e["kind"])
	require.Equal(t, "calmer", e["message"])

	r = run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "--output", "json", "bad=0.9")
	require.Equal(t, ExitOK, r.code, r)
	res := decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	require.Equal(t, "ok", res["status"])
}

// A typo in a setting is reported before Consul is contacted (here it is
// not even reachable), with the setting meant.
func TestShedderSetChecksKeysFirst(t *testing.T) {
	r := runApp(t, &app{}, func(string) string { return "" }, "--consul", "127.0.0.1:1", "shedder", "set", "--region", "eu-west", "goodd=0.5", "bad=high")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "goodd: unknown setting (did you mean good?)")
	require.Contains(t, r.stderr, `bad: strconv.ParseFloat: parsing "high"`)
	require.NotContains(t, r.stderr, "unreachable")
}

func TestShedderAdaptiveSettings(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	r := run(t, "shedder", "set", "--prefix", p, "--region", "eu-west",
		"adaptive.enabled=true", "adaptive.shares.critical=0.4", "adaptive.window=50ms", "runtime_lag_bad=100ms")
	require.Equal(t, ExitOK, r.code, r)

	pair := kv(t, euWest, p+"shedder/eu-west")
	require.NotNil(t, pair)
	cfg, err := shedder.ParseConfig(pair.Value)
	require.NoError(t, err, "%s", pair.Value)
	require.True(t, cfg.Adaptive.Enabled)
	require.Equal(t, 0.4, cfg.Adaptive.Shares.Critical)
	require.Equal(t, 50*time.Millisecond, cfg.Adaptive.Window)
	require.Equal(t, 100*time.Millisecond, cfg.RuntimeLagBad)

	r = run(t, "shedder", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	for _, line := range []string{"adaptive.enabled=true\n", "adaptive.shares.critical=0.4\n", "adaptive.window=50ms\n", "runtime_lag_bad=100ms\n", "adaptive.min_rtt_window=30s\n"} {
		require.Contains(t, r.stdout, line)
	}

	// The shares are checked together: nothing is written.
	r = run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "adaptive.shares.read=0.8")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "adaptive.shares: must sum to at most 1")
	require.Equal(t, pair.ModifyIndex, kv(t, euWest, p+"shedder/eu-west").ModifyIndex)
}
