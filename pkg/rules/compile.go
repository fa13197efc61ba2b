package rules

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/pkg/behavior"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// CompiledRule is a validated, normalized rule ready for the limiter. The
// exported fields describe it (for the limiter and /debug/rules, named as
// the Rule fields of the same Go name; see MarshalJSON); the
// unexported ones are precomputed for Match. A *CompiledRule returned by
// Match points into its Snapshot and must not be modified.
type CompiledRule struct {
	ID        string          `debug:"always"`
	Algorithm limit.Algorithm `debug:"always"`
	Limit     int64           `debug:"always"`
	Window    time.Duration   `debug:"always"`
	// Burst is the effective capacity of a bucket algorithm (limit.Spec's
	// Burst): the configured burst, or Limit when burst was 0. It is 0 for
	// every other algorithm.
	Burst       int64
	Cost        int64 `debug:"always"`
	MinInterval time.Duration
	Shadow      bool  `debug:"always"`
	Scope       Scope `debug:"always"`
	// Behaviour: the rule opted into the behaviour layer.
	Behaviour bool
	// Metrics: the rule has its own rule label in metrics.
	Metrics bool
	// Tolerance > 0: the rule is leased (accuracy: leased) with this
	// tolerance; 0: exact.
	Tolerance float64
	// Key, Hosts, PathPrefix and Methods are the normalized match and key
	// definitions, for display.
	Key        []string `debug:"always"`
	Hosts      []string
	PathPrefix []string
	Methods    []string
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

// MarshalJSON renders the rule for /debug/rules: its exported fields in
// order, each under the yaml name of the Rule field of the same Go name
// (for Hosts, PathPrefix and Methods, of the inline match section),
// durations as strings, sections as objects of their yaml fields; a field
// is left out when empty unless tagged debug:"always".
func (r CompiledRule) MarshalJSON() ([]byte, error) {
	v := reflect.ValueOf(r)
	b := []byte{'{'}
	for _, f := range debugFields() {
		fv := v.Field(f.index)
		if !f.always && empty(fv) {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = appendJSONString(b, f.name)
		b = append(b, ':')
		var err error
		if b, err = appendDebugValue(b, fv); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

type debugField struct {
	name   string
	index  int
	always bool
}

// debugFields are the exported fields of CompiledRule with their yaml
// names, from the rule field table.
var debugFields = sync.OnceValue(func() []debugField {
	names := map[string]string{} // Go name -> yaml name
	for _, f := range fieldsOf(ruleType).list {
		sf := ruleType.Field(f.index)
		names[sf.Name] = f.name
		if slices.Contains(strings.Split(sf.Tag.Get("hash"), ","), "inline") {
			for _, g := range fieldsOf(sf.Type).list {
				names[sf.Type.Field(g.index).Name] = g.name
			}
		}
	}
	t := reflect.TypeFor[CompiledRule]()
	var out []debugField
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, ok := names[sf.Name]
		if !ok {
			panic("rules: CompiledRule." + sf.Name + " has no Rule field of that name")
		}
		out = append(out, debugField{name: name, index: i, always: sf.Tag.Get("debug") == "always"})
	}
	return out
})

var timeDurationType = reflect.TypeFor[time.Duration]()

func appendDebugValue(b []byte, v reflect.Value) ([]byte, error) {
	switch {
	case v.Type() == timeDurationType:
		return appendJSONString(b, time.Duration(v.Int()).String()), nil
	case v.Kind() == reflect.Struct: // a section
		b = append(b, '{')
		first := true
		for _, g := range fieldsOf(v.Type()).list {
			gv := v.Field(g.index)
			if empty(gv) && strings.Contains(v.Type().Field(g.index).Tag.Get("yaml"), "omitempty") {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendJSONString(b, g.name)
			b = append(b, ':')
			var err error
			if b, err = appendDebugValue(b, gv); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	enc, err := json.Marshal(v.Interface())
	return append(b, enc...), err
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
	keys     *keyCache // the keys made last (keycache.go)
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
	cfg, err := compileOptions(opts)
	if err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, fmt.Errorf("rules: compile: nil document")
	}
	d := doc.clone()
	if err := d.validate(true); err != nil {
		return nil, fmt.Errorf("rules: compile: invalid document:\n%w", err)
	}
	return compile(d, cfg), nil
}

// Load is Parse and then Compile, without the copy Compile validates: the
// document Parse returns is validated and normalized already, and no one
// else holds it. A reload of a large document costs that much less.
func Load(data []byte, opts ...CompileOption) (*Snapshot, error) {
	doc, err := Parse(data)
	if err != nil {
		return nil, err
	}
	cfg, err := compileOptions(opts)
	if err != nil {
		return nil, err
	}
	return compile(doc, cfg), nil
}

func compileOptions(opts []CompileOption) (compileConfig, error) {
	cfg := compileConfig{v6Prefix: DefaultIPv6Prefix}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.v6Prefix < 1 || cfg.v6Prefix > 128 {
		return cfg, fmt.Errorf("rules: compile: IPv6 prefix must be 1-128 bits (got %d)", cfg.v6Prefix)
	}
	return cfg, nil
}

// compile builds the Snapshot of d, a validated and normalized document
// that is Compile's own: the compiled rules keep its lists.
func compile(d *Document, cfg compileConfig) *Snapshot {
	s := &Snapshot{
		version:  versionOfNormalized(d),
		rules:    make([]CompiledRule, 0, len(d.Rules)),
		v6Prefix: cfg.v6Prefix,
		salt:     cfg.salt,
		bh:       d.Behaviour,
		keys:     newKeyCache(),
	}
	var withOverrides [][2]int // compiled rule, document rule
	for i := range d.Rules {
		if r := &d.Rules[i]; !r.Disabled {
			if len(r.Overrides) > 0 {
				withOverrides = append(withOverrides, [2]int{len(s.rules), i})
			}
			s.rules = s.rules[:len(s.rules)+1] // compiled in place: a rule is large
			compileRule(&s.rules[len(s.rules)-1], r)
		}
	}
	for _, at := range withOverrides {
		c := &s.rules[at[0]]
		c.overrides = s.compileOverrides(c, d.Rules[at[1]].Overrides)
	}
	s.index = newRuleIndex(s.rules)
	return s
}

// compileRule assumes r has been validated and normalized. r belongs to
// Compile's own document, dropped once compiled, so the compiled
// rule keeps r's lists instead of copying them: a compiled rule is read-only
// (Snapshot.Rules hands out copies).
func compileRule(c *CompiledRule, r *Rule) {
	l := r.limit()
	*c = CompiledRule{
		ID:          r.ID,
		Algorithm:   l.Algorithm,
		Limit:       r.Limit,
		Window:      r.Window.D(),
		Cost:        r.Cost,
		MinInterval: r.MinInterval.D(),
		Shadow:      r.Shadow,
		Scope:       r.Scope,
		Behaviour:   r.Behaviour,
		Metrics:     r.Metrics,
		Tolerance:   r.Tolerance,
		Key:         nilIfEmpty(r.Key),
		Hosts:       nilIfEmpty(r.Match.Hosts),
		PathPrefix:  nilIfEmpty(r.Match.PathPrefix),
		Methods:     nilIfEmpty(r.Match.Methods),
		keyPrefix:   r.ID + ":",
		methods:     nilIfEmpty(r.Match.Methods),
		exactHosts:  nilIfEmpty(r.Match.Hosts),
		Bypass:      r.Bypass,
		Overrides:   len(r.Overrides),
		LimitHeader: r.LimitHeader,
		Penalty:     r.Penalty.D(),
		bypass:      compileBypass(&r.Bypass),
		CountIf:     r.CountIf,
		CostHeader:  r.CostHeader,
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
	deepCopy(out, s.rules)
	return out
}
