package shedder

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestDefaultConfigValid(t *testing.T) {
	cfg := DefaultConfig()
	require.NoError(t, cfg.Validate())
	require.Equal(t, 0.7, cfg.Good)
	require.Equal(t, 0.8, cfg.Bad)
	require.Equal(t, 28*time.Second, cfg.StartAfter)
	require.Equal(t, 120*time.Second, cfg.FullAfter)
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // each must appear; nil means valid
	}{
		{"defaults", func(*Config) {}, nil},
		{"bad may be 1", func(c *Config) { c.Bad = 1 }, nil},
		{"no smoothing", func(c *Config) { c.Smoothing = 0 }, nil},
		{"no queue", func(c *Config) { c.QueueSize, c.QueueTimeout = 0, 0 }, nil},
		{"good zero", func(c *Config) { c.Good = 0 }, []string{"good: must be in (0, 1)"}},
		{"good NaN", func(c *Config) { c.Good = math.NaN() }, []string{"good: must be in (0, 1)"}},
		{"bad above 1", func(c *Config) { c.Bad = 1.1 }, []string{"bad: must be in (0, 1]"}},
		{"bad not above good", func(c *Config) { c.Good, c.Bad = 0.8, 0.8 }, []string{"bad: must be greater than good"}},
		{"durations", func(c *Config) {
			c.StartAfter, c.FullAfter, c.Smoothing, c.ShareWindow = 0, -1, -1, 0
		}, []string{"start_after: must be > 0", "full_after: must be > 0", "smoothing: must be >= 0", "share_window: must be > 0"}},
		{"queue", func(c *Config) { c.QueueSize = -1; c.QueueTimeout = -1 }, []string{"queue_size", "queue_timeout: must be >= 0"}},
		{"queue without timeout", func(c *Config) { c.QueueTimeout = 0 }, []string{"queue_timeout: must be > 0 when queue_size > 0"}},
		{"critical waits the queue timeout", func(c *Config) { c.CriticalQueueTimeout = 0 }, nil},
		{"critical below the queue timeout", func(c *Config) { c.CriticalQueueTimeout = time.Millisecond }, nil},
		{"negative critical wait", func(c *Config) { c.CriticalQueueTimeout = -time.Second }, []string{"critical_queue_timeout: must be in [0, 10s]"}},
		{"headers", func(c *Config) { c.Tiers.PriorityHeader = "X Priority"; c.Tiers.TestModeHeader = "a:b" }, []string{"tiers.priority_header", "tiers.test_mode_header"}},
		{"rules", func(c *Config) {
			c.Tiers.Paths = []PrefixRule{{Prefix: "x", Tier: TierRead}, {Prefix: "/ok", Tier: Tier(7)}}
			c.Tiers.APIKeys = []PrefixRule{{Prefix: "", Tier: TierCritical}}
			c.Tiers.ReadMethods = []string{"GET", ""}
		}, []string{"tiers.paths[0].prefix", "tiers.paths[1].tier", "tiers.api_keys[0].prefix", "tiers.api_keys[0].tier: critical is not allowed", "tiers.read_methods[1]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
			// Every problem is its own joined error.
			var joined interface{ Unwrap() []error }
			require.True(t, errors.As(err, &joined))
			require.Len(t, joined.Unwrap(), len(tt.want))
		})
	}
}

