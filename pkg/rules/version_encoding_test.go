package rules

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// canonicalRule spells out the field set and order that Version hashes:
// the JSON encoding of this struct, as encoding/json writes it, with every
// string of the four lists Go-quoted first. Version writes the same bytes
// from the rule field table; TestVersionEncodingLikeJSON holds the two
// together.
type canonicalRule struct {
	ID          string   `json:"id"`
	Hosts       []string `json:"hosts"`
	PathPrefix  []string `json:"path_prefix"`
	Methods     []string `json:"methods"`
	Key         []string `json:"key"`
	Algorithm   string   `json:"algorithm"`
	Limit       int64    `json:"limit"`
	WindowNS    int64    `json:"window_ns"`
	Capacity    int64    `json:"capacity"`
	Cost        int64    `json:"cost"`
	MinInterval int64    `json:"min_interval_ns"`
	Shadow      bool     `json:"shadow"`
	Scope       string   `json:"scope"`
	// Disabled is only ever set by DocumentVersion; omitempty keeps the
	// encoding of active rules, and so every Version, as it was.
	Disabled bool `json:"disabled,omitempty"`
	// Behaviour (opted in), likewise only written when set.
	Behaviour bool `json:"behaviour,omitempty"`
	// Metrics (its own rule label), likewise.
	Metrics bool `json:"metrics,omitempty"`
	// Escapes (bypass, overrides, limit header, penalty), likewise.
	Escapes *canonicalEscapes `json:"escapes,omitempty"`
	// Accuracy and Tolerance, likewise only written for a leased rule.
	Accuracy  string  `json:"accuracy,omitempty"`
	Tolerance float64 `json:"tolerance,omitempty"`
}

// canonicalEscapes are a rule's escapes as Version hashes them: lists
// sorted, strings Go-quoted like the other lists, overrides by key.
type canonicalEscapes struct {
	Bypass      Bypass              `json:"bypass"`
	Overrides   []canonicalOverride `json:"overrides"`
	LimitHeader string              `json:"limit_header"`
	PenaltyNS   int64               `json:"penalty_ns"`
	CountIf     CountIf             `json:"count_if"`
	CostHeader  string              `json:"cost_header"`
	MaxCost     int64               `json:"max_cost"`
}

type canonicalOverride struct {
	Key   []string `json:"key"`
	Limit int64    `json:"limit"`
	Burst int64    `json:"burst"`
}

// escapesOf is r's canonicalEscapes, nil when it has none (its version
// is then what it was before escapes existed).
func escapesOf(r *Rule) *canonicalEscapes {
	if r.Bypass.empty() && r.Bypass.APIKeyHeader == "" && len(r.Overrides) == 0 && r.LimitHeader == "" && r.Penalty == 0 &&
		!r.AfterResponse() && r.MaxCost == 0 {
		return nil
	}
	quote := func(l []string) []string {
		out := make([]string, len(l))
		for i, v := range l {
			out[i] = strconv.Quote(v)
		}
		slices.Sort(out)
		return out
	}
	e := &canonicalEscapes{
		Bypass: Bypass{
			CIDRs: quote(r.Bypass.CIDRs), Hosts: quote(r.Bypass.Hosts), PathPrefix: quote(r.Bypass.PathPrefix),
			APIKeyHeader: strconv.Quote(r.Bypass.APIKeyHeader), APIKeySHA256: quote(r.Bypass.APIKeySHA256),
		},
		Overrides:   make([]canonicalOverride, len(r.Overrides)),
		LimitHeader: strconv.Quote(r.LimitHeader),
		PenaltyNS:   int64(r.Penalty),
		CountIf:     CountIf{Status: quote(r.CountIf.Status), Header: strconv.Quote(r.CountIf.Header)},
		CostHeader:  strconv.Quote(r.CostHeader),
		MaxCost:     r.MaxCost,
	}
	for i, o := range r.Overrides {
		key := make([]string, len(o.Key))
		for j, v := range o.Key {
			key[j] = strconv.Quote(v)
		}
		e.Overrides[i] = canonicalOverride{Key: key, Limit: o.Limit, Burst: o.Burst}
	}
	slices.SortFunc(e.Overrides, func(a, b canonicalOverride) int {
		return cmp.Or(slices.Compare(a.Key, b.Key), cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Burst, b.Burst))
	})
	return e
}

// canonicalRules are the rules Version hashes, sorted by id (stable, so an
// invalid document with a repeated id still hashes one way). The lists hold
// the strings as written in the document; they are quoted as encoded.
func canonicalRules(d *Document, withDisabled bool) []canonicalRule {
	rules := make([]canonicalRule, 0, len(d.Rules))
	for _, r := range d.Rules {
		if r.Disabled {
			if withDisabled {
				rules = append(rules, canonicalRule{ID: r.ID, Disabled: true})
			}
			continue
		}
		c := canonicalRule{
			ID:          r.ID,
			Hosts:       nonNil(r.Match.Hosts),
			PathPrefix:  nonNil(r.Match.PathPrefix),
			Methods:     nonNil(r.Match.Methods),
			Key:         nonNil(r.Key),
			Algorithm:   string(r.Algorithm),
			Limit:       r.Limit,
			WindowNS:    int64(r.Window),
			Cost:        r.Cost,
			MinInterval: int64(r.MinInterval),
			Shadow:      r.Shadow,
			Scope:       string(r.Scope),
			Behaviour:   r.Behaviour,
			Metrics:     r.Metrics,
			Escapes:     escapesOf(&r),
			Accuracy:    string(r.Accuracy),
			Tolerance:   r.Tolerance,
		}
		if l := r.limit(); l.Algorithm.Valid() && l.Algorithm.Spec().Burst {
			c.Capacity = l.Capacity()
		} else {
			c.Capacity = r.Burst // 0 when valid; kept so invalid input still hashes distinctly
		}
		rules = append(rules, c)
	}
	if !slices.IsSortedFunc(rules, func(a, b canonicalRule) int { return cmp.Compare(a.ID, b.ID) }) {
		// Sort positions, not the structs: far fewer bytes to move.
		order := make([]int32, len(rules))
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(rules[a].ID, rules[b].ID) })
		sorted := make([]canonicalRule, len(rules))
		for i, j := range order {
			sorted[i] = rules[j]
		}
		rules = sorted
	}
	return rules
}

