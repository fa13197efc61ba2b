package rules

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/behavior"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// CompiledRule is a validated, normalized rule ready for the limiter. The
// exported fields describe it (for the limiter and /debug/rules); the
// unexported ones are precomputed for Match. A *CompiledRule returned by
// Match points into its Snapshot and must not be modified.
type CompiledRule struct {
	ID        string
	Algorithm limit.Algorithm
	Limit     int64
	Window    time.Duration
	// Burst is the effective capacity of a bucket algorithm (limit.Spec's
	// Burst): the configured burst, or Limit when burst was 0. It is 0 for
	// every other algorithm.
	Burst       int64
	Cost        int64
	MinInterval time.Duration
	Shadow      bool
	Scope       Scope
	// Behaviour: the rule opted into the behaviour layer.
	Behaviour bool
	// Metrics: the rule has its own rule label in metrics.
	Metrics bool
	// Tolerance > 0: the rule is leased (accuracy: leased) with this
	// tolerance; 0: exact.
	Tolerance float64
	// Key, Hosts, PathPrefixes and Methods are the normalized match and key
	// definitions, for display.
	Key          []string
	Hosts        []string
	PathPrefixes []string
	Methods      []string
	// Bypass is the normalized bypass section, for display.
	Bypass Bypass
	// Overrides is how many key values have their own limit.
	Overrides int
	// LimitHeader is the header a trusted peer may set the limit by ("": none).
	LimitHeader string
	// Penalty is how long a key this rule denied stays denied (0: none).
	Penalty time.Duration
	// CountIf and CostHeader: the rule counts after the response.
	CountIf    CountIf
	CostHeader string

	keyPrefix string              // "<id>:"
	bypass    *bypassSet          // nil: nothing bypasses
	overrides map[string]override // by Match.Key
	response  *responseMatch      // nil: counts before the request

	exactHosts  []string
	hostSuffix  []string // ".example.com" for "*.example.com"
	prefixes    []string // nil when "/" is among them: any path
	methods     []string
	descriptors []descriptor
}

// MarshalJSON renders durations as strings for /debug/rules.
func (r CompiledRule) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID           string          `json:"id"`
		Algorithm    limit.Algorithm `json:"algorithm"`
		Limit        int64           `json:"limit"`
		Window       string          `json:"window"`
		Burst        int64           `json:"burst,omitempty"`
		Cost         int64           `json:"cost"`
		MinInterval  string          `json:"min_interval,omitempty"`
		Shadow       bool            `json:"shadow"`
		Scope        Scope           `json:"scope"`
		Behaviour    bool            `json:"behaviour,omitempty"`
		Metrics      bool            `json:"metrics,omitempty"`
		Tolerance    float64         `json:"tolerance,omitempty"`
		Key          []string        `json:"key"`
		Hosts        []string        `json:"hosts,omitempty"`
		PathPrefixes []string        `json:"path_prefix,omitempty"`
		Methods      []string        `json:"methods,omitempty"`
		Bypass       *Bypass         `json:"bypass,omitempty"`
		Overrides    int             `json:"overrides,omitempty"`
		LimitHeader  string          `json:"limit_header,omitempty"`
		Penalty      string          `json:"penalty,omitempty"`
		CountIf      *CountIf        `json:"count_if,omitempty"`
		CostHeader   string          `json:"cost_header,omitempty"`
	}{
		ID: r.ID, Algorithm: r.Algorithm, Limit: r.Limit, Window: r.Window.String(),
		Burst: r.Burst, Cost: r.Cost, MinInterval: durationOrEmpty(r.MinInterval),
		Shadow: r.Shadow, Scope: r.Scope, Behaviour: r.Behaviour, Metrics: r.Metrics, Tolerance: r.Tolerance, Key: r.Key,
		Hosts: r.Hosts, PathPrefixes: r.PathPrefixes, Methods: r.Methods,
		Bypass: bypassOrNil(r.Bypass), Overrides: r.Overrides, LimitHeader: r.LimitHeader, Penalty: durationOrEmpty(r.Penalty),
		CountIf: countIfOrNil(r.CountIf), CostHeader: r.CostHeader,
	})
}

