package shedder

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/pkg/strictjson"
	"github.com/edgeguard/edgeguard/pkg/suggest"
)

// ErrInvalidConfig is wrapped by every configuration problem so callers can
// tell a refused setting (keep running on the old one) from other failures.
var ErrInvalidConfig = errors.New("invalid shedder config")

// Config is the shedder's complete, live-tunable setting. Durations are
// written as Go duration strings ("28s", "50ms") in JSON and YAML.
type Config struct {
	// Enabled=false keeps the ramp running (level and cut-off metrics still
	// move) but admits everything: a shadow mode for rolling out settings.
	Enabled bool `json:"enabled" yaml:"enabled"`
	// Good is the utilization under which the shed level recovers.
	Good float64 `json:"good" yaml:"good"`
	// Bad is the utilization from which the shed level climbs; between Good
	// and Bad the level holds (dead zone) so the node does not oscillate.
	Bad float64 `json:"bad" yaml:"bad"`
	// StartAfter is how long sustained full utilization takes, from rest,
	// before anything is shed.
	StartAfter time.Duration `json:"start_after" yaml:"start_after"`
	// FullAfter is how long sustained full utilization then takes to shed
	// all sheddable traffic.
	FullAfter time.Duration `json:"full_after" yaml:"full_after"`
	// Smoothing is the half-life of the utilization EWMA; 0 uses raw samples.
	Smoothing time.Duration `json:"smoothing" yaml:"smoothing"`
	// ShareWindow is the half-life over which offered traffic per tier is
	// averaged to decide where the cut-off falls.
	ShareWindow time.Duration `json:"share_window" yaml:"share_window"`
	// QueueTimeout bounds how long a request of a sheddable tier (test,
	// read, write) waits for a worker slot: past it the request is answered
	// 503 at once, which its client can retry, and the ramp cuts these
	// tiers anyway.
	QueueTimeout time.Duration `json:"queue_timeout" yaml:"queue_timeout"`
	// CriticalQueueTimeout bounds how long a critical request waits for a
	// worker slot; a critical request waits the longer of it and
	// queue_timeout (so 0 means queue_timeout). Freed slots go to critical
	// requests first, but when every worker is held by requests waiting on
	// an overloaded origin, the next slot frees only when the origin, which
	// serves every edge's requests in arrival order, reaches one of this
	// edge's: tens to hundreds of milliseconds under overload, more with
	// more edges per origin. Critical traffic has no better answer than that
	// slot, so it should wait about as long as the origin takes to answer
	// under overload. At most as many critical requests as there are
	// workers wait at once.
	CriticalQueueTimeout time.Duration `json:"critical_queue_timeout" yaml:"critical_queue_timeout"`
	// QueueSize bounds how many requests of the sheddable tiers may wait for
	// a worker slot (critical requests have as many places of their own as
	// there are workers); 0 rejects every tier as soon as every worker is
	// busy.
	QueueSize int `json:"queue_size" yaml:"queue_size"`
	// Tiers says how requests are classified.
	Tiers TierConfig `json:"tiers" yaml:"tiers"`
	// Adaptive is the adaptive concurrency limit on origin requests,
	// learned from their latency (off by default).
	Adaptive AdaptiveConfig `json:"adaptive" yaml:"adaptive"`
	// RuntimeLagBad is the edge's own scheduling delay (a ticker's lateness,
	// the runtime's scheduler latencies and GC pauses) that counts as full
	// utilization for the ramp: a host starved of CPU, or stalled in GC,
	// sheds even while its workers look idle. 0 (the default) leaves the
	// ramp to worker utilization alone.
	RuntimeLagBad time.Duration `json:"runtime_lag_bad" yaml:"runtime_lag_bad"`
	// HostShare gives each host a fair share of the workers, so one host's
	// slow origin or flood is shed before it sheds every host alike.
	HostShare HostShareConfig `json:"host_share" yaml:"host_share"`
}

