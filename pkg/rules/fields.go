package rules

import (
	"fmt"
	"reflect"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// The field table: each field of Document, Rule, MatchSpec and the
// behaviour section is declared once, by its yaml tag, and everything else
// goes by the table (fieldsOf). The decoder reads by it (decode.go),
// Marshal writes by it, "rules diff" compares by it (FieldNames,
// FieldValue), a validation message names a field by where it is in the
// rule (r.name(&r.Penalty) is "penalty", r.name(&r.Match.Hosts) is
// "match.hosts"), never by a word of its own, and a rule is copied by
// walking its type: renaming or adding a field needs no other edit.

// structField is one yaml-tagged field of a struct.
type structField struct {
	name      string
	index     int
	omitEmpty bool // Marshal leaves it out when empty
}

// structFields is the field table of a struct type, in declaration order.
type structFields struct {
	list   []structField
	byName map[string]int // name -> index in list
	names  []string
}

var fieldTables sync.Map // reflect.Type -> *structFields

// fieldsOf returns the yaml field table of struct type t.
func fieldsOf(t reflect.Type) *structFields {
	if f, ok := fieldTables.Load(t); ok {
		return f.(*structFields)
	}
	fs := &structFields{byName: map[string]int{}}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case !f.IsExported() || name == "-":
			continue
		case name == "":
			name = strings.ToLower(f.Name)
		}
		fs.byName[name] = len(fs.list)
		fs.list = append(fs.list, structField{name: name, index: i, omitEmpty: strings.Contains(opts, "omitempty")})
		fs.names = append(fs.names, name)
	}
	if len(fs.list) > 64 {
		panic("rules: " + t.String() + " has more than 64 fields") // mapping's bit set
	}
	fieldTables.Store(t, fs)
	return fs
}

// FieldNames lists the YAML field names of a rule in document order,
// "match" expanded into its lists ("match.hosts", ...). It is the one list
// of what a rule can say; see FieldValue.
func FieldNames() []string {
	var out []string
	for _, f := range fieldsOf(ruleType).list {
		if ft := ruleType.Field(f.index).Type; ft.Kind() == reflect.Struct && !isLeaf(ft) {
			for _, g := range fieldsOf(ft).list {
				out = append(out, f.name+"."+g.name)
			}
			continue
		}
		out = append(out, f.name)
	}
	return out
}

// FieldValue is the value of field name (one of FieldNames) of r, written
// as a document would: lists as "[a, b]", durations as "1m0s".
func FieldValue(r Rule, name string) string {
	v := reflect.ValueOf(r)
	t := ruleType
	for part := range strings.SplitSeq(name, ".") {
		i, ok := fieldsOf(t).byName[part]
		if !ok {
			return ""
		}
		f := fieldsOf(t).list[i]
		v, t = v.Field(f.index), t.Field(f.index).Type
	}
	switch x := v.Interface().(type) {
	case []string:
		return "[" + strings.Join(x, ", ") + "]"
	case fmt.Stringer:
		return x.String()
	}
	return fmt.Sprint(v.Interface())
}

// isLeaf reports whether t reads itself (implements yaml.Unmarshaler).
func isLeaf(t reflect.Type) bool {
	if l, ok := leaves.Load(t); ok { // asked for every value decoded
		return l.(bool)
	}
	l := reflect.PointerTo(t).Implements(yamlUnmarshaler)
	leaves.Store(t, l)
	return l
}

var leaves sync.Map // reflect.Type -> bool

var yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// fieldAt is a field of a struct by its place: offset from the struct's
// start and type (a section and its first field share the offset).
type fieldAt struct {
	offset uintptr
	typ    reflect.Type
}

var fieldPaths sync.Map // reflect.Type -> map[fieldAt]string

// pathsOf maps each field of struct type t, and each field of its
// sections, to its yaml path ("match", "match.hosts").
func pathsOf(t reflect.Type) map[fieldAt]string {
	if m, ok := fieldPaths.Load(t); ok {
		return m.(map[fieldAt]string)
	}
	m := map[fieldAt]string{}
	var walk func(t reflect.Type, base uintptr, prefix string)
	walk = func(t reflect.Type, base uintptr, prefix string) {
		for _, f := range fieldsOf(t).list {
			sf := t.Field(f.index)
			m[fieldAt{base + sf.Offset, sf.Type}] = prefix + f.name
			if sf.Type.Kind() == reflect.Struct && !isLeaf(sf.Type) {
				walk(sf.Type, base+sf.Offset, prefix+f.name+".")
			}
		}
	}
	walk(t, 0, "")
	fieldPaths.Store(t, m)
	return m
}

