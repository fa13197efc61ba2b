package rules

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
)

// versionLen is how many hex characters of the digest Version keeps: enough
// to tell rule sets apart in logs and /debug, short enough to read.
const versionLen = 12

// Version is a content hash of the active rules in doc: 12 hex characters of
// SHA-256 over a canonical JSON encoding of the normalized rules, sorted by
// id, with disabled rules left out. It depends only on meaning, not on YAML
// formatting, field order, rule order, list order of hosts/methods/prefixes,
// or spellings that normalize alike (e.g. "get" and "GET", burst 0 and
// burst == limit). Key descriptor order counts, as it changes the keys.
// The edge and the CLI both call this (the edge via Snapshot.Version) on the
// output of Merge, so their versions agree. doc is not modified; an invalid
// document still gets a version, but it is only meaningful for valid ones.
func Version(doc *Document) string {
	d := doc.clone()
	_ = d.Validate() // for its normalization
	return versionOfNormalized(d)
}

// DocumentVersion identifies doc as written, where Version identifies what it
// does on its own: it is Version with the disabled rules counted too (each
// by its id alone, the only field a disabled rule has). So a regional
// document switching off "per-ip", one switching off "burst" and an empty
// document, which all run no rules (one Version), have three document
// versions, and history and "rollback --to" can tell them apart. For a
// document without disabled rules the two are equal. Like Version, it does
// not depend on formatting, field, rule or list order.
func DocumentVersion(doc *Document) string {
	d := doc.clone()
	_ = d.Validate() // for its normalization
	return canonicalVersion(d, true)
}

// canonicalRule fixes the field set and order that Version hashes. Adding a
// field here changes every version, which is the point of a schema bump.
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
}

// versionOfNormalized is Version of an already normalized document.
func versionOfNormalized(d *Document) string { return canonicalVersion(d, false) }

func canonicalVersion(d *Document, withDisabled bool) string {
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
			Hosts:       quoteAll(r.Match.Hosts),
			PathPrefix:  quoteAll(r.Match.PathPrefix),
			Methods:     quoteAll(r.Match.Methods),
			Key:         quoteAll(r.Key),
			Algorithm:   string(r.Algorithm),
			Limit:       r.Limit,
			WindowNS:    int64(r.Window),
			Cost:        r.Cost,
			MinInterval: int64(r.MinInterval),
			Shadow:      r.Shadow,
			Scope:       string(r.Scope),
		}
		if l := r.limit(); l.Algorithm.Valid() && l.Algorithm.Spec().Burst {
			c.Capacity = l.Capacity()
		} else {
			c.Capacity = r.Burst // 0 when valid; kept so invalid input still hashes distinctly
		}
		rules = append(rules, c)
	}
	slices.SortStableFunc(rules, func(a, b canonicalRule) int { return cmp.Compare(a.ID, b.ID) })
	data, err := json.Marshal(struct {
		Schema int             `json:"schema"`
		Rules  []canonicalRule `json:"rules"`
	}{SchemaVersion, rules})
	if err != nil {
		panic("rules: canonical encoding failed: " + err.Error()) // plain strings and ints cannot fail
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:versionLen]
}

// quoteAll Go-quotes each string: path prefixes and query names may hold
// bytes that are not UTF-8, which encoding/json would fold into U+FFFD and so
// make different rules hash alike.
func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(v)
	}
	return out
}
