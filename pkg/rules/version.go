package rules

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// ParseVersion is Parse, and the DocumentVersion of the document it
// returns, taken before anyone else holds it: the document is normalized
// already, so it needs neither DocumentVersion's copy nor its second
// normalization (at 100,000 rules, a fifth of what reading a file and
// saying its version takes, and a third of its memory).
func ParseVersion(data []byte) (*Document, string, error) {
	doc, err := Parse(data)
	if err != nil {
		return nil, "", err
	}
	return doc, canonicalVersion(doc, true), nil
}

// The version encoding is a JSON object per rule, written from the rule
// field table (the yaml tags of Rule), in its order: each field by its yaml
// name, durations as integer nanoseconds under name+"_ns". The hash struct
// tag says where a field departs from that:
//
//   - always: written even when empty. Only the fields of the first schema
//     have it; every later field is written only when set, so that adding
//     one leaves the version of every existing document as it was.
//   - inline: a section whose fields are written as the rule's own (match).
//   - capacity: written as "capacity", the effective capacity of a bucket
//     (burst 0 and burst == limit hash alike).
//   - escapes: written inside one "escapes" object, present when any of
//     its fields is set, where every field is written, every string
//     Go-quoted, the lists of a section sorted and left out when empty, and
//     list entries (overrides) sorted.
//
// Strings of lists are Go-quoted (strconv.Quote: path prefixes and query
// names may hold bytes that are not UTF-8, which JSON would fold into
// U+FFFD and so make different rules hash alike). TestVersionEncodingLikeJSON
// holds the encoding to encoding/json over a struct spelling the fields out,
// and TestVersionPinned holds the versions of known documents.

// hashField is one field of the version encoding.
type hashField struct {
	key      string // `,"name":`
	index    []int  // in Rule
	always   bool
	capacity bool
	escapes  []hashField // the "escapes" object: its fields
}

// hashFields is the version encoding of a rule, built from the field table.
var hashFields = sync.OnceValue(func() []hashField {
	var out []hashField
	esc := -1 // the "escapes" object's position in out
	for _, f := range fieldsOf(ruleType).list {
		sf := ruleType.Field(f.index)
		opts := strings.Split(sf.Tag.Get("hash"), ",")
		h := hashField{key: `,"` + hashName(f.name, sf.Type) + `":`, index: sf.Index, always: slices.Contains(opts, "always")}
		switch {
		case slices.Contains(opts, "inline"):
			for _, g := range fieldsOf(sf.Type).list {
				gf := sf.Type.Field(g.index)
				out = append(out, hashField{key: `,"` + hashName(g.name, gf.Type) + `":`, index: []int{f.index, g.index}, always: h.always})
			}
			continue
		case slices.Contains(opts, "capacity"):
			h.key, h.capacity = `,"capacity":`, true
		case slices.Contains(opts, "escapes"):
			if esc < 0 {
				esc = len(out)
				out = append(out, hashField{key: `,"escapes":`})
			}
			out[esc].escapes = append(out[esc].escapes, h)
			continue
		}
		out = append(out, h)
	}
	out[0].key = out[0].key[1:] // the first field follows "{"
	return out
})

var durationType = reflect.TypeFor[Duration]()

// hashName is the name a field is hashed under: durations in nanoseconds.
func hashName(name string, t reflect.Type) string {
	if t == durationType {
		return name + "_ns"
	}
	return name
}

// versionOfNormalized is Version of an already normalized document.
func versionOfNormalized(d *Document) string { return canonicalVersion(d, false) }

