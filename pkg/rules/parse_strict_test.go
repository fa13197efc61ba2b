package rules

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// Parse refuses exactly the unknown fields yaml.v3's strict decoder
// refuses, at the same lines, through anchors, aliases and merge keys, and
// names the nearest valid field.
func TestUnknownFieldsLikeStrictDecoder(t *testing.T) {
	for name, src := range map[string]string{
		"clean":                  versionBase,
		"top level":              "version: 1\nrulez: []\n",
		"rule":                   "version: 1\nrules:\n  - {id: a, foo: 1, bar: 2}\n",
		"match":                  "version: 1\nrules:\n  - {id: a, match: {host: [x], paths: [/]}}\n",
		"merge key":              "version: 1\nrules:\n  - &a {id: a, key: [ip], limit: 1}\n  - {<<: *a, id: b, nope: 1}\n",
		"unknown through merge":  "version: 1\nrules:\n  - &a {id: a, bogus: 1}\n  - {<<: *a, id: b}\n",
		"merge list":             "version: 1\nx: &x {id: a}\n",
		"merged match":           "version: 1\nrules:\n  - id: a\n    match: &m {hosts: [a.com], verbs: [GET]}\n  - id: b\n    match: {<<: *m}\n",
		"merge sequence":         "version: 1\nrules:\n  - &a {id: a}\n  - &b {limit: 3, zap: 1}\n  - {<<: [*a, *b], id: c}\n",
		"aliased rule":           "version: 1\nrules:\n  - &a {id: a, what: 1}\n  - *a\n",
		"aliased rules list":     "version: 1\nall: &l [{id: a, q: 1}]\nrules: *l\n",
		"scalar where a mapping": "version: 1\nrules:\n  - x\n",
		"duration field":         "version: 1\nrules:\n  - {id: a, window: {h: 1}}\n",
	} {
		t.Run(name, func(t *testing.T) {
			root, err := parseTree([]byte(src))
			require.NoError(t, err)
			_, errs := decodeDocument(root, len(src))
			ours := []string{}
			for _, e := range errs {
				if strings.HasPrefix(e.Msg, "unknown field") {
					ours = append(ours, fmt.Sprintf("line %d: field %s", e.Line, lastName(e.Field)))
				}
			}
			dec := yaml.NewDecoder(bytes.NewReader([]byte(src)))
			dec.KnownFields(true)
			var ref Document
			want := notFound(dec.Decode(&ref))
			slices.Sort(ours)
			slices.Sort(want)
			require.Equal(t, slices.Compact(want), ours)
		})
	}
	_, err := Parse([]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 1, window: 1s, windw: 2s}\n"))
	require.ErrorContains(t, err, `line 3: rule "a": windw: unknown field (did you mean window?)`)
}

func lastName(field string) string {
	if i := strings.LastIndexByte(field, '.'); i >= 0 {
		return field[i+1:]
	}
	return field
}

var notFoundMsg = regexp.MustCompile(`^(line \d+): field (\w+) not found in type`)

// notFound lists the "field X not found" messages in a decode error, as
// "line N: field X".
func notFound(err error) []string {
	var te *yaml.TypeError
	out := []string{}
	if errors.As(err, &te) {
		for _, e := range te.Errors {
			if m := notFoundMsg.FindStringSubmatch(e); m != nil {
				out = append(out, m[1]+": field "+m[2])
			}
		}
	}
	return out
}
