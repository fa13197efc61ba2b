package rules

import (
	"bytes"
	"maps"
	"reflect"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Marshal writes doc as YAML: the bytes yaml.v3's encoder writes with a
// two-space indentation, every field in struct order and empty ones left
// out. It writes them itself when every string in doc is one yaml.v3
// writes plain (or, for a wildcard host, in single quotes), which is what
// validated documents hold, and leaves doc to yaml.v3 otherwise: the
// encoder takes tens of seconds over 100,000 rules, this a few tens of
// milliseconds. Its output is in the subset Parse reads without yaml.v3
// (scanDocument). TestMarshalLikeYAML holds it to yaml.v3's bytes.
func Marshal(doc *Document) ([]byte, error) {
	if doc != nil {
		if out, ok := appendDocument(make([]byte, 0, 64+len(doc.Rules)*160), doc); ok {
			return out, nil
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// marshalFields are the YAML fields appendDocument writes, per type. A
// field added to one of these types and not taught to appendDocument sends
// every document to yaml.v3, so it is never left out.
var marshalFields = map[reflect.Type][]string{
	documentType:                 {"version", "rules", "behaviour"},
	reflect.TypeFor[Rule]():      {"id", "match", "key", "algorithm", "limit", "window", "burst", "cost", "min_interval", "shadow", "scope", "disabled", "behaviour", "metrics"},
	reflect.TypeFor[MatchSpec](): {"hosts", "path_prefix", "methods"},
}

// marshalKnowsAll reports whether the types have exactly marshalFields.
var marshalKnowsAll = func() bool {
	for t, want := range marshalFields {
		got := slices.Sorted(maps.Keys(fieldsOf(t)))
		if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			return false
		}
	}
	return true
}()

func appendDocument(b []byte, d *Document) ([]byte, bool) {
	if d == nil || !marshalKnowsAll || d.Behaviour != nil { // the behaviour section goes to yaml.v3
		return nil, false
	}
	b = append(b, "version: "...)
	b = strconv.AppendInt(b, int64(d.Version), 10)
	if len(d.Rules) == 0 {
		return append(b, "\nrules: []\n"...), true
	}
	b = append(b, "\nrules:\n"...)
	for i := range d.Rules {
		var ok bool
		if b, ok = appendRule(b, &d.Rules[i]); !ok {
			return nil, false
		}
	}
	return b, true
}

// appendRule writes one item of the rules list; the first field follows
// "  - ", the others are at column 4.
func appendRule(b []byte, r *Rule) ([]byte, bool) {
	const indent = "    "
	ok := true
	b = append(b, "  - id: "...)
	b, ok = appendScalar(b, r.ID)
	b = append(b, '\n')
	m := &r.Match
	if len(m.Hosts) > 0 || len(m.PathPrefix) > 0 || len(m.Methods) > 0 {
		b = append(b, indent+"match:\n"...)
		for _, l := range []struct {
			name string
			list []string
		}{{"hosts", m.Hosts}, {"path_prefix", m.PathPrefix}, {"methods", m.Methods}} {
			if len(l.list) > 0 && ok {
				b = append(b, indent+"  "...)
				b = append(b, l.name...)
				b = append(b, ":\n"...)
				b, ok = appendList(b, indent+"    - ", l.list)
			}
		}
	}
	if len(r.Key) > 0 && ok {
		b = append(b, indent+"key:\n"...)
		b, ok = appendList(b, indent+"  - ", r.Key)
	}
	str := func(name, v string) {
		if v != "" && ok {
			b = append(b, indent...)
			b = append(b, name...)
			b = append(b, ": "...)
			b, ok = appendScalar(b, v)
			b = append(b, '\n')
		}
	}
	num := func(name string, v int64) {
		if v != 0 {
			b = append(b, indent...)
			b = append(b, name...)
			b = append(b, ": "...)
			b = strconv.AppendInt(b, v, 10)
			b = append(b, '\n')
		}
	}
	flag := func(name string, v bool) {
		if v {
			b = append(b, indent...)
			b = append(b, name...)
			b = append(b, ": true\n"...)
		}
	}
	dur := func(name string, d Duration) {
		if d != 0 {
			str(name, d.String())
		}
	}
	str("algorithm", string(r.Algorithm))
	num("limit", r.Limit)
	dur("window", r.Window)
	num("burst", r.Burst)
	num("cost", r.Cost)
	dur("min_interval", r.MinInterval)
	flag("shadow", r.Shadow)
	str("scope", string(r.Scope))
	flag("disabled", r.Disabled)
	flag("behaviour", r.Behaviour)
	flag("metrics", r.Metrics)
	return b, ok
}

func appendList(b []byte, lead string, list []string) ([]byte, bool) {
	ok := true
	for _, v := range list {
		b = append(b, lead...)
		if b, ok = appendScalar(b, v); !ok {
			return b, false
		}
		b = append(b, '\n')
	}
	return b, true
}

// appendScalar writes v as yaml.v3 writes a string in block context, for
// the strings whose spelling this is sure of: those it writes plain (see
// plainSafe) and a wildcard host ("*." and a plain-safe name), which it
// single-quotes because '*' would start an alias. It reports false for
// any other string.
func appendScalar(b []byte, v string) ([]byte, bool) {
	switch {
	case plainSafe(v):
		return append(b, v...), true
	case len(v) > 2 && v[0] == '*' && v[1] == '.' && plainSafe(v[2:]) && v[2] != '-':
		b = append(b, '\'')
		b = append(b, v...)
		return append(b, '\''), true
	}
	return b, false
}

// plainSafe reports whether yaml.v3 writes v as a plain scalar for
// certain: letters, digits and "_./-:" only, starting with a letter, a
// digit, '_' or '/' and not ending in ':' (so no indicator, no ": ", no
// " #", no document marker), resolving to a string when read back
// (plainIsString, which also rules out base-60 floats) and not a YAML 1.1
// bool ("yes", "off", ...), which yaml.v3 quotes.
func plainSafe(v string) bool {
	if v == "" || v[len(v)-1] == ':' {
		return false
	}
	switch c := v[0]; {
	case isAlnum(c), c == '_', c == '/':
	default:
		return false
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case isAlnum(c), c == '_', c == '.', c == '/', c == '-', c == ':':
		default:
			return false
		}
	}
	switch v {
	case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off", "OFF":
		return false
	}
	return plainIsString(v)
}