// TierConfig drives the Classifier. Rules apply in this order: trusted
// test-mode header, trusted priority header, path prefixes, API-key
// prefixes, then the method.
type TierConfig struct {
	// PriorityHeader carries a tier name; honoured only from trusted proxies
	// so a client cannot promote itself. Empty disables it.
	PriorityHeader string `json:"priority_header" yaml:"priority_header"`
	// TestModeHeader marks synthetic traffic when truthy (1/true/yes/on);
	// honoured only from trusted proxies. Empty disables it.
	TestModeHeader string `json:"test_mode_header" yaml:"test_mode_header"`
	// APIKeyHeader holds the API key matched by APIKeys ("Bearer " is
	// stripped). Empty disables API-key rules.
	APIKeyHeader string `json:"api_key_header" yaml:"api_key_header"`
	// Paths are path-prefix rules, first match wins. A prefix matches whole
	// segments: "/healthcheck" matches "/healthcheck/x", not "/healthcheckx".
	// A rule granting critical must be trusted_only: any client can choose
	// its path.
	Paths []PrefixRule `json:"paths" yaml:"paths"`
	// APIKeys are API-key prefix rules, first match wins. They may not grant
	// critical: the key is not authenticated when we classify.
	APIKeys []PrefixRule `json:"api_keys" yaml:"api_keys"`
	// ReadMethods default to TierRead; every other method is TierWrite.
	ReadMethods []string `json:"read_methods" yaml:"read_methods"`
}

// PrefixRule maps a prefix to a tier.
type PrefixRule struct {
	Prefix string `json:"prefix" yaml:"prefix"`
	Tier   Tier   `json:"tier" yaml:"tier"`
	// TrustedOnly applies the rule only to requests from trusted peers
	// (--trusted-proxies); others fall through to the next rules. Required
	// for a path rule that grants critical.
	TrustedOnly bool `json:"trusted_only,omitempty" yaml:"trusted_only,omitempty"`
}

// UnmarshalJSON decodes a rule from scratch: encoding/json decodes a list
// into the elements already there, so a rule listed over the defaults
// would otherwise keep fields (trusted_only) it does not mention.
func (r *PrefixRule) UnmarshalJSON(data []byte) error {
	type plain PrefixRule
	var p plain
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return err
	}
	*r = PrefixRule(p)
	return nil
}

// MaxCriticalQueueTimeout bounds critical_queue_timeout: a worker slot
// waited for longer than this serves a client that has most likely given
// up, while the edge holds the request (and its connection) all along.
const MaxCriticalQueueTimeout = 10 * time.Second

// DefaultConfig returns Stripe's published ramp (0.7/0.8, 28 s, 120 s) and
// the edge's default classification.
func DefaultConfig() Config {
	return Config{
		Enabled:      true,
		Good:         0.7,
		Bad:          0.8,
		StartAfter:   28 * time.Second,
		FullAfter:    120 * time.Second,
		Smoothing:    time.Second,
		ShareWindow:  10 * time.Second,
		QueueTimeout: 50 * time.Millisecond,
		// Above the stack's origin queueing at 3x overload (two edges of
		// 128 workers on a 400 req/s origin: about 0.65 s).
		CriticalQueueTimeout: 2 * time.Second,
		QueueSize:            64,
		Tiers: TierConfig{
			PriorityHeader: "X-Priority",
			TestModeHeader: "X-Test-Mode",
			APIKeyHeader:   "X-Api-Key",
			Paths: []PrefixRule{
				{Prefix: "/healthcheck", Tier: TierCritical, TrustedOnly: true},
				{Prefix: "/internal/synthetic", Tier: TierTest},
			},
			APIKeys:     []PrefixRule{{Prefix: "test_", Tier: TierTest}},
			ReadMethods: []string{"GET", "HEAD", "OPTIONS"},
		},
		Adaptive:  DefaultAdaptiveConfig(),
		HostShare: DefaultHostShareConfig(),
	}
}

// Clone returns a copy sharing no slices with c, so a caller editing its
// copy cannot change the live configuration under the shedder.
func (c Config) Clone() Config {
	c.Tiers.Paths = slices.Clone(c.Tiers.Paths)
	c.Tiers.APIKeys = slices.Clone(c.Tiers.APIKeys)
	c.Tiers.ReadMethods = slices.Clone(c.Tiers.ReadMethods)
	c.HostShare.Weights = maps.Clone(c.HostShare.Weights)
	return c
}

