package rules

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/pkg/suggest"
)

// The document is decoded from yaml.v3's node tree by one strict decoder
// driven by the yaml tags of Document, Rule, MatchSpec and the behaviour
// section: a field is named once, in its struct tag, and a field added to
// one of those structs is read, refused when misspelled, compared by
// "rules diff" and written by Marshal without another list to update.
// Every problem is collected (not only the first) with the line it is on,
// worded for the operator: "want an integer", never a Go type name.

// setDefaults gives a zero rule what it holds before its fields are
// decoded: an omitted cost is 1, while "cost: 0" is still decoded, and
// refused. (Setting the field, not copying a whole default rule, spares a
// large document a copy of every rule.)
func setDefaults(r *Rule) { r.Cost = 1 }

var ruleType = reflect.TypeFor[Rule]()

// decoder collects the problems of one decode.
type decoder struct {
	errs []*FieldError
	path []step // see step
	// merged counts the mappings merged into the current rule, so that
	// merge keys merging merge keys cannot make a few lines decode for
	// ever.
	merged int
	// said holds what was reported at which node, so a node decoded twice
	// (an anchored rule merged into another) is reported once.
	said map[saidKey]bool
	// budget is the values left to decode (limits.go); over is set, with
	// a problem, when a value went past it, and then nothing more is
	// decoded.
	budget, size int
	over         bool
	dropped      int        // problems past MaxProblems, counted only
	item         *yaml.Node // the rule being decoded, whose line says where a reuse went past the budget
}

// newDecoder is a decoder for a text of size bytes.
func newDecoder(size int) *decoder { return &decoder{budget: decodeBudget(size), size: size} }

// problems are the problems found, and one that counts those left out.
func (d *decoder) problems() []*FieldError {
	if d.dropped > 0 {
		return append(d.errs, moreProblems(d.dropped))
	}
	return d.errs
}

// spend takes one value at node n from the budget, or reports false when
// none is left (or none was before).
func (d *decoder) spend(n *yaml.Node) bool {
	if d.over {
		return false
	}
	if d.budget--; d.budget < 0 {
		d.over = true
		line := n.Line
		if d.item != nil {
			line = d.item.Line
		}
		d.errs = append(d.errs, overBudget(line, d.size))
		return false
	}
	return true
}

type saidKey struct {
	n   *yaml.Node
	msg string
}

// problem records a problem at node n; field is the path within the rule
// (or the document, outside the rules).
func (d *decoder) problem(n *yaml.Node, field, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if d.said == nil {
		d.said = map[saidKey]bool{}
	}
	if k := (saidKey{n, msg}); !d.said[k] {
		d.said[k] = true
		if len(d.errs) >= MaxProblems {
			d.dropped++
			return
		}
		d.errs = append(d.errs, &FieldError{Index: -1, Field: field, Msg: msg, Line: n.Line})
	}
}

// rules decodes the items of the rules list into out (zero rules), each
// from setDefaults; the problems of item i name rule i (by its id, when it has a
// usable one).
func (d *decoder) rules(items []*yaml.Node, out []Rule) {
	outer := d.path
	defer func() { d.path, d.item = outer, nil }()
	d.path = nil // fields are named within their rule
	for i, n := range items {
		if d.over {
			return
		}
		from := len(d.errs)
		d.item = n
		setDefaults(&out[i])
		d.merged = 0
		if r := resolve(n); r != nil && r.Kind == yaml.ScalarNode && r.Tag == "!!null" {
			d.problem(r, "", "want a rule, got an empty entry") // yaml.v3 drops it
		}
		d.decode(n, reflect.ValueOf(&out[i]).Elem())
		id := out[i].ID
		if !validID(id) {
			id = ""
		}
		for _, e := range d.errs[from:] {
			e.Index, e.RuleID = i, id
		}
	}
}

// maxMergeDepth bounds merge keys within merge keys: a mapping that merges
// itself through an alias would otherwise never end. maxMerged bounds the
// mappings merged into one rule (or into the rest of the document).
const (
	maxMergeDepth = 16
	maxMerged     = 1000
)

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < maxMergeDepth; i++ {
		n = n.Alias
	}
	return n
}