// nonNil is s, or an empty list for nil: active rules encode their lists
// as arrays, never null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// versionByJSON is Version's definition: encoding/json over canonicalRule
// with the list strings Go-quoted. canonicalVersion must give the same.
func versionByJSON(d *Document, withDisabled bool) string {
	quote := func(s []string) []string {
		out := make([]string, len(s))
		for i, v := range s {
			out[i] = strconv.Quote(v)
		}
		return out
	}
	rules := canonicalRules(d, withDisabled)
	for i := range rules {
		r := &rules[i]
		if !r.Disabled {
			r.Hosts, r.PathPrefix, r.Methods, r.Key = quote(r.Hosts), quote(r.PathPrefix), quote(r.Methods), quote(r.Key)
		}
	}
	slices.SortStableFunc(rules, func(a, b canonicalRule) int { return cmp.Compare(a.ID, b.ID) })
	data, err := json.Marshal(struct {
		Schema int             `json:"schema"`
		Rules  []canonicalRule `json:"rules"`
	}{SchemaVersion, rules})
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:versionLen]
}

// The hand-written encoding hashes exactly what encoding/json writes, for
// any strings (escapes, HTML characters, non-UTF-8 bytes, U+2028), any
// numbers, repeated ids and disabled rules.
func TestVersionEncodingLikeJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	alphabet := []string{"a", "Z", "0", ".", "-", "/", "*", "\"", "\\", "<", ">", "&", "\x00", "\n", "\t", "\x7f", "\xff", "é", "\u2028", "€", " ", "%2F", ":"}
	str := func() string {
		var s string
		for range rng.IntN(6) {
			s += alphabet[rng.IntN(len(alphabet))]
		}
		return s
	}
	list := func() []string {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		out := make([]string, 1+rng.IntN(3))
		for i := range out {
			out[i] = str()
		}
		return out
	}
	for i := range 300 {
		d := &Document{Version: SchemaVersion}
		for range rng.IntN(12) {
			d.Rules = append(d.Rules, Rule{
				ID:          []string{"a", "b", "c", str()}[rng.IntN(4)],
				Match:       MatchSpec{Hosts: list(), PathPrefix: list(), Methods: list()},
				Key:         list(),
				Algorithm:   Algorithm([]string{"token_bucket", "sliding_log", "fixed_window", str()}[rng.IntN(4)]),
				Limit:       rng.Int64N(1000) - 10,
				Window:      Duration(rng.Int64()),
				Burst:       rng.Int64N(50) - 5,
				Cost:        rng.Int64N(4),
				MinInterval: Duration(rng.Int64N(1e9)),
				Shadow:      rng.IntN(2) == 0,
				Scope:       Scope(str()),
				Disabled:    rng.IntN(5) == 0,
			})
			if rng.IntN(2) == 0 { // the fields hashed only when set
				r := &d.Rules[len(d.Rules)-1]
				r.Behaviour, r.Metrics = rng.IntN(2) == 0, rng.IntN(2) == 0
				r.Accuracy, r.Tolerance = Accuracy([]string{"", "leased", str()}[rng.IntN(3)]), []float64{0, 0.05, rng.Float64()}[rng.IntN(3)]
				r.Bypass = Bypass{CIDRs: list(), Hosts: list(), PathPrefix: list(), APIKeyHeader: []string{"", str()}[rng.IntN(2)], APIKeySHA256: list()}
				for range rng.IntN(3) {
					r.Overrides = append(r.Overrides, Override{Key: list(), Limit: rng.Int64N(3), Burst: rng.Int64N(2)})
				}
				r.LimitHeader, r.CostHeader = []string{"", str()}[rng.IntN(2)], []string{"", str()}[rng.IntN(2)]
				r.Penalty, r.MaxCost = Duration(rng.Int64N(3)), rng.Int64N(3)
				r.CountIf = CountIf{Status: list(), Header: []string{"", str()}[rng.IntN(2)]}
			}
		}
		for _, withDisabled := range []bool{false, true} {
			require.Equal(t, versionByJSON(d, withDisabled), canonicalVersion(d, withDisabled), "document %d, disabled %t: %+v", i, withDisabled, d)
		}
	}
	// And the documents the other tests use, normalized as Version sees them.
	for _, src := range []string{versionBase, fullRule, benchRules, matchRules, string(hostRulesYAML(30))} {
		d := mustParse(t, src)
		require.Equal(t, versionByJSON(d, false), Version(d))
		require.Equal(t, versionByJSON(d, true), DocumentVersion(d))
	}
}