func TestParseConfig(t *testing.T) {
	t.Run("overlay on defaults", func(t *testing.T) {
		cfg, err := ParseConfig([]byte(`{"good": 0.6, "start_after": "10s", "tiers": {"paths": [{"prefix": "/hc", "tier": "critical", "trusted_only": true}]}}`))
		require.NoError(t, err)
		want := DefaultConfig()
		want.Good = 0.6
		want.StartAfter = 10 * time.Second
		want.Tiers.Paths = []PrefixRule{{Prefix: "/hc", Tier: TierCritical, TrustedOnly: true}}
		require.Equal(t, want, cfg)
	})
	t.Run("a listed rule does not inherit the default rule's fields", func(t *testing.T) {
		// The default paths' first rule is trusted_only; a document's first
		// rule that does not say so must not become trusted_only by
		// being decoded over it (nor be accepted as critical).
		_, err := ParseConfig([]byte(`{"tiers": {"paths": [{"prefix": "/hc", "tier": "critical"}]}}`))
		require.ErrorContains(t, err, "critical needs trusted_only: true")
		cfg, err := ParseConfig([]byte(`{"tiers": {"paths": [{"prefix": "/x", "tier": "read"}]}}`))
		require.NoError(t, err)
		require.Equal(t, []PrefixRule{{Prefix: "/x", Tier: TierRead}}, cfg.Tiers.Paths)
	})
	t.Run("empty object is defaults", func(t *testing.T) {
		cfg, err := ParseConfig([]byte(`{}`))
		require.NoError(t, err)
		require.Equal(t, DefaultConfig(), cfg)
	})
	for name, data := range map[string]string{
		"unknown field":        `{"goood": 0.6}`,
		"unknown nested field": `{"tiers": {"pathz": []}}`,
		"numeric duration":     `{"start_after": 28}`,
		"bad duration":         `{"start_after": "soon"}`,
		"bad tier":             `{"tiers": {"paths": [{"prefix": "/a", "tier": "vip"}]}}`,
		"trailing data":        `{} {}`,
		"not json":             `good=0.6`,
		"invalid values":       `{"good": 0.9, "bad": 0.5}`,
		// encoding/json alone would apply these: the shedder off.
		"a field in another case":        `{"ENABLED": false}`,
		"a nested field in another case": `{"tiers": {"Paths": []}}`,
		"a field twice":                  `{"enabled": true, "enabled": false}`,
		"a field in another case, YAML":  "ENABLED: false\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig([]byte(data))
			require.Error(t, err)
			require.ErrorContains(t, err, "shedder: parse config")
		})
	}
	t.Run("round trip", func(t *testing.T) {
		data, err := json.Marshal(DefaultConfig())
		require.NoError(t, err)
		require.Contains(t, string(data), `"start_after":"28s"`)
		require.Contains(t, string(data), `"critical_queue_timeout":"2s"`)
		require.Contains(t, string(data), `"tier":"critical"`)
		cfg, err := ParseConfig(data)
		require.NoError(t, err)
		require.Equal(t, DefaultConfig(), cfg)
	})
	t.Run("embedded in a lenient document stays strict", func(t *testing.T) {
		var doc struct {
			Shedder Config `json:"shedder"`
		}
		doc.Shedder = DefaultConfig()
		require.Error(t, json.Unmarshal([]byte(`{"shedder": {"typo": 1}, "other": 2}`), &doc))
		require.NoError(t, json.Unmarshal([]byte(`{"shedder": {"bad": 0.9}, "other": 2}`), &doc))
		require.Equal(t, 0.9, doc.Shedder.Bad)
		require.Equal(t, 0.7, doc.Shedder.Good)
	})
}

func TestConfigYAML(t *testing.T) {
	cfg := DefaultConfig()
	require.NoError(t, yaml.Unmarshal([]byte(`
good: 0.65
start_after: 10s
queue_timeout: 20ms
tiers:
  api_keys:
    - prefix: bot_
      tier: test
`), &cfg))
	require.Equal(t, 0.65, cfg.Good)
	require.Equal(t, 10*time.Second, cfg.StartAfter)
	require.Equal(t, 20*time.Millisecond, cfg.QueueTimeout)
	require.Equal(t, []PrefixRule{{Prefix: "bot_", Tier: TierTest}}, cfg.Tiers.APIKeys)
	require.NoError(t, cfg.Validate())
}

func TestApplySettings(t *testing.T) {
	base := DefaultConfig()
	tests := []struct {
		name    string
		kv      map[string]string
		check   func(t *testing.T, c Config)
		wantErr []string
	}{
		{name: "operator example", kv: map[string]string{"good": "0.75", "start_after": "10s"}, check: func(t *testing.T, c Config) {
			require.Equal(t, 0.75, c.Good)
			require.Equal(t, 10*time.Second, c.StartAfter)
			require.Equal(t, base.Bad, c.Bad)
		}},
		{name: "all scalars", kv: map[string]string{
			"enabled": "false", "bad": "0.9", "full_after": "1m", "smoothing": "0s", "share_window": "5s",
			"queue_timeout": "10ms", "critical_queue_timeout": "500ms", "queue_size": "8", "tiers.priority_header": "X-Class",
			"tiers.test_mode_header": "", "tiers.api_key_header": "Authorization",
		}, check: func(t *testing.T, c Config) {
			require.False(t, c.Enabled)
			require.Equal(t, 0.9, c.Bad)
			require.Equal(t, time.Minute, c.FullAfter)
			require.Zero(t, c.Smoothing)
			require.Equal(t, 5*time.Second, c.ShareWindow)
			require.Equal(t, 10*time.Millisecond, c.QueueTimeout)
			require.Equal(t, 500*time.Millisecond, c.CriticalQueueTimeout)
			require.Equal(t, 8, c.QueueSize)
			require.Equal(t, "X-Class", c.Tiers.PriorityHeader)
			require.Empty(t, c.Tiers.TestModeHeader)
			require.Equal(t, "Authorization", c.Tiers.APIKeyHeader)
		}},
		{name: "lists", kv: map[string]string{
			"tiers.paths":        "/hc:critical:trusted, /syn:test",
			"tiers.api_keys":     "test_:test",
			"tiers.read_methods": "GET,HEAD",
		}, check: func(t *testing.T, c Config) {
			require.Equal(t, []PrefixRule{{Prefix: "/hc", Tier: TierCritical, TrustedOnly: true}, {Prefix: "/syn", Tier: TierTest}}, c.Tiers.Paths)
			require.Equal(t, []PrefixRule{{Prefix: "test_", Tier: TierTest}}, c.Tiers.APIKeys)
			require.Equal(t, []string{"GET", "HEAD"}, c.Tiers.ReadMethods)
		}},
		{name: "clear a list", kv: map[string]string{"tiers.paths": ""}, check: func(t *testing.T, c Config) {
			require.Empty(t, c.Tiers.Paths)
		}},
		{name: "every bad key and value", kv: map[string]string{"goood": "1", "bad": "high", "start_after": "28", "tiers.paths": "/x"},
			wantErr: []string{"goood: unknown setting", "bad: strconv.ParseFloat", "start_after: time: missing unit", "tiers.paths: rule \"/x\""}},
		{name: "valid values, invalid result", kv: map[string]string{"good": "0.9"},
			wantErr: []string{"bad: must be greater than good"}},
		{name: "a critical path any client could choose", kv: map[string]string{"tiers.paths": "/hc:critical"},
			wantErr: []string{"tiers.paths[0].tier: critical needs trusted_only: true", "untrusted client could make itself critical"}},
		{name: "critical queue timeout bounded", kv: map[string]string{"critical_queue_timeout": "8760h"},
			wantErr: []string{"critical_queue_timeout: must be in [0, 10s]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ApplySettings(base, tt.kv)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, ErrInvalidConfig)
				for _, w := range tt.wantErr {
					require.ErrorContains(t, err, w)
				}
				require.Equal(t, base, got, "cfg returned unchanged on error")
				return
			}
			require.NoError(t, err)
			tt.check(t, got)
		})
	}
	// The input is never modified through shared slices.
	_, err := ApplySettings(base, map[string]string{"tiers.paths": "/z:test"})
	require.NoError(t, err)
	require.Equal(t, DefaultConfig(), base)
	for _, k := range SettingKeys {
		require.False(t, strings.Contains(k, " "), k)
	}
}