// step is one step of the path to the value being decoded: a field name,
// or (name "") a list entry's index. The decoder keeps the path as a stack
// and turns it into text ("match.hosts[1]") only when there is a problem.
type step struct {
	name  string
	index int // for a list entry, whose name is listEntry
}

// listEntry names the steps into a list: no field is called that.
const listEntry = "[]"

func (d *decoder) push(name string, index int) { d.path = append(d.path, step{name, index}) }
func (d *decoder) pop()                        { d.path = d.path[:len(d.path)-1] }

// field is the current path as text.
func (d *decoder) field() string {
	var b strings.Builder
	for _, s := range d.path {
		switch {
		case s.name == listEntry:
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case b.Len() > 0:
			b.WriteString("." + s.name)
		default:
			b.WriteString(s.name)
		}
	}
	return b.String()
}

// inList reports whether the current value is a list entry.
func (d *decoder) inList() bool { return len(d.path) > 0 && d.path[len(d.path)-1].name == listEntry }

// decode sets v (addressable) from n.
func (d *decoder) decode(n *yaml.Node, v reflect.Value) {
	n = resolve(n)
	if n == nil || n.Kind == yaml.AliasNode || !d.spend(n) {
		return
	}
	t := v.Type()
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		if d.inList() {
			// yaml.v3 drops it from the list; an empty entry is a mistake.
			d.problem(n, d.field(), "want %s, got an empty entry", describe(t))
		}
		return // "field:" with no value says nothing: the default stays
	}
	if isLeaf(t) {
		// A type that reads itself (Duration, the behaviour section's
		// durations): its own message, at its own line.
		if err := v.Addr().Interface().(yaml.Unmarshaler).UnmarshalYAML(n); err != nil {
			for _, msg := range typeErrors(err) {
				d.problem(n, d.field(), "%s", msg)
			}
		}
		return
	}
	ok := true
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(t.Elem()))
		}
		d.decode(n, v.Elem())
	case reflect.Struct:
		var seen uint64
		d.mapping(n, v, 0, &seen)
	case reflect.Slice:
		ok = d.sequence(n, v)
	case reflect.String, reflect.Int, reflect.Int64, reflect.Float64, reflect.Bool:
		ok = scalar(n, v)
	default:
		d.problem(n, d.field(), "cannot be decoded") // a type this decoder was not taught
	}
	if !ok {
		d.problem(n, d.field(), "want %s, got %s", describe(t), describeNode(n))
	}
}

