package rules

import "github.com/edgeguard/edgeguard/pkg/behavior"

// SchemaVersion is the only document version this package understands.
const SchemaVersion = 1

// Document is one rules file: the global document or a regional overlay.
type Document struct {
	Version int    `yaml:"version"`
	Rules   []Rule `yaml:"rules"`
	// Behaviour switches on the behaviour layer (package behaviour owns
	// the section and its validation); nil: off.
	Behaviour *behavior.Settings `yaml:"behaviour,omitempty"`
}

// Rule is one rate-limit rule as written by an operator. Parse and Validate
// normalize it in place (see Validate); CompiledRule is the form the edge uses.
type Rule struct {
	ID        string    `yaml:"id"`
	Match     MatchSpec `yaml:"match,omitempty"`
	Key       []string  `yaml:"key,omitempty"`
	Algorithm Algorithm `yaml:"algorithm,omitempty"`
	Limit     int64     `yaml:"limit,omitempty"`
	Window    Duration  `yaml:"window,omitempty"`
	// Burst is the token_bucket capacity; 0 means "same as Limit".
	Burst int64 `yaml:"burst,omitempty"`
	// Cost is what one request consumes. Parse turns an omitted cost into 1,
	// so an explicit 0 can still be rejected; Go callers building a Rule by
	// hand must set it.
	Cost        int64    `yaml:"cost,omitempty"`
	MinInterval Duration `yaml:"min_interval,omitempty"`
	Shadow      bool     `yaml:"shadow,omitempty"`
	Scope       Scope    `yaml:"scope,omitempty"`
	// Disabled, in a regional document, switches off the global rule with the
	// same ID. A disabled rule is only checked for a valid ID.
	Disabled bool `yaml:"disabled,omitempty"`
	// Behaviour opts the rule into the behaviour layer: its limit follows
	// the client's risk level.
	Behaviour bool `yaml:"behaviour,omitempty"`
	// Metrics gives the rule its own rule label in the edge's metrics;
	// the decisions of the others are counted under rule="_other", so a
	// document of 100,000 rules costs a few series, not 100,000 per metric.
	Metrics bool `yaml:"metrics,omitempty"`
	// Accuracy is exact (the default: every decision asks Redis) or leased:
	// each edge decides locally from an allowance it carves from Redis in
	// batches, so the region admits at most (1 + tolerance) times what the
	// exact rule would per window (fixed_window and token_bucket;
	// docs/guarantees.md).
	Accuracy Accuracy `yaml:"accuracy,omitempty"`
	// Tolerance is a leased rule's bound on over-admission, as a share of
	// the limit (default 0.05 when leased; 0.001 to 0.5).
	Tolerance float64 `yaml:"tolerance,omitempty"`
}

// MatchSpec selects the requests a rule applies to. Every list is optional;
// an empty list matches anything. (It is not called Match because that name
// is the matcher's result type.)
type MatchSpec struct {
	// Hosts are exact host names or "*.example.com" (any subdomain, not the
	// apex itself).
	Hosts []string `yaml:"hosts,omitempty"`
	// PathPrefix entries match on segment boundaries: "/api" matches "/api"
	// and "/api/x" but not "/apix".
	PathPrefix []string `yaml:"path_prefix,omitempty"`
	Methods    []string `yaml:"methods,omitempty"`
}

// Algorithm is an algorithm's name as a document spells it; package limit's
// registry says which names exist (limit.Names) and what they mean.
type Algorithm string

// Scope says where a rule's counters live.
type Scope string

// Accuracy says how exactly a rule is counted.
type Accuracy string

// Known accuracies. Exact is the default (written as nothing).
const (
	AccuracyExact  Accuracy = "exact"
	AccuracyLeased Accuracy = "leased"
	// DefaultTolerance is a leased rule's tolerance when none is given.
	DefaultTolerance = 0.05
)

// Known scopes. Region is the default.
const (
	ScopeRegion Scope = "region"
	ScopePoP    Scope = "pop"
)

// clone returns a deep copy so normalization never touches the caller's data.
func (d *Document) clone() *Document {
	if d == nil {
		return &Document{Version: SchemaVersion}
	}
	out := &Document{Version: d.Version, Rules: make([]Rule, len(d.Rules)), Behaviour: d.Behaviour.Clone()}
	for i, r := range d.Rules {
		out.Rules[i] = r.clone()
	}
	return out
}

func (r Rule) clone() Rule {
	r.Key = cloneStrings(r.Key)
	r.Match.Hosts = cloneStrings(r.Match.Hosts)
	r.Match.PathPrefix = cloneStrings(r.Match.PathPrefix)
	r.Match.Methods = cloneStrings(r.Match.Methods)
	return r
}

func cloneStrings(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s...)
}