func durationOrEmpty(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// Snapshot is a compiled rule set. It is never modified after Compile, so one
// Snapshot may be shared by any number of goroutines; reloads build a new one
// and swap a pointer.
type Snapshot struct {
	version  string
	rules    []CompiledRule
	v6Prefix int
	salt     []byte
	index    *ruleIndex // nil: Match scans every rule
	bh       *behavior.Settings
}

// CompileOption tunes Compile.
type CompileOption func(*compileConfig)

type compileConfig struct {
	v6Prefix int
	salt     []byte
}

// WithIPv6Prefix sets how many leading bits of an IPv6 client address the
// "ip" descriptor keeps (default DefaultIPv6Prefix, i.e. /64).
func WithIPv6Prefix(bits int) CompileOption {
	return func(c *compileConfig) { c.v6Prefix = bits }
}

// WithKeySalt mixes a secret into every key hash. Without it an IPv4 key can
// be reversed by hashing all 2^32 addresses; with it, keys reveal nothing to
// someone reading Redis. Every edge sharing a Redis must use the same salt,
// and changing it resets all counters.
func WithKeySalt(salt []byte) CompileOption {
	return func(c *compileConfig) { c.salt = append([]byte(nil), salt...) }
}

// Compile validates doc (on a copy; doc is not modified) and builds a
// Snapshot. Disabled rules are left out; the others keep document order,
// which is id order for the output of Merge.
func Compile(doc *Document, opts ...CompileOption) (*Snapshot, error) {
	cfg := compileConfig{v6Prefix: DefaultIPv6Prefix}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.v6Prefix < 1 || cfg.v6Prefix > 128 {
		return nil, fmt.Errorf("rules: compile: IPv6 prefix must be 1-128 bits (got %d)", cfg.v6Prefix)
	}
	if doc == nil {
		return nil, fmt.Errorf("rules: compile: nil document")
	}
	d := doc.clone()
	if err := d.validate(true); err != nil {
		return nil, fmt.Errorf("rules: compile: invalid document:\n%w", err)
	}
	s := &Snapshot{
		version:  versionOfNormalized(d),
		rules:    make([]CompiledRule, 0, len(d.Rules)),
		v6Prefix: cfg.v6Prefix,
		salt:     cfg.salt,
		bh:       d.Behaviour,
	}
	var withOverrides [][2]int // compiled rule, document rule
	for i := range d.Rules {
		if r := &d.Rules[i]; !r.Disabled {
			if len(r.Overrides) > 0 {
				withOverrides = append(withOverrides, [2]int{len(s.rules), i})
			}
			s.rules = append(s.rules, compileRule(r))
		}
	}
	for _, at := range withOverrides {
		c := &s.rules[at[0]]
		c.overrides = s.compileOverrides(c, d.Rules[at[1]].Overrides)
	}
	s.index = newRuleIndex(s.rules)
	return s, nil
}

// compileRule assumes r has been validated and normalized. r belongs to
// Compile's own copy of the document, dropped once compiled, so the compiled
// rule keeps r's lists instead of copying them: a compiled rule is read-only
// (Snapshot.Rules hands out copies).
func compileRule(r *Rule) CompiledRule {
	l := r.limit()
	c := CompiledRule{
		ID:           r.ID,
		Algorithm:    l.Algorithm,
		Limit:        r.Limit,
		Window:       r.Window.D(),
		Cost:         r.Cost,
		MinInterval:  r.MinInterval.D(),
		Shadow:       r.Shadow,
		Scope:        r.Scope,
		Behaviour:    r.Behaviour,
		Metrics:      r.Metrics,
		Tolerance:    r.Tolerance,
		Key:          nilIfEmpty(r.Key),
		Hosts:        nilIfEmpty(r.Match.Hosts),
		PathPrefixes: nilIfEmpty(r.Match.PathPrefix),
		Methods:      nilIfEmpty(r.Match.Methods),
		keyPrefix:    r.ID + ":",
		methods:      nilIfEmpty(r.Match.Methods),
		exactHosts:   nilIfEmpty(r.Match.Hosts),
		Bypass:       r.Bypass,
		Overrides:    len(r.Overrides),
		LimitHeader:  r.LimitHeader,
		Penalty:      r.Penalty.D(),
		bypass:       compileBypass(&r.Bypass),
		CountIf:      r.CountIf,
		CostHeader:   r.CostHeader,
	}
	if l.Algorithm.Spec().Burst {
		c.Burst = l.Capacity()
	}
	c.response = compileResponse(r, l.Capacity())
	if slices.ContainsFunc(r.Match.Hosts, func(h string) bool { return strings.HasPrefix(h, "*") }) {
		c.exactHosts = nil
		for _, h := range r.Match.Hosts {
			if suffix, ok := strings.CutPrefix(h, "*"); ok {
				c.hostSuffix = append(c.hostSuffix, suffix)
			} else {
				c.exactHosts = append(c.exactHosts, h)
			}
		}
	}
	if !slices.Contains(r.Match.PathPrefix, "/") {
		c.prefixes = nilIfEmpty(r.Match.PathPrefix)
	}
	if len(r.Key) > 0 {
		c.descriptors = make([]descriptor, len(r.Key))
		for i, k := range r.Key {
			c.descriptors[i], _ = parseDescriptor(k) // validated already
		}
	}
	return c
}

// nilIfEmpty is s, or nil when it is empty (what copying it gave).
func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// Version is the content version of the compiled rule set; see Version.
func (s *Snapshot) Version() string {
	if s == nil {
		return Version(nil)
	}
	return s.version
}

// Behaviour is the validated behaviour section (defaults filled in), nil
// when the rules have none. It must not be modified.
func (s *Snapshot) Behaviour() *behavior.Settings {
	if s == nil {
		return nil
	}
	return s.bh
}

// IPv6Prefix is the prefix length the "ip" descriptor groups IPv6 clients by.
func (s *Snapshot) IPv6Prefix() int {
	if s == nil {
		return DefaultIPv6Prefix
	}
	return s.v6Prefix
}

// Rules returns a deep copy of the compiled rules, for display.
func (s *Snapshot) Rules() []CompiledRule {
	if s == nil {
		return nil
	}
	out := make([]CompiledRule, len(s.rules))
	for i, r := range s.rules {
		r.Key = cloneStrings(r.Key)
		r.Hosts = cloneStrings(r.Hosts)
		r.PathPrefixes = cloneStrings(r.PathPrefixes)
		r.Methods = cloneStrings(r.Methods)
		r.Bypass = r.Bypass.clone()
		r.CountIf.Status = cloneStrings(r.CountIf.Status)
		out[i] = r
	}
	return out
}