// sequence sets slice v from n, or reports false when n is no list.
func (d *decoder) sequence(n *yaml.Node, v reflect.Value) bool {
	if n.Kind != yaml.SequenceNode {
		return false
	}
	if v.Type().Elem() == ruleType {
		if fe := tooManyRules(len(n.Content), n.Line); fe != nil {
			d.over = true // the list is not even made
			d.errs = append(d.errs, fe)
			return true
		}
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	if v.Type().Elem() == ruleType {
		d.rules(n.Content, s.Interface().([]Rule))
	} else {
		for i, c := range n.Content {
			if d.over {
				break
			}
			d.push(listEntry, i)
			d.decode(c, s.Index(i))
			d.pop()
		}
	}
	v.Set(s)
	return true
}

// scalar sets v, a string, integer, number or bool, from n, or reports
// false when n is not one.
func scalar(n *yaml.Node, v reflect.Value) bool {
	if n.Kind != yaml.ScalarNode {
		return false
	}
	switch v.Kind() {
	case reflect.String:
		s := n.Value
		if n.Tag == "!!binary" && n.Decode(&s) != nil { // bytes that are not UTF-8
			return false
		}
		v.SetString(s)
	case reflect.Int, reflect.Int64:
		x, ok := integer(n)
		if !ok || v.OverflowInt(x) {
			return false
		}
		v.SetInt(x)
	case reflect.Float64:
		var x float64
		if !isNumber(n) || n.Decode(&x) != nil {
			return false
		}
		v.SetFloat(x)
	case reflect.Bool:
		var x bool
		if n.Decode(&x) != nil { // yaml.v3 also takes YAML 1.1's yes, no, on, off
			return false
		}
		v.SetBool(x)
	}
	return true
}

func isNumber(n *yaml.Node) bool { return n.Tag == "!!int" || n.Tag == "!!float" }

// integer reads scalar n as an integer. Plain decimals here; yaml.v3 reads
// the other spellings (0x10, 1_000, 010 as octal, 1e3). A number with a
// fraction is refused (yaml.v3 would cut 1.5 to 1).
func integer(n *yaml.Node) (int64, bool) {
	if !isNumber(n) {
		return 0, false
	}
	if x, err := strconv.ParseInt(n.Value, 10, 64); err == nil && (len(n.Value) == 1 || n.Value[0] != '0') {
		return x, true
	}
	var f float64
	if n.Decode(&f) != nil {
		return 0, false
	}
	x := int64(f)
	if float64(x) != f || f >= 1<<63 {
		return 0, false
	}
	if n.Tag == "!!int" && n.Decode(&x) != nil { // exact, beyond float64's 53 bits
		return 0, false
	}
	return x, true
}

// mapping decodes a mapping node into struct v: every key once, known
// fields only, merge keys ("<<: *anchor") filling what the mapping itself
// does not say. seen has a bit per field already set (by this mapping, or
// by the mapping that merges this one).
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, depth int, seen *uint64) {
	if n.Kind != yaml.MappingNode {
		d.problem(n, d.field(), "want %s, got %s", describe(v.Type()), describeNode(n))
		return
	}
	fs := fieldsOf(v.Type())
	var own uint64 // the fields this mapping names
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content) && !d.over; i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			merges = append(merges, val)
			continue
		}
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" {
			// yaml.v3 skips an empty key and what it maps to; it is a mistake.
			d.problem(k, d.field(), "a key must be a field name, got %s", describeNode(k))
			continue
		}
		j, ok := fs.byName[k.Value]
		d.push(k.Value, 0)
		bit := uint64(1) << j
		switch {
		case !ok:
			if s := suggest.Nearest(k.Value, fs.names); s != "" {
				d.problem(k, d.field(), "unknown field (did you mean %s?)", s)
			} else {
				d.problem(k, d.field(), "unknown field (want one of %s)", strings.Join(fs.names, ", "))
			}
		case own&bit != 0:
			d.problem(k, d.field(), "repeated (first at line %d)", firstKey(n, k.Value).Line)
		case *seen&bit != 0:
			own |= bit // the merging mapping says it itself
		default:
			own |= bit
			*seen |= bit
			d.decode(val, v.Field(fs.list[j].index))
		}
		d.pop()
	}
	// Merged mappings fill the fields left; the first one listed wins.
	for _, m := range merges {
		m = resolve(m)
		if d.merged++; depth >= maxMergeDepth || d.merged > maxMerged {
			d.problem(m, d.field(), "merge keys (<<) nested too deep")
			return
		}
		items := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			items = m.Content
		}
		for _, it := range items {
			it = resolve(it)
			if d.over || !d.spend(it) {
				return
			}
			if it.Kind != yaml.MappingNode {
				d.problem(it, d.field(), "a merge key (<<) takes a mapping or a list of mappings, got %s", describeNode(it))
				continue
			}
			d.mapping(it, v, depth+1, seen)
		}
	}
}

// firstKey is the first key node of mapping n spelled name.
func firstKey(n *yaml.Node, name string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == name {
			return n.Content[i]
		}
	}
	return n
}

// describe names what a value of type t is written as, for messages.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return describe(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice:
		if t.Elem() == ruleType {
			return "a list of rules"
		}
		if t.Elem().Kind() == reflect.Struct {
			return "a list of mappings (" + strings.Join(fieldsOf(t.Elem()).names, ", ") + ")"
		}
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(describe(t.Elem()), "a "), "an ") + "s"
	case reflect.Struct:
		if t == ruleType {
			return "a rule (a mapping of id, key, algorithm, ...)"
		}
		return "a mapping of " + strings.Join(fieldsOf(t).names, ", ")
	}
	return "a value"
}

// describeNode says what n is, as the operator wrote it.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return strconv.Quote(v)
	}
	return "an alias"
}

// typeErrors are the messages of a yaml.v3 error without "line N: ".
func typeErrors(err error) []string {
	te, ok := err.(*yaml.TypeError)
	if !ok {
		return []string{err.Error()}
	}
	out := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if _, after, ok := strings.Cut(rest, ": "); ok {
				m = after
			}
		}
		out[i] = m
	}
	return out
}