// floor is the rest value of the shed level: it is how far below zero the
// level must climb, at full utilization, before anything is shed.
func (c Config) floor() float64 {
	return -c.StartAfter.Seconds() / c.FullAfter.Seconds()
}

// Validate reports every problem at once, each naming its field, so an
// operator fixes a bad config in one round trip.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}
	if !(c.Good > 0 && c.Good < 1) {
		bad("good", "must be in (0, 1), got %v", c.Good)
	}
	if !(c.Bad > 0 && c.Bad <= 1) {
		bad("bad", "must be in (0, 1], got %v", c.Bad)
	} else if c.Good > 0 && c.Good < 1 && c.Bad <= c.Good {
		bad("bad", "must be greater than good (%v), got %v", c.Good, c.Bad)
	}
	if c.StartAfter <= 0 {
		bad("start_after", "must be > 0, got %v", c.StartAfter)
	}
	if c.FullAfter <= 0 {
		bad("full_after", "must be > 0, got %v", c.FullAfter)
	}
	if c.Smoothing < 0 {
		bad("smoothing", "must be >= 0 (0 disables smoothing), got %v", c.Smoothing)
	}
	if c.ShareWindow <= 0 {
		bad("share_window", "must be > 0, got %v", c.ShareWindow)
	}
	if c.QueueSize < 0 {
		bad("queue_size", "must be >= 0, got %d", c.QueueSize)
	}
	if c.QueueTimeout < 0 {
		bad("queue_timeout", "must be >= 0, got %v", c.QueueTimeout)
	} else if c.QueueSize > 0 && c.QueueTimeout == 0 {
		bad("queue_timeout", "must be > 0 when queue_size > 0")
	}
	if c.CriticalQueueTimeout < 0 || c.CriticalQueueTimeout > MaxCriticalQueueTimeout {
		bad("critical_queue_timeout", "must be in [0, %v] (critical requests wait the longer of it and queue_timeout), got %v", MaxCriticalQueueTimeout, c.CriticalQueueTimeout)
	}
	if c.QueueTimeout > MaxCriticalQueueTimeout {
		bad("queue_timeout", "must be at most %v, got %v", MaxCriticalQueueTimeout, c.QueueTimeout)
	}

	c.Adaptive.validate(bad)
	c.HostShare.validate(bad)
	if c.RuntimeLagBad < 0 || (c.RuntimeLagBad > 0 && c.RuntimeLagBad < time.Millisecond) {
		bad("runtime_lag_bad", "must be 0 (off) or >= 1ms, got %v", c.RuntimeLagBad)
	}

	t := c.Tiers
	for field, name := range map[string]string{
		"tiers.priority_header":  t.PriorityHeader,
		"tiers.test_mode_header": t.TestModeHeader,
		"tiers.api_key_header":   t.APIKeyHeader,
	} {
		if name != "" && !isToken(name) {
			bad(field, "%q is not a valid header name", name)
		}
	}
	for i, r := range t.Paths {
		field := fmt.Sprintf("tiers.paths[%d]", i)
		if !strings.HasPrefix(r.Prefix, "/") {
			bad(field+".prefix", "must start with '/', got %q", r.Prefix)
		}
		switch {
		case !r.Tier.valid():
			bad(field+".tier", "unknown tier %s", r.Tier)
		case r.Tier == TierCritical && !r.TrustedOnly:
			bad(field+".tier", "critical needs trusted_only: true (prefix:critical:trusted in a setting): any client chooses its path, so an untrusted client could make itself critical and never be shed")
		}
	}
	for i, r := range t.APIKeys {
		field := fmt.Sprintf("tiers.api_keys[%d]", i)
		if r.Prefix == "" {
			bad(field+".prefix", "must not be empty")
		}
		switch {
		case !r.Tier.valid():
			bad(field+".tier", "unknown tier %s", r.Tier)
		case r.Tier == TierCritical:
			bad(field+".tier", "critical is not allowed: an unauthenticated key prefix would let any client skip shedding")
		}
		if r.TrustedOnly {
			bad(field+".trusted_only", "not supported for api_keys (only for paths)")
		}
	}
	for i, m := range t.ReadMethods {
		if !isToken(m) {
			bad(fmt.Sprintf("tiers.read_methods[%d]", i), "%q is not a valid method", m)
		}
	}
	// Map iteration above is unordered; sort so the report is stable.
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}

