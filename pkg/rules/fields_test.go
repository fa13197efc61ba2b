package rules

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// fill sets every exported field of v, at any depth, to a value that is
// not zero and differs from every other (lists of two entries), so that a
// field a copy loses, or shares, shows.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint8:
		v.SetUint(uint64(*n % 200))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), n)
			}
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(t, v.Index(i), n)
		}
	default:
		t.Fatalf("fill: no value for a %s", v.Type())
	}
}

// changeAll changes every entry of every list in v, at any depth.
func changeAll(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				changeAll(v.Field(i))
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			e := v.Index(i)
			if e.Kind() == reflect.String {
				e.SetString(e.String() + "-changed")
				continue
			}
			changeAll(e)
		}
	case reflect.Int64:
		v.SetInt(v.Int() + 1000)
	}
}

// TestCloneEveryField sets every field of a rule (every one the type has,
// so a field added later is covered with no edit here), clones it, and
// checks that the copy is equal and shares no list: changing every list
// entry of the copy leaves the original as it was.
func TestCloneEveryField(t *testing.T) {
	// Two fills give two equal rules that share nothing.
	var r, same Rule
	n, m := 0, 0
	fill(t, reflect.ValueOf(&r).Elem(), &n)
	fill(t, reflect.ValueOf(&same).Elem(), &m)
	before := Document{Version: 1, Rules: []Rule{same}}
	orig := Document{Version: 1, Rules: []Rule{r}}

	c := orig.clone()
	require.Equal(t, before.Rules, c.Rules)
	changeAll(reflect.ValueOf(&c.Rules[0]).Elem())
	require.NotEqual(t, before.Rules, c.Rules, "changeAll changed nothing")
	require.Equal(t, before.Rules, orig.Rules, "a clone shares a list with the rule it copies")

	// Every list of the table is set: none was skipped by fill.
	for _, name := range FieldNames() {
		require.NotEmpty(t, FieldValue(r, name), name)
	}
}

// TestSnapshotRulesAreCopies changes every list of the rules Snapshot.Rules
// returns and checks the snapshot's own are as they were.
func TestSnapshotRulesAreCopies(t *testing.T) {
	s := mustCompile(t, mustParse(t, pinnedDocuments["every field, token bucket"]))
	want := s.Rules()
	got := s.Rules()
	for i := range got {
		changeAll(reflect.ValueOf(&got[i]).Elem())
	}
	require.NotEqual(t, want, got)
	require.Equal(t, want, s.Rules())
}

// TestFieldNames checks the names messages use against the field table.
func TestFieldNames(t *testing.T) {
	var r Rule
	for _, c := range []struct {
		p    any
		want string
	}{
		{&r.ID, "id"}, {&r.Match, "match"}, {&r.Match.Hosts, "match.hosts"},
		{&r.Bypass.APIKeySHA256, "bypass.api_key_sha256"}, {&r.CountIf.Header, "count_if.header"},
		{&r.MinInterval, "min_interval"}, {&r.Tolerance, "tolerance"},
	} {
		require.Equal(t, c.want, r.name(c.p))
	}
	require.Equal(t, "rules", rulesField())
	require.Panics(t, func() { r.name(new(int64)) })
}
