package rules

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"

	"github.com/edgeguard/edgeguard/pkg/behavior"
)

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
// The yaml tags are the one list of its fields: Parse decodes, Marshal
// writes, "rules diff" compares and Version hashes by them (the hash tags
// say how Version writes a field; see version.go).
type Rule struct {
	ID        string    `yaml:"id" hash:"always"`
	Match     MatchSpec `yaml:"match,omitempty" hash:"always,inline"`
	Key       []string  `yaml:"key,omitempty" hash:"always"`
	Algorithm Algorithm `yaml:"algorithm,omitempty" hash:"always"`
	Limit     int64     `yaml:"limit,omitempty" hash:"always"`
	Window    Duration  `yaml:"window,omitempty" hash:"always"`
	// Burst is the token_bucket capacity; 0 means "same as Limit".
	Burst int64 `yaml:"burst,omitempty" hash:"always,capacity"`
	// Cost is what one request consumes. Parse turns an omitted cost into 1,
	// so an explicit 0 can still be rejected; Go callers building a Rule by
	// hand must set it.
	Cost        int64    `yaml:"cost,omitempty" hash:"always"`
	MinInterval Duration `yaml:"min_interval,omitempty" hash:"always"`
	Shadow      bool     `yaml:"shadow,omitempty" hash:"always"`
	Scope       Scope    `yaml:"scope,omitempty" hash:"always"`
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
	// Bypass lists requests the rule never counts nor denies (an operator's
	// allowlist); the edge records them with the decision "bypass".
	Bypass Bypass `yaml:"bypass,omitempty" hash:"escapes"`
	// Overrides give single key values their own limit (and burst), the
	// rule's other parameters kept: a partner's API key, a NATed office.
	// Looking one up costs the same for 10 entries as for 100,000.
	Overrides Overrides `yaml:"overrides,omitempty" hash:"escapes"`
	// LimitHeader names a request header whose value, from a trusted peer
	// only, replaces the limit for that request (a filter in front of the
	// edge that knows the client's plan). From anyone else it is ignored.
	LimitHeader string `yaml:"limit_header,omitempty" hash:"escapes"`
	// Penalty keeps a key that this rule denied denied for this long,
	// however slowly it then sends (a mitigation timeout, a penalty box),
	// in every edge of the region. 0: no penalty.
	Penalty Duration `yaml:"penalty,omitempty" hash:"escapes"`
	// CountIf makes the rule count by the response: only requests whose
	// response matches are counted, after the response, and the next
	// request of a key over the limit is denied (a 401/403 limit against
	// credential stuffing, a 5xx limit to spare a failing origin).
	CountIf CountIf `yaml:"count_if,omitempty" hash:"escapes"`
	// CostHeader names an origin response header that says what the
	// request cost (a query's complexity); the rule then counts after the
	// response. Missing: the rule's cost.
	CostHeader string `yaml:"cost_header,omitempty" hash:"escapes"`
	// MaxCost bounds what cost_header may charge one request (default: the
	// rule's limit, or its burst for a bucket); a larger value is charged
	// max_cost and counted as an error.
	MaxCost int64 `yaml:"max_cost,omitempty" hash:"escapes"`
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

// CountIf selects the responses a rule counts. Both lists optional; a
// response matching either is counted.
type CountIf struct {
	// Status lists codes ("401") and classes ("5xx").
	Status []string `yaml:"status,omitempty" json:"status,omitempty"`
	// Header counts responses that carry this header (whatever its value).
	Header string `yaml:"header,omitempty" json:"header,omitempty"`
}

// Bypass selects requests a rule leaves alone. Each list is optional and
// any one entry that matches is enough.
type Bypass struct {
	// CIDRs are client networks ("192.0.2.0/24", "2001:db8::/32") or single
	// addresses; the client is the one the trust model names.
	CIDRs []string `yaml:"cidrs,omitempty" json:"cidrs,omitempty"`
	// Hosts are exact host names or "*.example.com", as in match.hosts.
	Hosts []string `yaml:"hosts,omitempty" json:"hosts,omitempty"`
	// PathPrefix entries match on segment boundaries, as in match.path_prefix.
	PathPrefix []string `yaml:"path_prefix,omitempty" json:"path_prefix,omitempty"`
	// APIKeyHeader names the header whose value is hashed (SHA-256) and
	// compared with api_key_sha256.
	APIKeyHeader string `yaml:"api_key_header,omitempty" json:"api_key_header,omitempty"`
	// APIKeySHA256 are the SHA-256 digests (64 hex digits) of the API keys
	// that bypass: the document holds hashes only, never a key.
	APIKeySHA256 []string `yaml:"api_key_sha256,omitempty" json:"api_key_sha256,omitempty"`
}

// Override is one key value's own limit. Key lists one value per
// descriptor of the rule's key, in the same order ("192.0.2.7" for ip, the
// header's value for header:X-User), written as the request sends it.
type Override struct {
	// Key is the key's values, one per descriptor of the rule's key.
	Key []string `yaml:"key"`
	// Limit is this key's limit (the rule's window and algorithm kept).
	Limit int64 `yaml:"limit"`
	// Burst is the token_bucket capacity for this key; 0: same as Limit.
	Burst int64 `yaml:"burst,omitempty"`
}

// Overrides is a rule's list of overrides.
type Overrides []Override

// String is the list for "rules diff": a long list is summarized by its
// length and a digest of its entries (in any order), so two lists that
// differ never print alike.
func (o Overrides) String() string {
	parts := make([]string, len(o))
	for i, x := range o {
		parts[i] = fmt.Sprintf("%q=%d", x.Key, x.Limit)
		if x.Burst != 0 {
			parts[i] += fmt.Sprintf("/%d", x.Burst)
		}
	}
	if len(o) <= 3 {
		return "[" + strings.Join(parts, "; ") + "]"
	}
	slices.Sort(parts)
	sum := sha256.Sum256([]byte(strings.Join(parts, "\n")))
	return fmt.Sprintf("[%d overrides, digest %x]", len(o), sum[:6])
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

// Known scopes. Region is the default. A global rule counts one quota
// across every region: each key has a home region whose Redis holds its
// count, and the other regions lease allowances from it in batches
// (docs/guarantees.md, "Global rules"); it is leased by nature.
const (
	ScopeRegion Scope = "region"
	ScopePoP    Scope = "pop"
	ScopeGlobal Scope = "global"
)