// isToken reports whether s is an RFC 9110 token (header names, methods).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// jsonDuration spells durations as "28s" on the wire; nanosecond integers
// are unreadable in an operator's config.
type jsonDuration time.Duration

func (d jsonDuration) MarshalText() ([]byte, error) {
	return []byte(time.Duration(d).String()), nil
}

func (d *jsonDuration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = jsonDuration(v)
	return nil
}

// configAlias drops Config's methods so configWire can embed it without
// recursing into MarshalJSON/UnmarshalJSON.
type configAlias Config

// configWire shadows the duration fields (shallower fields win in
// encoding/json) and reuses every other field's tag from Config.
type configWire struct {
	*configAlias
	StartAfter           jsonDuration `json:"start_after"`
	FullAfter            jsonDuration `json:"full_after"`
	Smoothing            jsonDuration `json:"smoothing"`
	ShareWindow          jsonDuration `json:"share_window"`
	QueueTimeout         jsonDuration `json:"queue_timeout"`
	CriticalQueueTimeout jsonDuration `json:"critical_queue_timeout"`
	RuntimeLagBad        jsonDuration `json:"runtime_lag_bad"`
}

func (c *Config) wire() *configWire {
	return &configWire{
		configAlias:          (*configAlias)(c),
		StartAfter:           jsonDuration(c.StartAfter),
		FullAfter:            jsonDuration(c.FullAfter),
		Smoothing:            jsonDuration(c.Smoothing),
		ShareWindow:          jsonDuration(c.ShareWindow),
		QueueTimeout:         jsonDuration(c.QueueTimeout),
		CriticalQueueTimeout: jsonDuration(c.CriticalQueueTimeout),
		RuntimeLagBad:        jsonDuration(c.RuntimeLagBad),
	}
}

// MarshalJSON writes durations as strings.
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(c.wire())
}

// UnmarshalJSON overlays data on c, strictly: an unknown field is an error
// even when c is embedded in a larger, lenient document, because a typo in
// a shedding setting silently leaves the default in force.
func (c *Config) UnmarshalJSON(data []byte) error {
	next := c.Clone()
	w := next.wire()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(w); err != nil {
		return err
	}
	next.StartAfter = time.Duration(w.StartAfter)
	next.FullAfter = time.Duration(w.FullAfter)
	next.Smoothing = time.Duration(w.Smoothing)
	next.ShareWindow = time.Duration(w.ShareWindow)
	next.QueueTimeout = time.Duration(w.QueueTimeout)
	next.CriticalQueueTimeout = time.Duration(w.CriticalQueueTimeout)
	next.RuntimeLagBad = time.Duration(w.RuntimeLagBad)
	*c = next
	return nil
}

// ParseConfig strictly parses a YAML or JSON config over DefaultConfig
// (absent fields keep their default) and validates the result.
func ParseConfig(data []byte) (Config, error) {
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' {
		// YAML, like the rules: read as JSON from here, so both spellings
		// meet the same strict decoder.
		var v any
		if err := yaml.Unmarshal(data, &v); err != nil {
			return Config{}, fmt.Errorf("shedder: parse config: %w", err)
		}
		if v == nil {
			v = map[string]any{}
		}
		js, err := json.Marshal(v)
		if err != nil {
			return Config{}, fmt.Errorf("shedder: parse config: %w", err)
		}
		data = js
	}
	cfg := DefaultConfig()
	// Keys exactly as the fields spell them, each once: encoding/json
	// alone would apply {"ENABLED": false} and the last of two "enabled".
	if err := strictjson.Check(data, &cfg); err != nil {
		return Config{}, fmt.Errorf("shedder: parse config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return Config{}, fmt.Errorf("shedder: parse config: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("shedder: parse config: trailing data after the config object")
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("shedder: parse config: %w", err)
	}
	return cfg, nil
}

