package rules

import (
	"time"

	"go.yaml.in/yaml/v3"
)

// The rules of a document are decoded from the YAML tree by hand when they
// have the plain shape operators write: mappings with known keys once each,
// string, decimal integer and boolean scalars, lists of strings. That is
// several times cheaper than yaml.v3's reflection-driven decode (which also
// needs a second, lenient pass to tell an omitted cost from "cost: 0", and a
// walk for unknown fields), and at 100,000 rules it is much of what a load
// costs. Whatever is not of that shape (aliases, merge keys, tags, nulls,
// unknown or repeated fields, values of the wrong type, hexadecimal numbers)
// is left to yaml.v3: the fast path only ever declines, it never reports an
// error, so every error message, and every value decoded from anything but
// the plain shape, is yaml.v3's own. TestFastDecodeLikeYAML holds the two to
// the same results.

// fastRules decodes items (rule nodes) into rules, or reports false.
func fastRules(items []*yaml.Node) ([]Rule, bool) {
	out := make([]Rule, len(items))
	for i, n := range items {
		if !fastRule(n, &out[i]) {
			return nil, false
		}
	}
	return out, true
}

// Rule fields, one bit each, to refuse a repeated key.
const (
	fID = 1 << iota
	fMatch
	fKey
	fAlgorithm
	fLimit
	fWindow
	fBurst
	fCost
	fMinInterval
	fShadow
	fScope
	fDisabled
	fBehaviour
	fMetrics
)

func fastRule(n *yaml.Node, r *Rule) bool {
	if !plainMapping(n) {
		return false
	}
	seen := 0
	once := func(bit int) bool {
		ok := seen&bit == 0
		seen |= bit
		return ok
	}
	for i := 0; i < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !plainKey(k) {
			return false
		}
		var ok bool
		switch k.Value {
		case "id":
			ok = once(fID) && fastString(v, &r.ID)
		case "match":
			ok = once(fMatch) && fastMatch(v, &r.Match)
		case "key":
			ok = once(fKey) && fastStrings(v, &r.Key)
		case "algorithm":
			var s string
			ok = once(fAlgorithm) && fastString(v, &s)
			r.Algorithm = Algorithm(s)
		case "limit":
			ok = once(fLimit) && fastInt(v, &r.Limit)
		case "window":
			ok = once(fWindow) && fastDuration(v, &r.Window)
		case "burst":
			ok = once(fBurst) && fastInt(v, &r.Burst)
		case "cost":
			ok = once(fCost) && fastInt(v, &r.Cost)
		case "min_interval":
			ok = once(fMinInterval) && fastDuration(v, &r.MinInterval)
		case "shadow":
			ok = once(fShadow) && fastBool(v, &r.Shadow)
		case "scope":
			var s string
			ok = once(fScope) && fastString(v, &s)
			r.Scope = Scope(s)
		case "disabled":
			ok = once(fDisabled) && fastBool(v, &r.Disabled)
		case "behaviour":
			ok = once(fBehaviour) && fastBool(v, &r.Behaviour)
		case "metrics":
			ok = once(fMetrics) && fastBool(v, &r.Metrics)
		}
		if !ok {
			return false
		}
	}
	if seen&fCost == 0 {
		r.Cost = 1 // what defaultCost does after yaml.v3's decode
	}
	return true
}

func fastMatch(n *yaml.Node, m *MatchSpec) bool {
	if !plainMapping(n) {
		return false
	}
	var hosts, prefixes, methods bool
	for i := 0; i < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !plainKey(k) {
			return false
		}
		var ok bool
		switch k.Value {
		case "hosts":
			ok = !hosts && fastStrings(v, &m.Hosts)
			hosts = true
		case "path_prefix":
			ok = !prefixes && fastStrings(v, &m.PathPrefix)
			prefixes = true
		case "methods":
			ok = !methods && fastStrings(v, &m.Methods)
			methods = true
		}
		if !ok {
			return false
		}
	}
	return true
}

// plainMapping is a mapping yaml.v3 would decode into a struct as it is.
func plainMapping(n *yaml.Node) bool {
	return n.Kind == yaml.MappingNode && n.Tag == "!!map" && len(n.Content)%2 == 0
}

// plainKey is a key that names a field by its text (not a merge key, not
// an alias, not a tagged or quoted oddity).
func plainKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.Tag == "!!str"
}

func fastString(n *yaml.Node, s *string) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return false
	}
	*s = n.Value
	return true
}

func fastStrings(n *yaml.Node, out *[]string) bool {
	if n.Kind != yaml.SequenceNode || n.Tag != "!!seq" {
		return false
	}
	// yaml.v3 makes an empty, non-nil slice of an empty list; so does this.
	s := make([]string, len(n.Content))
	for i, c := range n.Content {
		if !fastString(c, &s[i]) {
			return false
		}
	}
	*out = s
	return true
}

// fastInt takes plain decimal integers only ("100", "-3", "0"); yaml.v3
// reads other spellings ("0x10", "0o17", "1_000", "+5") by its own rules.
func fastInt(n *yaml.Node, out *int64) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Style != 0 {
		return false
	}
	s := n.Value
	neg := false
	if len(s) > 0 && s[0] == '-' {
		neg, s = true, s[1:]
	}
	if len(s) == 0 || len(s) > 18 || s[0] == '0' && len(s) > 1 {
		return false // 18 digits cannot overflow an int64
	}
	var v int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	*out = v
	return true
}

func fastBool(n *yaml.Node, out *bool) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Style != 0 {
		return false
	}
	switch n.Value {
	case "true":
		*out = true
	case "false":
		*out = false
	default:
		return false
	}
	return true
}

// fastDuration is Duration.UnmarshalYAML on a string that parses.
func fastDuration(n *yaml.Node, out *Duration) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return false
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		return false
	}
	*out = Duration(d)
	return true
}

// fastHead decodes the top level of a plain document: "version" (a plain
// decimal integer) and "rules" (a list), each at most once and nothing else.
// It returns the rules list (nil when absent) or reports false.
func fastHead(root *yaml.Node, doc *Document) (*yaml.Node, bool) {
	if !plainMapping(root) {
		return nil, false
	}
	var seq *yaml.Node
	var version bool
	for i := 0; i < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if !plainKey(k) {
			return nil, false
		}
		switch k.Value {
		case "version":
			var n int64
			if version || !fastInt(v, &n) || int64(int(n)) != n {
				return nil, false
			}
			doc.Version, version = int(n), true
		case "rules":
			if seq != nil || v.Kind != yaml.SequenceNode || v.Tag != "!!seq" {
				return nil, false
			}
			seq = v
		default:
			return nil, false
		}
	}
	return seq, true
}
