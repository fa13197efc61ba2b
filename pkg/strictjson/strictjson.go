// Package strictjson reads the JSON documents an operator writes (the
// shedder settings, the enforcement switch, the region catalog, session
// ticket keys, rules manifests) strictly, so that what a person or a policy
// check reads in the raw value is what the program applies.
//
// encoding/json alone is lenient in three ways that make a document mean
// something other than it says: it matches a key to a field whatever its
// case ({"MODE": "shadow"} sets Mode), it lets the last of two equal keys
// win silently, and DisallowUnknownFields does not see either. Check walks
// the document's tokens against the target type first and refuses:
//
//   - a key that is not exactly (case included) the json name of a field of
//     the struct it is read into ("unknown field", naming the field it
//     nearly matches);
//   - a key given twice in one object, at any depth (maps too);
//   - anything after the one JSON value.
//
// Unmarshal is Check, then encoding/json's decoding into the value. A type
// with its own UnmarshalJSON is checked by its fields' json tags, so such a
// method must read the keys its fields name (every one in this module does:
// it decodes a copy of the struct with durations spelled as text).
package strictjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/edgeguard/edgeguard/pkg/suggest"
)

// Error is a document refused by Check: where (a path such as
// tiers.paths[0].prefix, empty at the top) and what.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Unmarshal checks data against v's type (see Check), then decodes it into
// v, a non-nil pointer, as encoding/json does (unknown fields refused).
func Unmarshal(data []byte, v any) error {
	if err := Check(data, v); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Check reports the first problem of data read into a value of v's type (v
// itself is not changed): a syntax error, a key that is not exactly a field's
// json name, a key twice in one object, or data after the JSON value.
func Check(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	c := checker{dec: dec}
	if err := c.value(reflect.TypeOf(v), nil); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &Error{Msg: "data after the JSON value"}
	}
	return nil
}

// maxDepth bounds nesting: no document here is deeper than a few levels,
// and the walk recurses once per level.
const maxDepth = 100

type checker struct {
	dec *json.Decoder
}

// step is one element of a path: a key, or an index when key is "".
type step struct {
	key   string
	index int
}

func pathString(path []step) string {
	var b strings.Builder
	for _, s := range path {
		if s.key == "" {
			fmt.Fprintf(&b, "[%d]", s.index)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.key)
	}
	return b.String()
}

// value reads one JSON value that is to fill a value of type t (nil: any
// shape, only duplicate keys are looked for).
func (c *checker) value(t reflect.Type, path []step) error {
	tok, err := c.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return &Error{Path: pathString(path), Msg: "reading JSON: " + err.Error()}
	}
	if len(path) >= maxDepth {
		return &Error{Path: pathString(path), Msg: fmt.Sprintf("nested deeper than %d", maxDepth)}
	}
	t = deref(t)
	switch tok {
	case json.Delim('{'):
		return c.object(t, path)
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && !opaque(t) {
			elem = t.Elem()
		}
		for i := 0; c.dec.More(); i++ {
			if err := c.value(elem, append(path, step{index: i})); err != nil {
				return err
			}
		}
		_, err := c.dec.Token() // ']'
		return err
	}
	return nil // a scalar: its type is encoding/json's to check
}

// object reads the members of an object (after its '{').
func (c *checker) object(t reflect.Type, path []step) error {
	var fields map[string]reflect.Type // nil: any key
	var elem reflect.Type
	switch {
	case t == nil || opaque(t):
	case t.Kind() == reflect.Struct:
		fields = fieldsOf(t)
	case t.Kind() == reflect.Map:
		elem = t.Elem()
	}
	seen := map[string]bool{}
	for c.dec.More() {
		tok, err := c.dec.Token()
		if err != nil {
			return &Error{Path: pathString(path), Msg: "reading JSON: " + err.Error()}
		}
		key := tok.(string) // an object's member starts with its key
		if seen[key] {
			what := "key"
			if fields != nil {
				what = "field"
			}
			return &Error{Path: pathString(path), Msg: fmt.Sprintf("%s %q given twice (readers disagree on which one counts)", what, key)}
		}
		seen[key] = true
		vt := elem
		if fields != nil {
			ft, ok := fields[key]
			if !ok {
				return &Error{Path: pathString(path), Msg: unknownKey(key, fields)}
			}
			vt = ft
		}
		if err := c.value(vt, append(path, step{key: key})); err != nil {
			return err
		}
	}
	_, err := c.dec.Token() // '}'
	return err
}

func unknownKey(key string, fields map[string]reflect.Type) string {
	names := make([]string, 0, len(fields))
	for n := range fields {
		if strings.EqualFold(n, key) {
			return fmt.Sprintf("unknown field %q: names are case-sensitive, the field is %q", key, n)
		}
		names = append(names, n)
	}
	slices.Sort(names)
	if near := suggest.Nearest(key, names); near != "" {
		return fmt.Sprintf("unknown field %q (did you mean %q?)", key, near)
	}
	return fmt.Sprintf("unknown field %q (known: %s)", key, strings.Join(names, ", "))
}

func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// opaque types are read from JSON by their own method from a string (a
// duration, a time, a tier name): their Go fields say nothing of the JSON.
func opaque(t reflect.Type) bool {
	return reflect.PointerTo(t).Implements(textUnmarshaler) || t.Implements(textUnmarshaler)
}

var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// fieldsOf maps the json names of t's fields, those of embedded structs
// included, to their types.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	out := map[string]reflect.Type{}
	addFields(t, out, 0)
	fieldCache.Store(t, out)
	return out
}

func addFields(t reflect.Type, out map[string]reflect.Type, depth int) {
	if depth > 8 {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := deref(f.Type)
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			addFields(ft, out, depth+1) // promoted, as encoding/json does
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if _, ok := out[name]; !ok || depth == 0 {
			out[name] = f.Type
		}
	}
}