// SettingKeys lists the keys ApplySettings accepts, for CLI help.
var SettingKeys = []string{
	"enabled", "good", "bad", "start_after", "full_after", "smoothing",
	"share_window", "queue_timeout", "critical_queue_timeout", "queue_size",
	"tiers.priority_header", "tiers.test_mode_header", "tiers.api_key_header",
	"tiers.paths", "tiers.api_keys", "tiers.read_methods",
	"runtime_lag_bad", "adaptive.enabled", "adaptive.initial_limit",
	"adaptive.min_limit", "adaptive.max_limit", "adaptive.window",
	"adaptive.min_rtt_window", "adaptive.buffer", "adaptive.smoothing",
	"adaptive.shares.test", "adaptive.shares.read", "adaptive.shares.write",
	"adaptive.shares.critical", "host_share.enabled", "host_share.tracked_hosts",
	"host_share.weights", "host_share.default_weight",
	"host_share.queue_timeout", "host_share.max_queued", "host_share.cpu_busy",
	"host_share.unlisted_hosts",
}

// ApplySettings returns cfg with key=value settings applied, as typed by an
// operator (`shedder set good=0.75 start_after=10s`). Lists are
// comma-separated: tiers.paths=/healthcheck:critical:trusted,/internal/synthetic:test
// (":trusted" marks a rule trusted_only)
// and tiers.read_methods=GET,HEAD, host weights as
// host_share.weights=a.example:2,*.big.example:4; an empty value clears a
// list. Every bad
// key or value is reported at once, then the result is validated; on error
// cfg is returned unchanged.
func ApplySettings(cfg Config, kv map[string]string) (Config, error) {
	next := cfg.Clone()
	if err := applyAll(func() *Config { return &next }, kv); err != nil {
		return cfg, err
	}
	if err := next.Validate(); err != nil {
		return cfg, err
	}
	return next, nil
}

// CheckSettings reports every unknown key and unreadable value of kv, without
// validating the result (which depends on the settings they apply to): an
// operator's typo is caught before anything is fetched or stored.
func CheckSettings(kv map[string]string) error {
	return applyAll(func() *Config { c := DefaultConfig(); return &c }, kv)
}

// applyAll applies each setting of kv, in key order, to the config target
// gives for it, and reports every bad key or value.
func applyAll(target func() *Config, kv map[string]string) error {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		if err := applySetting(target(), k, strings.TrimSpace(kv[k])); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, k, err))
		}
	}
	return errors.Join(errs...)
}

