package rules

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// Parse checks unknown fields on the YAML tree itself (one parse instead of
// two); it must find exactly what yaml.v3's strict decoder finds.
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
			var doc Document
			ours := notFound(mergeTypeErrors(root.Decode(&doc), unknownFields(root, documentType, nil)))
			dec := yaml.NewDecoder(bytes.NewReader([]byte(src)))
			dec.KnownFields(true)
			var ref Document
			require.Equal(t, notFound(dec.Decode(&ref)), ours)
		})
	}
}

// notFound lists the "field X not found" messages in a decode error.
func notFound(err error) []string {
	var te *yaml.TypeError
	out := []string{}
	if errors.As(err, &te) {
		for _, e := range te.Errors {
			if strings.Contains(e, "not found in type") {
				out = append(out, e)
			}
		}
	}
	return out
}