// Shedder settings may be written in YAML like the rules, held to the same
// strict reading as JSON.
func TestParseConfigYAML(t *testing.T) {
	cfg, err := ParseConfig([]byte("good: 0.6\nstart_after: 10s\ntiers:\n  paths:\n    - {prefix: /hc, tier: critical, trusted_only: true}\n"))
	require.NoError(t, err)
	require.Equal(t, 0.6, cfg.Good)
	require.Equal(t, 10*time.Second, cfg.StartAfter)
	require.Equal(t, []PrefixRule{{Prefix: "/hc", Tier: TierCritical, TrustedOnly: true}}, cfg.Tiers.Paths)
	_, err = ParseConfig([]byte("goood: 0.6\n"))
	require.ErrorContains(t, err, `unknown field "goood"`)
	cfg, err = ParseConfig([]byte("# nothing set\n"))
	require.NoError(t, err)
	require.Equal(t, DefaultConfig(), cfg)
}

func TestAdaptiveSettings(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"runtime_lag_bad": "150ms", "adaptive": {"enabled": true, "window": "50ms", "shares": {"critical": 0.5}}}`))
	require.NoError(t, err)
	require.True(t, cfg.Adaptive.Enabled)
	require.Equal(t, 50*time.Millisecond, cfg.Adaptive.Window)
	require.Equal(t, 150*time.Millisecond, cfg.RuntimeLagBad)
	require.Equal(t, 0.5, cfg.Adaptive.Shares.Critical)
	require.Equal(t, DefaultAdaptiveConfig().Shares.Write, cfg.Adaptive.Shares.Write, "unmentioned fields keep their default")
	require.Equal(t, DefaultAdaptiveConfig().MinRTTWindow, cfg.Adaptive.MinRTTWindow)

	// Round trip: durations as strings, the same config back.
	data, err := json.Marshal(cfg)
	require.NoError(t, err)
	require.Contains(t, string(data), `"window":"50ms"`)
	back, err := ParseConfig(data)
	require.NoError(t, err)
	require.Equal(t, cfg, back)

	_, err = ParseConfig([]byte(`{"adaptive": {"windw": "50ms"}}`))
	require.ErrorContains(t, err, "windw")

	_, err = ParseConfig([]byte(`{"adaptive": {"min_limit": 0, "smoothing": 2, "shares": {"read": 0.6, "critical": 0.6}}}`))
	require.ErrorIs(t, err, ErrInvalidConfig)
	for _, field := range []string{"adaptive.min_limit", "adaptive.smoothing", "adaptive.shares"} {
		require.ErrorContains(t, err, field)
	}

	next, err := ApplySettings(DefaultConfig(), map[string]string{
		"adaptive.enabled": "true", "adaptive.max_limit": "500", "adaptive.shares.critical": "0.4", "runtime_lag_bad": "100ms",
	})
	require.NoError(t, err)
	require.True(t, next.Adaptive.Enabled)
	require.Equal(t, 500, next.Adaptive.MaxLimit)
	require.Equal(t, 0.4, next.Adaptive.Shares.Critical)
	require.Equal(t, 100*time.Millisecond, next.RuntimeLagBad)
	require.ErrorContains(t, CheckSettings(map[string]string{"adaptive.enabeld": "true"}), "did you mean adaptive.enabled")
}