func applySetting(c *Config, key, val string) error {
	dur := func(dst *time.Duration) error {
		d, err := time.ParseDuration(val)
		if err != nil {
			return err
		}
		*dst = d
		return nil
	}
	float := func(dst *float64) error {
		f, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return err
		}
		*dst = f
		return nil
	}
	switch key {
	case "enabled":
		b, err := strconv.ParseBool(val)
		if err != nil {
			return err
		}
		c.Enabled = b
	case "good":
		return float(&c.Good)
	case "bad":
		return float(&c.Bad)
	case "start_after":
		return dur(&c.StartAfter)
	case "full_after":
		return dur(&c.FullAfter)
	case "smoothing":
		return dur(&c.Smoothing)
	case "share_window":
		return dur(&c.ShareWindow)
	case "queue_timeout":
		return dur(&c.QueueTimeout)
	case "critical_queue_timeout":
		return dur(&c.CriticalQueueTimeout)
	case "queue_size":
		n, err := strconv.Atoi(val)
		if err != nil {
			return err
		}
		c.QueueSize = n
	case "tiers.priority_header":
		c.Tiers.PriorityHeader = val
	case "tiers.test_mode_header":
		c.Tiers.TestModeHeader = val
	case "tiers.api_key_header":
		c.Tiers.APIKeyHeader = val
	case "tiers.paths":
		rules, err := parseRules(val)
		if err != nil {
			return err
		}
		c.Tiers.Paths = rules
	case "tiers.api_keys":
		rules, err := parseRules(val)
		if err != nil {
			return err
		}
		c.Tiers.APIKeys = rules
	case "tiers.read_methods":
		c.Tiers.ReadMethods = splitList(val)
	case "runtime_lag_bad":
		return dur(&c.RuntimeLagBad)
	case "adaptive.enabled":
		b, err := strconv.ParseBool(val)
		if err != nil {
			return err
		}
		c.Adaptive.Enabled = b
	case "adaptive.initial_limit", "adaptive.min_limit", "adaptive.max_limit":
		n, err := strconv.Atoi(val)
		if err != nil {
			return err
		}
		*map[string]*int{
			"adaptive.initial_limit": &c.Adaptive.InitialLimit,
			"adaptive.min_limit":     &c.Adaptive.MinLimit,
			"adaptive.max_limit":     &c.Adaptive.MaxLimit,
		}[key] = n
	case "adaptive.window":
		return dur(&c.Adaptive.Window)
	case "adaptive.min_rtt_window":
		return dur(&c.Adaptive.MinRTTWindow)
	case "adaptive.buffer":
		return float(&c.Adaptive.Buffer)
	case "adaptive.smoothing":
		return float(&c.Adaptive.Smoothing)
	case "adaptive.shares.test", "adaptive.shares.read", "adaptive.shares.write", "adaptive.shares.critical":
		t, err := ParseTier(strings.TrimPrefix(key, "adaptive.shares."))
		if err != nil {
			return err
		}
		return float(c.Adaptive.Shares.ptr(t))
	case "host_share.enabled":
		b, err := strconv.ParseBool(val)
		if err != nil {
			return err
		}
		c.HostShare.Enabled = b
	case "host_share.tracked_hosts":
		n, err := strconv.Atoi(val)
		if err != nil {
			return err
		}
		c.HostShare.TrackedHosts = n
	case "host_share.weights":
		w, err := parseWeights(val)
		if err != nil {
			return err
		}
		c.HostShare.Weights = w
	case "host_share.queue_timeout":
		return dur(&c.HostShare.QueueTimeout)
	case "host_share.max_queued":
		n, err := strconv.Atoi(val)
		if err != nil {
			return err
		}
		c.HostShare.MaxQueued = n
	case "host_share.cpu_busy":
		f, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return err
		}
		c.HostShare.CPUBusy = f
	case "host_share.unlisted_hosts":
		c.HostShare.UnlistedHosts = val
	case "host_share.default_weight":
		n, err := strconv.Atoi(val)
		if err != nil {
			return err
		}
		c.HostShare.DefaultWeight = n
	default:
		if near := suggest.Nearest(key, SettingKeys); near != "" {
			return fmt.Errorf("unknown setting (did you mean %s?)", near)
		}
		return fmt.Errorf("unknown setting (known: %s)", strings.Join(SettingKeys, ", "))
	}
	return nil
}

func splitList(val string) []string {
	if val == "" {
		return nil
	}
	parts := strings.Split(val, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// parseRules reads "prefix:tier,prefix:tier[:trusted]". The last ':'
// separates the tier (or ":trusted" after it) so prefixes may themselves
// contain colons.
func parseRules(val string) ([]PrefixRule, error) {
	var rules []PrefixRule
	for _, item := range splitList(val) {
		rest, trusted := strings.CutSuffix(item, ":trusted")
		i := strings.LastIndexByte(rest, ':')
		if i < 0 {
			return nil, fmt.Errorf("rule %q: want prefix:tier or prefix:tier:trusted", item)
		}
		tier, err := ParseTier(rest[i+1:])
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", item, err)
		}
		rules = append(rules, PrefixRule{Prefix: rest[:i], Tier: tier, TrustedOnly: trusted})
	}
	return rules, nil
}

// finite guards float inputs that arrive from samplers rather than configs.
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