// nameIn is the yaml path, from the field table, of the field that p
// points to within the struct s points to.
func nameIn(s, p any) string {
	sv, pv := reflect.ValueOf(s), reflect.ValueOf(p)
	name, ok := pathsOf(sv.Type().Elem())[fieldAt{pv.Pointer() - sv.Pointer(), pv.Type().Elem()}]
	if !ok {
		panic("rules: " + pv.Type().String() + " is no field of " + sv.Type().String())
	}
	return name
}

// name is the yaml path of the field of r that p points to.
func (r *Rule) name(p any) string { return nameIn(r, p) }

// docField is the yaml name of a field of Document ("rules", "version").
func docField(field func(d *Document) any) string {
	var d Document
	return nameIn(&d, field(&d))
}

var (
	rulesField   = sync.OnceValue(func() string { return docField(func(d *Document) any { return &d.Rules }) })
	versionField = sync.OnceValue(func() string { return docField(func(d *Document) any { return &d.Version }) })
)

// clone returns a deep copy so normalization never touches the caller's
// data: the rules, then every list in them, and every list within a list's
// entries, found by walking Rule's type once (deepCopies).
func (d *Document) clone() *Document {
	if d == nil {
		return &Document{Version: SchemaVersion}
	}
	out := &Document{Version: d.Version, Rules: make([]Rule, len(d.Rules)), Behaviour: d.Behaviour.Clone()}
	deepCopy(out.Rules, d.Rules)
	return out
}

// deepCopy copies from into to (as long), with lists of their own: each
// struct's lists, and every list within a list's entries. The string
// lists, most of them, are cut from a few shared arrays, each capped at its
// own length (an append reallocates), so that copying 100,000 rules is not
// hundreds of thousands of allocations.
func deepCopy[T any](to, from []T) {
	copy(to, from)
	lists := deepCopies(reflect.TypeFor[T]())
	var arena []string
	for i := range to {
		copyLists(reflect.ValueOf(&to[i]).Elem(), lists, &arena)
	}
}

// listAt is a list field to copy (index within its struct) and, when its
// entries are structs, the lists within them.
type listAt struct {
	index []int
	elems []listAt
}

var copyTables sync.Map // reflect.Type -> []listAt

// deepCopies lists the lists of struct type t's exported fields, at any
// depth: what a deep copy must copy besides the struct itself (unexported
// fields are this package's own, shared read-only). A map, pointer or
// interface field (which a rule has none of) panics, so that a field a copy
// could not follow is found by the first test that clones a rule.
func deepCopies(t reflect.Type) []listAt {
	if l, ok := copyTables.Load(t); ok {
		return l.([]listAt)
	}
	var out []listAt
	for i := range t.NumField() {
		if !t.Field(i).IsExported() {
			continue
		}
		ft := t.Field(i).Type
		switch ft.Kind() {
		case reflect.Struct:
			for _, l := range deepCopies(ft) {
				out = append(out, listAt{index: append([]int{i}, l.index...), elems: l.elems})
			}
		case reflect.Slice:
			l := listAt{index: []int{i}}
			switch et := ft.Elem(); et.Kind() {
			case reflect.Struct:
				l.elems = deepCopies(et)
			case reflect.Slice, reflect.Map, reflect.Pointer, reflect.Interface:
				panic("rules: cannot copy the entries of " + t.String() + "." + t.Field(i).Name)
			}
			out = append(out, l)
		case reflect.Map, reflect.Pointer, reflect.Interface, reflect.Func, reflect.Chan, reflect.UnsafePointer:
			panic("rules: cannot copy " + t.String() + "." + t.Field(i).Name)
		}
	}
	copyTables.Store(t, out)
	return out
}

// copyLists gives struct v (addressable) copies of the lists at ls, the
// string lists' cut from arena.
func copyLists(v reflect.Value, ls []listAt, arena *[]string) {
	for _, l := range ls {
		f := v.FieldByIndex(l.index)
		if f.Len() == 0 {
			continue // nothing to share
		}
		if p, ok := f.Addr().Interface().(*[]string); ok {
			if cap(*arena)-len(*arena) < len(*p) { // most lists: without reflect's allocations
				*arena = make([]string, 0, max(len(*p), 1024))
			}
			from := len(*arena)
			*arena = append(*arena, *p...)
			*p = (*arena)[from:len(*arena):len(*arena)]
			continue
		}
		c := reflect.MakeSlice(f.Type(), f.Len(), f.Len())
		reflect.Copy(c, f)
		if l.elems != nil {
			for i := range c.Len() {
				copyLists(c.Index(i), l.elems, arena)
			}
		}
		f.Set(c)
	}
}