func canonicalVersion(d *Document, withDisabled bool) string {
	rules := hashedRules(d, withDisabled)
	h := sha256.New()
	buf := make([]byte, 0, 64<<10)
	buf = append(buf, `{"schema":`...)
	buf = strconv.AppendInt(buf, SchemaVersion, 10)
	buf = append(buf, `,"rules":[`...)
	var scratch []byte
	fields := hashFields()
	for i, r := range rules {
		if i > 0 {
			buf = append(buf, ',')
		}
		if r.Disabled {
			// A disabled rule is its id alone; its other fields hash
			// empty (lists as null).
			r = &Rule{ID: r.ID, Disabled: true}
		}
		buf, scratch = appendRuleJSON(buf, scratch, fields, r)
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

// hashedRules are the rules Version hashes, sorted by id (stable, so an
// invalid document with a repeated id still hashes one way).
func hashedRules(d *Document, withDisabled bool) []*Rule {
	rules := make([]*Rule, 0, len(d.Rules))
	for i := range d.Rules {
		if !d.Rules[i].Disabled || withDisabled {
			rules = append(rules, &d.Rules[i])
		}
	}
	slices.SortStableFunc(rules, func(a, b *Rule) int { return cmp.Compare(a.ID, b.ID) })
	return rules
}

// appendRuleJSON appends the version encoding of r; scratch is reused for
// quoting.
func appendRuleJSON(buf, scratch []byte, fields []hashField, r *Rule) ([]byte, []byte) {
	v := reflect.ValueOf(r).Elem()
	buf = append(buf, '{')
	for i := range fields {
		f := &fields[i]
		switch {
		case f.escapes != nil:
			buf, scratch = appendEscapes(buf, scratch, f, v)
			continue
		case f.capacity:
			buf = append(buf, f.key...)
			c := r.Burst // 0 when valid; kept so invalid input still hashes distinctly
			if l := r.limit(); l.Algorithm.Valid() && l.Algorithm.Spec().Burst {
				c = l.Capacity()
			}
			buf = strconv.AppendInt(buf, c, 10)
			continue
		}
		fv := v.FieldByIndex(f.index)
		if !f.always && empty(fv) {
			continue
		}
		buf = append(buf, f.key...)
		switch fv.Kind() {
		case reflect.String:
			buf = appendJSONString(buf, fv.String())
		case reflect.Slice:
			if fv.IsNil() && r.Disabled {
				buf = append(buf, "null"...)
				continue
			}
			buf, scratch = appendQuotedList(buf, scratch, fv)
		case reflect.Int64:
			buf = strconv.AppendInt(buf, fv.Int(), 10)
		case reflect.Bool:
			buf = strconv.AppendBool(buf, fv.Bool())
		case reflect.Float64:
			buf = appendJSONFloat(buf, fv.Float())
		default:
			panic("rules: no version encoding for field " + f.key + " of kind " + fv.Kind().String())
		}
	}
	return append(buf, '}'), scratch
}

// appendQuotedList appends the []string l as a JSON list of Go-quoted
// strings (read through reflect: converting it to a []string allocates).
func appendQuotedList(buf, scratch []byte, l reflect.Value) ([]byte, []byte) {
	buf = append(buf, '[')
	for i := range l.Len() {
		s := l.Index(i).String()
		if i > 0 {
			buf = append(buf, ',')
		}
		if plainASCII(s) {
			// strconv.Quote leaves s as it is and JSON escapes
			// the two quotes it adds.
			buf = append(buf, `"\"`...)
			buf = append(buf, s...)
			buf = append(buf, `\""`...)
			continue
		}
		scratch = strconv.AppendQuote(scratch[:0], s)
		buf = appendJSONString(buf, string(scratch))
	}
	return append(buf, ']'), scratch
}

// appendEscapes appends the "escapes" object of rule v, if any of its
// fields is set.
func appendEscapes(buf, scratch []byte, f *hashField, v reflect.Value) ([]byte, []byte) {
	set := false
	for _, e := range f.escapes {
		set = set || !empty(v.FieldByIndex(e.index))
	}
	if !set {
		return buf, scratch
	}
	buf = append(buf, f.key...)
	buf = append(buf, '{')
	for i, e := range f.escapes {
		key := e.key
		if i == 0 {
			key = key[1:]
		}
		buf = append(buf, key...)
		buf = appendSectionValue(buf, v.FieldByIndex(e.index), true)
	}
	return append(buf, '}'), scratch
}

// appendSectionValue appends v as the escapes object holds it: strings
// Go-quoted, lists of strings Go-quoted and, when sorted is set (a
// section's lists are sets; an override's key is positional), sorted;
// sections as objects without their empty lists; lists of entries sorted.
func appendSectionValue(buf []byte, v reflect.Value, sorted bool) []byte {
	switch v.Kind() {
	case reflect.String:
		return appendJSONString(buf, strconv.Quote(v.String()))
	case reflect.Int64:
		return strconv.AppendInt(buf, v.Int(), 10)
	case reflect.Struct: // a section
		buf = append(buf, '{')
		first := true
		for _, g := range fieldsOf(v.Type()).list {
			gv := v.Field(g.index)
			if gv.Kind() == reflect.Slice && gv.Len() == 0 {
				continue
			}
			if !first {
				buf = append(buf, ',')
			}
			first = false
			buf = appendJSONString(buf, g.name)
			buf = append(buf, ':')
			buf = appendSectionValue(buf, gv, sorted)
		}
		return append(buf, '}')
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.String {
			l := quoteAll(v.Interface().([]string))
			if sorted {
				slices.Sort(l)
			}
			enc, _ := json.Marshal(l) // strings: cannot fail
			return append(buf, enc...)
		}
		return appendEntries(buf, v)
	}
	panic("rules: no version encoding for a section value of kind " + v.Kind().String())
}

// appendEntries appends a list of entries (overrides): each with every
// field, lists in their order, the entries sorted field by field.
func appendEntries(buf []byte, v reflect.Value) []byte {
	order := make([]int, v.Len())
	for i := range order {
		order[i] = i
	}
	fields := fieldsOf(v.Type().Elem()).list
	// The order compares list fields by their quoted strings: each entry's
	// are quoted once here, not at every comparison (a rule with 100,000
	// overrides sorted in about 3.4 million quotings before).
	quoted := make([][][]string, len(fields))
	for k, g := range fields {
		if v.Type().Elem().Field(g.index).Type.Kind() != reflect.Slice {
			continue
		}
		quoted[k] = make([][]string, v.Len())
		for i := range quoted[k] {
			quoted[k][i] = quoteAll(v.Index(i).Field(g.index).Interface().([]string))
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		for k, g := range fields {
			var c int
			if q := quoted[k]; q != nil {
				c = slices.Compare(q[a], q[b])
			} else {
				c = cmp.Compare(v.Index(a).Field(g.index).Int(), v.Index(b).Field(g.index).Int())
			}
			if c != 0 {
				return c
			}
		}
		return 0
	})
	buf = append(buf, '[')
	for i, j := range order {
		if i > 0 {
			buf = append(buf, ',')
		}
		e := v.Index(j)
		for k, g := range fields {
			buf = append(buf, "{,"[min(k, 1)])
			buf = appendJSONString(buf, g.name)
			buf = append(buf, ':')
			buf = appendSectionValue(buf, e.Field(g.index), false)
		}
		buf = append(buf, '}')
	}
	return append(buf, ']')
}

func quoteAll(l []string) []string {
	out := make([]string, len(l))
	for i, s := range l {
		out[i] = strconv.Quote(s)
	}
	return out
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
