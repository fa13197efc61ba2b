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
	_ = d.validate(true) // for its normalization
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
	_ = d.validate(true) // for its normalization
	return canonicalVersion(d, true)
}

// canonicalRule fixes the field set and order that Version hashes: the JSON
// encoding of this struct, as encoding/json writes it, with every string of
// the four lists Go-quoted first (strconv.Quote: path prefixes and query
// names may hold bytes that are not UTF-8, which encoding/json would fold
// into U+FFFD and so make different rules hash alike). appendJSON writes those
// bytes without reflection; TestVersionEncodingLikeJSON holds it to
// encoding/json. Adding a field here changes every version, which is the
// point of a schema bump.
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

// versionOfNormalized is Version of an already normalized document.
func versionOfNormalized(d *Document) string { return canonicalVersion(d, false) }

func canonicalVersion(d *Document, withDisabled bool) string {
	rules := canonicalRules(d, withDisabled)
	h := sha256.New()
	buf := make([]byte, 0, 64<<10)
	buf = append(buf, `{"schema":`...)
	buf = strconv.AppendInt(buf, SchemaVersion, 10)
	buf = append(buf, `,"rules":[`...)
	var scratch []byte
	for i := range rules {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf, scratch = rules[i].appendJSON(buf, scratch)
		if len(buf) > 32<<10 {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	buf = append(buf, ']')
	if d.Behaviour != nil {
		// Only documents with the section hash it: every other
		// version stays as it was.
		bh, _ := json.Marshal(d.Behaviour) // plain values: cannot fail
		buf = append(append(buf, `,"behaviour":`...), bh...)
	}
	buf = append(buf, '}')
	h.Write(buf)
	return hex.EncodeToString(h.Sum(nil))[:versionLen]
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

// appendJSON appends c as encoding/json encodes it (with the list strings
// quoted); scratch is reused for quoting.
func (c *canonicalRule) appendJSON(buf, scratch []byte) ([]byte, []byte) {
	buf = append(buf, `{"id":`...)
	buf = appendJSONString(buf, c.ID)
	for _, l := range []struct {
		name string
		list []string
	}{{`,"hosts":`, c.Hosts}, {`,"path_prefix":`, c.PathPrefix}, {`,"methods":`, c.Methods}, {`,"key":`, c.Key}} {
		buf = append(buf, l.name...)
		if l.list == nil {
			buf = append(buf, "null"...)
			continue
		}
		buf = append(buf, '[')
		for i, v := range l.list {
			if i > 0 {
				buf = append(buf, ',')
			}
			if plainASCII(v) {
				// strconv.Quote leaves v as it is and encoding/json
				// escapes the two quotes it adds.
				buf = append(buf, `"\"`...)
				buf = append(buf, v...)
				buf = append(buf, `\""`...)
				continue
			}
			scratch = strconv.AppendQuote(scratch[:0], v)
			buf = appendJSONString(buf, string(scratch))
		}
		buf = append(buf, ']')
	}
	buf = append(buf, `,"algorithm":`...)
	buf = appendJSONString(buf, c.Algorithm)
	for _, f := range []struct {
		name string
		v    int64
	}{{`,"limit":`, c.Limit}, {`,"window_ns":`, c.WindowNS}, {`,"capacity":`, c.Capacity}, {`,"cost":`, c.Cost}, {`,"min_interval_ns":`, c.MinInterval}} {
		buf = append(buf, f.name...)
		buf = strconv.AppendInt(buf, f.v, 10)
	}
	buf = append(buf, `,"shadow":`...)
	buf = strconv.AppendBool(buf, c.Shadow)
	buf = append(buf, `,"scope":`...)
	buf = appendJSONString(buf, c.Scope)
	if c.Disabled {
		buf = append(buf, `,"disabled":true`...)
	}
	if c.Behaviour {
		buf = append(buf, `,"behaviour":true`...)
	}
	if c.Metrics {
		buf = append(buf, `,"metrics":true`...)
	}
	if c.Escapes != nil {
		e, _ := json.Marshal(c.Escapes) // strings and ints: cannot fail
		buf = append(append(buf, `,"escapes":`...), e...)
	}
	if c.Accuracy != "" {
		buf = append(buf, `,"accuracy":`...)
		buf = appendJSONString(buf, c.Accuracy)
	}
	if c.Tolerance != 0 {
		buf = append(buf, `,"tolerance":`...)
		buf = appendJSONFloat(buf, c.Tolerance)
	}
	return append(buf, '}'), scratch
}

// plainASCII reports whether s is printable ASCII that neither
// strconv.Quote nor encoding/json escapes.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20, c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// appendJSONString appends s as encoding/json encodes a string: printable
// ASCII other than < > & (which it escapes for HTML) needs only " and \
// escaped; anything else is left to encoding/json itself.
func appendJSONString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			enc, err := json.Marshal(s)
			if err != nil {
				panic("rules: encoding a string failed: " + err.Error()) // a string cannot fail
			}
			return append(buf, enc...)
		}
	}
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			buf = append(buf, '\\', c)
		} else {
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}

// appendJSONFloat appends f as encoding/json encodes it; a value JSON
// cannot hold (NaN, ±Inf: only in a document that fails validation) is
// written as a string, so that it still hashes distinctly.
func appendJSONFloat(buf []byte, f float64) []byte {
	enc, err := json.Marshal(f)
	if err != nil {
		return appendJSONString(buf, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return append(buf, enc...)
}
