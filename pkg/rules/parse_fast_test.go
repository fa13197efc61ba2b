package rules

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// referenceDecode is what decodeTree must give: yaml.v3's strict decoder on
// the text, omitted costs defaulted.
func referenceDecode(t *testing.T, src string) (*Document, []string) {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader([]byte(src)))
	dec.KnownFields(true)
	var doc Document
	err := dec.Decode(&doc)
	if err == nil {
		root, perr := parseTreeSerial([]byte(src))
		require.NoError(t, perr)
		defaultCost(root, &doc)
		return &doc, nil
	}
	var te *yaml.TypeError
	require.True(t, errors.As(err, &te), "not a type error: %v", err)
	return nil, te.Errors
}

// The hand decoder takes documents of the plain shape and declines the
// rest; either way decodeTree gives what yaml.v3's strict decoder gives,
// document and error messages, with the rules in one piece or several.
func TestFastDecodeLikeYAML(t *testing.T) {
	rule := func(extra string) string {
		return "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 5, window: 1s" + extra + "}\n"
	}
	cases := []struct {
		name string
		src  string
		fast bool // decoded by hand
	}{
		{"full rule, block style", fullRule, true},
		{"ten rules, flow style", benchRules, true},
		{"match rules", matchRules, true},
		{"host rules", string(hostRulesYAML(50)), true},
		{"block items with comments", bigRules("# head\nversion: 1\nrules:\n", "# end\n", 20, blockItem), true},
		{"version last", bigRules("rules:\n", "version: 1\n", 5, flowItem), true},
		{"quoted strings", "version: 1\nrules:\n  - {id: \"a\", key: ['ip'], algorithm: \"sliding_log\", limit: 5, window: \"1s\", match: {methods: [\"get\"]}}\n", true},
		{"tagged string", rule(", scope: !!str pop"), true},
		{"empty lists", rule(", match: {hosts: [], path_prefix: [], methods: []}"), true},
		{"empty match", rule(", match: {}"), true},
		{"every field", rule(", burst: 7, cost: 0, min_interval: 250ms, shadow: true, scope: pop, disabled: false, behaviour: true"), true},
		{"negative and large numbers", rule(", burst: -3, cost: 999999999999999999"), true},
		{"no rules", "version: 1\n", true},
		{"empty rules", "version: 1\nrules: []\n", true},
		{"anchored rules list", "version: 1\nrules: &all\n  - {id: a, key: [ip]}\n", true},
		{"disabled only", "version: 1\nrules:\n  - {id: a, disabled: true}\n", true},

		{"null rules", "version: 1\nrules:\n", false},
		{"hex number", rule(", burst: 0x10"), false},
		{"octal number", rule(", burst: 0o17"), false},
		{"leading zero", rule(", burst: 010"), false},
		{"plus sign", rule(", burst: +5"), false},
		{"underscores", rule(", burst: 1_000"), false},
		{"overflow", rule(", burst: 9223372036854775808"), false},
		{"float", rule(", burst: 1.5"), false},
		{"quoted number", rule(", burst: \"5\""), false},
		{"tagged number", rule(", burst: !!int 5"), false},
		{"bool spelled True", rule(", shadow: True"), false},
		{"bool spelled yes", rule(", shadow: yes"), false},
		{"quoted bool", rule(", shadow: \"true\""), false},
		{"number as id", "version: 1\nrules:\n  - {id: 123, key: [ip]}\n", false},
		{"bool in a list", rule(", match: {methods: [true]}"), false},
		{"null window", rule(", min_interval: ~"), false},
		{"empty value", "version: 1\nrules:\n  - id: a\n    window:\n", false},
		{"bare number window", rule(", min_interval: 60"), false},
		{"bad duration", rule(", min_interval: soon"), false},
		{"scalar where a list", "version: 1\nrules:\n  - {id: a, key: ip}\n", false},
		{"list where a scalar", "version: 1\nrules:\n  - {id: [a]}\n", false},
		{"null match", rule(", match: ~"), false},
		{"scalar rule", "version: 1\nrules:\n  - a\n", false},
		{"unknown rule field", rule(", colour: red"), false},
		{"unknown match field", rule(", match: {host: [x]}"), false},
		{"unknown top-level field", "version: 1\nrulez: []\n", false},
		{"repeated field", "version: 1\nrules:\n  - {id: a, id: b}\n", false},
		{"repeated match field", rule(", match: {hosts: [a], hosts: [b]}"), false},
		{"repeated rules", "version: 1\nrules: []\nrules: []\n", false},
		{"merge key", "version: 1\nrules:\n  - &a {id: a, key: [ip], cost: 3}\n  - {<<: *a, id: b}\n", false},
		{"aliased rule", "version: 1\nrules:\n  - &a {id: a}\n  - *a\n", false},
		{"aliased list", "version: 1\nrules:\n  - {id: a, key: &k [ip]}\n  - {id: b, key: *k}\n", false},
		{"rules list by alias", "version: 1\nall: &l [{id: a}]\nrules: *l\n", false},
		{"version string", "version: \"1\"\nrules: []\n", false},
		{"flow top level", "{version: 1, rules: [{id: a}]}\n", true},
	}
	for _, f := range []string{"rules.yaml", "rules-cdn.yaml", "rules-cdn-region.yaml"} {
		data, err := os.ReadFile("../../examples/" + f)
		require.NoError(t, err)
		cases = append(cases, struct {
			name string
			src  string
			fast bool
		}{"examples/" + f, string(data), true})
	}
	prev := runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	defer runtime.GOMAXPROCS(prev)
	defer func(was int) { parallelRules = was }(parallelRules)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, err := parseTree([]byte(tc.src))
			require.NoError(t, err)
			var head Document
			seq, fast := fastHead(root, &head)
			if fast && seq != nil {
				_, fast = fastRules(seq.Content)
			}
			require.Equal(t, tc.fast, fast, "decoded by hand")

			want, wantErrs := referenceDecode(t, tc.src)
			for _, pieces := range []int{1 << 30, 1} { // one piece; one per CPU
				parallelRules = pieces
				var got Document
				err := decodeTree(root, &got)
				if wantErrs != nil {
					var te *yaml.TypeError
					require.True(t, errors.As(err, &te), "want %q, got %v", wantErrs, err)
					require.ElementsMatch(t, wantErrs, te.Errors)
					continue
				}
				require.NoError(t, err)
				require.Equal(t, *want, got)
			}
		})
	}
}

// A large document with one rule yaml.v3 must decode: that piece goes the
// slow way, the others the fast way, and the result is still the one the
// strict decoder gives (errors included).
func TestFastDecodeMixedPieces(t *testing.T) {
	prev := runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	defer runtime.GOMAXPROCS(prev)
	defer func(was int) { parallelRules = was }(parallelRules)
	parallelRules = 32
	for name, odd := range map[string]string{
		"hex limit":     "  - {id: odd, key: [ip], algorithm: fixed_window, limit: 0x20, window: 1s}\n",
		"unknown field": "  - {id: odd, key: [ip], colour: red}\n",
		"bad duration":  "  - {id: odd, key: [ip], window: 10}\n",
	} {
		t.Run(name, func(t *testing.T) {
			src := bigRules("version: 1\nrules:\n", odd, 100, flowItem) + bigRules("", "", 100, func(i int) string { return flowItem(i + 1000) })
			root, err := parseTree([]byte(src))
			require.NoError(t, err)
			want, wantErrs := referenceDecode(t, src)
			var got Document
			err = decodeTree(root, &got)
			if wantErrs != nil {
				var te *yaml.TypeError
				require.True(t, errors.As(err, &te), "%v", err)
				require.Equal(t, wantErrs, te.Errors)
				require.Contains(t, fmt.Sprint(te.Errors), "line 103")
				return
			}
			require.NoError(t, err)
			require.Equal(t, *want, got)
			require.Len(t, got.Rules, 201)
			require.True(t, strings.HasPrefix(got.Rules[100].ID, "odd"))
		})
	}
}
