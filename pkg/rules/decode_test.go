package rules

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// yamlDecode is the document yaml.v3's strict decoder makes of src, omitted
// costs defaulted, or nil when it refuses src or src is not a document
// Parse would go on to validate (no version 1). It is the reference the
// decoder is held to.
func yamlDecode(src []byte) *Document {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	var doc Document
	if err := dec.Decode(&doc); err != nil {
		return nil
	}
	root, err := parseTree(src)
	if err != nil || checkVersion(root) != nil {
		return nil
	}
	var costs struct {
		Rules []struct {
			Cost *int64 `yaml:"cost"`
		} `yaml:"rules"`
	}
	if root.Decode(&costs) == nil && len(costs.Rules) == len(doc.Rules) {
		for i, c := range costs.Rules {
			if c.Cost == nil {
				doc.Rules[i].Cost = 1
			}
		}
	}
	return &doc
}

// checkDecode requires the decoder to take what yaml.v3's strict decoder
// takes, giving the same document, and to refuse what it refuses. It
// reports whether yaml.v3 took src.
func checkDecode(t *testing.T, src []byte) bool {
	t.Helper()
	want := yamlDecode(src)
	root, err := parseTree(src)
	if err != nil || checkVersion(root) != nil {
		require.Nil(t, want, "yaml.v3 took a document Parse refuses:\n%s", src)
		return false
	}
	got, errs := decodeDocument(root, len(src))
	if want != nil && len(errs) > 0 && deliberate(errs) {
		return false // stricter than yaml.v3 on purpose
	}
	if want == nil {
		require.NotEmpty(t, errs, "decoded a document yaml.v3 refuses:\n%s", src)
		return false
	}
	require.Empty(t, errs, "refused a document yaml.v3 takes:\n%s", src)
	require.Equal(t, *want, *got, "decoded differently from yaml.v3:\n%s", src)
	return true
}

// Documents in every spelling YAML allows for them, and many it refuses:
// the decoder takes and gives what yaml.v3's strict decoder does.
func TestDecodeLikeYAML(t *testing.T) {
	rule := func(extra string) string {
		return "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 5, window: 1s" + extra + "}\n"
	}
	block := func(fields string) string {
		return "version: 1\nrules:\n  - id: a\n    key: [ip]\n    algorithm: sliding_log\n    limit: 5\n    window: 1s\n" + fields
	}
	cases := []struct {
		name    string
		src     string
		scanned bool
	}{
		{"full rule, block style", fullRule, true},
		{"ten rules, flow style", benchRules, true},
		{"match rules", matchRules, true},
		{"host rules", string(hostRulesYAML(50)), true},
		{"block items with comments", bigRules("# head\nversion: 1\nrules:\n", "# end\n", 20, blockItem), true},
		{"version last", bigRules("rules:\n", "version: 1\n", 5, flowItem), true},
		{"quoted strings", "version: 1\nrules:\n  - {id: \"a\", key: ['ip'], algorithm: \"sliding_log\", limit: 5, window: \"1s\", match: {methods: [\"get\"]}}\n", true},
		{"empty lists", rule(", match: {hosts: [], path_prefix: [], methods: []}"), true},
		{"empty match", rule(", match: {}"), true},
		{"every field", rule(", burst: 7, cost: 0, min_interval: 250ms, shadow: true, scope: pop, disabled: false, behaviour: true, metrics: true"), true},
		{"negative and large numbers", rule(", burst: -3, cost: 999999999999999999"), true},
		{"zero", rule(", burst: 0, cost: -0"), true},
		{"no rules", "version: 1\n", true},
		{"empty rules", "version: 1\nrules: []\n", true},
		{"flow rules list", "version: 1\nrules: [{id: a, key: [ip]}, {id: b, disabled: true}]  # two\n", true},
		{"disabled only", "version: 1\nrules:\n  - {id: a, disabled: true}\n", true},
		{"empty rule", "version: 1\nrules:\n  - {}\n", true},
		{"sequence at the key's column", "version: 1\nrules:\n- id: a\n  key:\n  - ip\n  - host\n  match:\n    hosts:\n    - a.example\n    methods: [GET]\n- {id: b, disabled: true}\n", true},
		{"block lists indented", block("    match:\n        hosts:\n          - a.example\n          - 'b.example'\n        path_prefix:\n          - /api\n"), true},
		{"comments everywhere", "# top\nversion: 1 # v\n\n# before\nrules: # list\n  # first\n  - id: a # id\n    # inside\n    key: [ip] # key\n        # deeper\n    algorithm: sliding_log\n    limit: 5   # five\n    window: \"1s\"   # quoted\n# after\n", true},
		{"comment with UTF-8", "# règles — 100 000 clients 🚀\nversion: 1\nrules: []\n", true},
		{"CRLF", "version: 1\r\nrules:\r\n  - id: a\r\n    key: [ip]\r\n    match: {hosts: [a.example]}\r\n", true},
		{"document start marker", "---\nversion: 1\nrules: []\n", true},
		{"document start marker and comment", "# c\n--- # start\nversion: 1\nrules: []\n", true},
		{"colon inside a block value", "version: 1\nrules:\n  - id: a\n    key:\n      - header:X-API-Key\n", true},
		{"hash inside a value", "version: 1\nrules:\n  - {id: a#b, key: [ip]}\n", true},
		{"spaces inside a value", "version: 1\nrules:\n  - {id: a  b , key: [ ip ,  host ]}\n", true},
		{"strings that look like other words", "version: 1\nrules:\n  - {id: yes, algorithm: no, scope: on, key: [off, y, n, nulls, trueish, Null_, '~', 'null']}\n", true},
		{"durations", rule(", min_interval: 1h30m10.5s") + "  - {id: b, window: 0.5s, min_interval: 100ns}\n  - {id: c, window: 3us}\n", true},
		{"behaviour section first", "behaviour:\n  mode: shadow\n  horizon: 30s\n  # tuned in shadow\n  weights: {scan: 2}\nversion: 1\nrules:\n  - {id: a, key: [ip], behaviour: true}\n", true},
		{"behaviour section last", "version: 1\nrules:\n  - {id: a, key: [ip]}\nbehaviour:\n  mode: enforce\n# a comment at column 0\n  levels:\n    blocked: {block: true}\n", true},
		{"behaviour section between", "version: 1\nbehaviour: {mode: shadow}\nrules: []\n", true},
		{"invalid behaviour values", "version: 1\nbehaviour:\n  mode: loud\nrules: []\n", true},
		{"no space after dash content", "version: 1\nrules:\n  -   id: a\n      key: [ip]\n  -    {id: b}\n", true},

		// Outside the line-per-field spellings; yaml.v3 takes some, refuses others.
		{"unknown behaviour field", "version: 1\nbehaviour:\n  mode: shadow\n  loud: true\nrules: []\n", false},
		{"behaviour twice", "version: 1\nbehaviour: {mode: shadow}\nbehaviour: {mode: enforce}\nrules: []\n", false},
		{"null behaviour", "version: 1\nbehaviour:\nrules: []\n", false},
		{"behaviour of the wrong type", "version: 1\nbehaviour: [shadow]\nrules: []\n", false},
		{"tagged string", rule(", scope: !!str pop"), false},
		{"null rules", "version: 1\nrules:\n", false},
		{"null rules at the end", "rules: []\nversion: 1\nrules:\n", false},
		{"hex number", rule(", burst: 0x10"), false},
		{"octal number", rule(", burst: 0o17"), false},
		{"leading zero", rule(", burst: 010"), false},
		{"plus sign", rule(", burst: +5"), false},
		{"underscores", rule(", burst: 1_000"), false},
		{"overflow", rule(", burst: 9223372036854775808"), false},
		{"float", rule(", burst: 1.5"), false},
		{"exponent", rule(", burst: 1e3"), false},
		{"quoted number", rule(", burst: \"5\""), false},
		{"tagged number", rule(", burst: !!int 5"), false},
		{"bool spelled True", rule(", shadow: True"), false},
		{"bool spelled yes", rule(", shadow: yes"), false},
		{"quoted bool", rule(", shadow: \"true\""), false},
		{"number as id", "version: 1\nrules:\n  - {id: 123, key: [ip]}\n", false},
		{"timestamp as id", "version: 1\nrules:\n  - {id: 2024-01-02, key: [ip]}\n", false},
		{"float as id", "version: 1\nrules:\n  - {id: .5, key: [ip]}\n", false},
		{"infinity as id", "version: 1\nrules:\n  - {id: .inf, key: [ip]}\n", false},
		{"bool as id", "version: 1\nrules:\n  - {id: TRUE, key: [ip]}\n", false},
		{"bool in a list", rule(", match: {methods: [true]}"), false},
		{"null in a list", rule(", match: {methods: [~]}"), false},
		{"null window", rule(", min_interval: ~"), false},
		{"empty value", "version: 1\nrules:\n  - id: a\n    window:\n", false},
		{"empty flow value", "version: 1\nrules:\n  - {id: a, window: }\n", false},
		{"bare number window", rule(", min_interval: 60"), false},
		{"zero window", rule(", min_interval: 0"), false},
		{"bad duration", rule(", min_interval: soon"), false},
		{"scalar where a list", "version: 1\nrules:\n  - {id: a, key: ip}\n", false},
		{"list where a scalar", "version: 1\nrules:\n  - {id: [a]}\n", false},
		{"null match", rule(", match: ~"), false},
		{"scalar rule", "version: 1\nrules:\n  - a\n", false},
		{"nested list", "version: 1\nrules:\n  - - a\n", false},
		{"unknown rule field", rule(", colour: red"), false},
		{"unknown block rule field", block("    behaviour_opt_in: true\n"), false},
		{"unknown match field", rule(", match: {host: [x]}"), false},
		{"unknown top-level field", "version: 1\nrulez: []\n", false},
		{"unknown top-level section", "version: 1\nlimits:\n  mode: x\nrules: []\n", false},
		{"repeated field", "version: 1\nrules:\n  - {id: a, id: b}\n", false},
		{"repeated block field", block("    limit: 6\n"), false},
		{"repeated match field", rule(", match: {hosts: [a], hosts: [b]}"), false},
		{"repeated rules", "version: 1\nrules: []\nrules: []\n", false},
		{"repeated version", "version: 1\nversion: 1\nrules: []\n", false},
		{"merge key", "version: 1\nrules:\n  - &a {id: a, key: [ip], cost: 3}\n  - {<<: *a, id: b}\n", false},
		{"anchored rules list", "version: 1\nrules: &all\n  - {id: a, key: [ip]}\n", false},
		{"aliased rule", "version: 1\nrules:\n  - &a {id: a}\n  - *a\n", false},
		{"aliased list", "version: 1\nrules:\n  - {id: a, key: &k [ip]}\n  - {id: b, key: *k}\n", false},
		{"rules list by alias", "version: 1\nall: &l [{id: a}]\nrules: *l\n", false},
		{"version string", "version: \"1\"\nrules: []\n", false},
		{"version 2", "version: 2\nrules: []\n", false},
		{"no version", "rules: []\n", false},
		{"flow top level", "{version: 1, rules: [{id: a}]}\n", false},
		{"indented top level", "  version: 1\n  rules: []\n", false},
		{"quoted key", "version: 1\nrules:\n  - {\"id\": a}\n", false},
		{"flow key without space", "version: 1\nrules:\n  - {id:a}\n", false},
		{"flow rule over two lines", "version: 1\nrules:\n  - {id: a,\n     key: [ip]}\n", false},
		{"flow list over two lines", "version: 1\nrules:\n  - id: a\n    key: [ip,\n      host]\n", false},
		{"trailing comma", "version: 1\nrules:\n  - {id: a, key: [ip,]}\n", false},
		{"multi-line plain scalar", "version: 1\nrules:\n  - id: a\n    algorithm: sliding\n      _log\n", false},
		{"multi-line quoted scalar", "version: 1\nrules:\n  - id: \"a\n    b\"\n", false},
		{"block scalar", "version: 1\nrules:\n  - id: |\n      a\n", false},
		{"escape", "version: 1\nrules:\n  - {id: \"a\\u0041\"}\n", false},
		{"escaped single quote", "version: 1\nrules:\n  - {id: 'a''b'}\n", false},
		{"tab", "version: 1\nrules:\n  - {id: a,\tkey: [ip]}\n", false},
		{"tab indentation", "version: 1\nrules:\n\t- {id: a}\n", false},
		{"non-ASCII value", "version: 1\nrules:\n  - {id: café}\n", false},
		{"lone CR in a comment", "version: 1 # a\rrules: []\nrules: []\n", false},
		{"NEL in a comment", "version: 1\n# a\u0085rules: []\nrules: []\n", false},
		{"BOM", "\ufeffversion: 1\nrules: []\n", false},
		{"invalid UTF-8 in a comment", "version: 1\n# \xff\nrules: []\n", false},
		{"second document", "version: 1\nrules: []\n---\nversion: 1\n", false},
		{"document end marker", "version: 1\nrules: []\n...\n", false},
		{"directive", "%YAML 1.2\n---\nversion: 1\nrules: []\n", false},
		{"wildcard host unquoted", rule(", match: {hosts: [*.example.com]}"), false},
		{"colon in a flow value", "version: 1\nrules:\n  - {id: a, key: [header:X]}\n", false},
		{"key-value in a block list", "version: 1\nrules:\n  - id: a\n    key:\n      - a: b\n", false},
		{"deeper line after a value", "version: 1\nrules:\n  - id: a\n    key: [ip]\n      limit: 5\n", false},
		{"line between item and key column", "version: 1\nrules:\n  - id: a\n   key: [ip]\n", false},
		{"dash alone", "version: 1\nrules:\n  -\n    id: a\n", false},
		{"empty document", "# nothing\n", false},
		{"sequence under a scalar key", "version:\n  - 1\nrules: []\n", false},
		{"match as a list", "version: 1\nrules:\n  - id: a\n    match:\n      - hosts: [a]\n", false},
		{"complex key", "version: 1\nrules:\n  - ? id\n    : a\n", false},
	}
	for _, f := range []string{"rules.yaml", "rules-cdn.yaml", "rules-cdn-region.yaml"} {
		data, err := os.ReadFile("../../examples/" + f)
		require.NoError(t, err)
		cases = append(cases, struct {
			name    string
			src     string
			scanned bool
		}{"examples/" + f, string(data), true})
		// What the edge writes to its rules cache: yaml.v3's own output.
		doc, err := Parse(data)
		require.NoError(t, err)
		out, err := yaml.Marshal(doc)
		require.NoError(t, err)
		cases = append(cases, struct {
			name    string
			src     string
			scanned bool
		}{"examples/" + f + " marshaled", string(out), true})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkDecode(t, []byte(tc.src))
		})
	}
}

// Random documents in many spellings, valid or not: the decoder takes and
// gives what yaml.v3's strict decoder does. The generator writes both
// documents yaml.v3 takes and ones it refuses, so the test fails if either
// side stops being exercised.
func TestDecodeRandomLikeYAML(t *testing.T) {
	seed := uint64(17)
	rng := rand.New(rand.NewPCG(seed, seed))
	n := randomDocs
	var took, refused int
	for i := range n {
		if checkDecode(t, randomYAML(rng)) {
			took++
		} else {
			refused++
		}
		if t.Failed() {
			t.Fatalf("document %d (seed %d)", i, seed)
		}
	}
	t.Logf("%d documents: yaml.v3 took %d, refused %d", n, took, refused)
	require.Greater(t, took, n/4, "too few documents taken: the test checks little")
	require.Greater(t, refused, n/20, "too few documents refused: the odd spellings are not exercised")
}

// FuzzDecodeLikeYAML: whatever the text, the decoder takes and gives what
// yaml.v3's strict decoder does.
func FuzzDecodeLikeYAML(f *testing.F) {
	for _, seed := range []string{fullRule, benchRules, matchRules, string(hostRulesYAML(3)),
		bigRules("# head\nversion: 1\nrules:\n", "# end\n", 3, blockItem),
		"version: 1\nrules:\n- id: a\n  key:\n  - ip\n",
		"version: 1\nrules: [{id: a, key: [ip]}]\n",
	} {
		f.Add([]byte(seed))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		f.Add(randomYAML(rng))
	}
	f.Fuzz(func(t *testing.T, src []byte) { checkDecode(t, src) })
}

// randomYAML writes a rules document: mostly the subset in its
// spellings (block or flow, quoting, comments, indentation, list styles),
// now and then with a value, key or layout outside it.
func randomYAML(rng *rand.Rand) []byte {
	pick := func(s ...string) string { return s[rng.IntN(len(s))] }
	odd := func(p float64) bool { return rng.Float64() < p }
	// Half the documents keep to the subset; in the others, spellings
	// outside it are three times as likely as the rates below.
	outside := odd(0.5)
	weird := func(p float64) bool { return outside && odd(3*p) }
	var b strings.Builder
	comment := func() string {
		switch {
		case weird(0.02):
			return "#notacomment"
		case odd(0.2):
			return pick(" # note", "   #x", " # été ✓")
		}
		return ""
	}
	if odd(0.1) {
		b.WriteString(pick("# rules\n", "---\n", "\n", "--- # start\n"))
	}
	top := pick("", "  ", "    ", "\t")
	if !weird(0.05) {
		top = ""
	}
	version := "1"
	if weird(0.05) {
		version = pick("2", "\"1\"", "01", "1.0", "0x1", "~")
	}
	writeVersion := func() { fmt.Fprintf(&b, "%sversion: %s%s\n", top, version, comment()) }
	versionFirst := odd(0.8)
	if versionFirst && !weird(0.02) {
		writeVersion()
	}
	str := func(plain ...string) string {
		v := pick(plain...)
		switch {
		case weird(0.03):
			v = pick("yes", "no", "on", "true", "False", "null", "~", "", "123", "-3", "1e3", "0x1f", ".5", ".inf",
				"2024-01-02", "1_000", "a: b", "a:b", "a #b", "a#b", "*.x.example", "&a x", "!x", "'q''q'",
				"\"q\\tq\"", "a, b", "[a]", "{a: b}", "é", "-", "- a", "? a", "|", ">", "@a", "`a", "%a", "a\tb",
				"<<", "<a", "y", "N", "O")
		case odd(0.15):
			v = "'" + v + "'"
		case odd(0.15):
			v = "\"" + v + "\""
		}
		return v
	}
	integer := func() string {
		if weird(0.05) {
			return pick("0", "-0", "-3", "+5", "010", "0x10", "1_000", "1.5", "\"5\"", "9223372036854775807",
				"999999999999999999", "1e3", "true", "~", "five", "0o7", "0b1")
		}
		return fmt.Sprint(rng.IntN(100000) + 1)
	}
	duration := func() string {
		if weird(0.05) {
			return pick("60", "0", "soon", "~", "1.5s", "1h30m", "250ms", "100ns", "3us", "\"1m\"", "'2s'", "-1s", "1d", "2024-01-02")
		}
		return pick("1s", "1m", "10s", "1h")
	}
	boolean := func() string {
		if weird(0.05) {
			return pick("True", "yes", "on", "\"true\"", "1", "~", "FALSE", "n")
		}
		return pick("true", "false")
	}
	list := func(values func() string, n int, indent string, flow bool) string {
		items := make([]string, n)
		for i := range items {
			items[i] = values()
		}
		if flow || n == 0 {
			sep := pick(", ", ",", " , ", ",  ")
			body := strings.Join(items, sep)
			if odd(0.1) {
				body = " " + body + " "
			}
			if weird(0.01) {
				body += ","
			}
			return "[" + body + "]"
		}
		var lb strings.Builder
		for _, it := range items {
			fmt.Fprintf(&lb, "\n%s- %s%s", indent, it, comment())
		}
		return lb.String()
	}
	host := func() string {
		return str(fmt.Sprintf("site%d.example.com", rng.IntN(1000)), "\"*.cdn.example\"", "API.example.com")
	}
	prefix := func() string { return str("/api", "/login", "/v1/users", "/") }
	method := func() string { return str("GET", "post", "PUT") }
	desc := func() string { return str("ip", "host", "path", "\"header:X-API-Key\"", "\"query:q\"") }

	// field renders one rule field (flow or block); indent is the rule's
	// key column (block only).
	field := func(name, indent string, flow bool) string {
		lists := func(values func() string) string {
			n := rng.IntN(3)
			if odd(0.2) {
				n = 0
			}
			sub := indent + pick("  ", "  ", "    ", "")
			if flow || odd(0.5) {
				return " " + list(values, n, "", true)
			}
			return list(values, max(n, 1), sub, false)
		}
		switch name {
		case "id":
			return " " + str(fmt.Sprintf("rule-%d", rng.IntN(1e6)), "per-ip", "a.b_c")
		case "algorithm":
			return " " + str("sliding_log", "token_bucket", "fixed_window", "sliding_window", "concurrency")
		case "scope":
			return " " + str("region", "pop")
		case "limit", "burst", "cost":
			return " " + integer()
		case "window", "min_interval":
			return " " + duration()
		case "shadow", "disabled", "behaviour":
			return " " + boolean()
		case "key":
			return lists(desc)
		case "match":
			names := []string{"hosts", "path_prefix", "methods"}
			rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
			names = names[:rng.IntN(4)]
			if weird(0.02) {
				names = append(names, pick("hosts", "host", "behaviour"))
			}
			values := map[string]func() string{"hosts": host, "path_prefix": prefix, "methods": method, "host": host, "behaviour": method}
			if flow || odd(0.4) {
				parts := make([]string, len(names))
				for i, n := range names {
					parts[i] = n + ": " + list(values[n], rng.IntN(3), "", true)
				}
				return " {" + strings.Join(parts, ", ") + "}"
			}
			if len(names) == 0 {
				return " {}"
			}
			sub := indent + pick("  ", "    ", " ")
			var mb strings.Builder
			for _, n := range names {
				v := " " + list(values[n], rng.IntN(3), "", true)
				if odd(0.5) {
					v = list(values[n], rng.IntN(3)+1, sub+pick("  ", "", "    "), false)
				}
				fmt.Fprintf(&mb, "\n%s%s:%s", sub, n, v)
			}
			return mb.String()
		}
		return " " + pick("red", "1", "[x]", "true")
	}
	fieldNames := []string{"id", "match", "key", "algorithm", "limit", "window", "burst", "cost", "min_interval", "shadow", "scope", "disabled", "behaviour"}
	rule := func(seqIndent string) string {
		names := []string{"id"}
		for _, n := range fieldNames[1:] {
			if odd(0.5) {
				names = append(names, n)
			}
		}
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		if weird(0.02) {
			names = append(names, pick("id", "limit", "colour", "behaviour", "version"))
		}
		dash := seqIndent + "-" + pick(" ", " ", " ", "   ")
		if odd(0.4) {
			parts := make([]string, len(names))
			for i, n := range names {
				parts[i] = n + ":" + field(n, "", true)
			}
			return dash + "{" + strings.Join(parts, pick(", ", ",")) + "}" + comment() + "\n"
		}
		indent := strings.Repeat(" ", len(dash))
		var rb strings.Builder
		for i, n := range names {
			lead := indent
			if i == 0 {
				lead = dash
			}
			v := field(n, indent, false)
			if !strings.HasPrefix(v, "\n") {
				v += comment()
			}
			fmt.Fprintf(&rb, "%s%s:%s\n", lead, n, v)
			if odd(0.05) {
				rb.WriteString(pick("\n", indent+"# about it\n", "# col 0\n", indent+"    # deeper\n"))
			}
			if weird(0.003) {
				rb.WriteString(indent + "  continued\n")
			}
		}
		return rb.String()
	}
	switch {
	case weird(0.01):
		fmt.Fprintf(&b, "%srules:\n", top)
	case odd(0.1):
		parts := make([]string, rng.IntN(3))
		for i := range parts {
			parts[i] = "{id: r" + fmt.Sprint(i) + ", key: [ip]}"
		}
		fmt.Fprintf(&b, "%srules: [%s]%s\n", top, strings.Join(parts, ", "), comment())
	default:
		fmt.Fprintf(&b, "%srules:%s\n", top, comment())
		seqIndent := top + pick("  ", "", "    ", " ")
		for range rng.IntN(5) + 1 {
			b.WriteString(rule(seqIndent))
		}
	}
	if !versionFirst {
		writeVersion()
	}
	if weird(0.02) {
		b.WriteString(pick("extra: 1\n", "rules: []\n", "---\nversion: 1\n", "...\n", "behaviour:\n  x: 1\n"))
	}
	out := b.String()
	if odd(0.05) {
		out = strings.ReplaceAll(out, "\n", "\r\n")
	}
	return []byte(out)
}

// deliberate reports whether every problem is one yaml.v3 lets pass and
// the decoder refuses on purpose: a fraction where an integer goes (yaml.v3
// cuts it off), an empty entry in a list, an empty key (yaml.v3 drops them).
func deliberate(errs []*FieldError) bool {
	for _, e := range errs {
		_, got, _ := strings.Cut(e.Msg, ", got ")
		f, err := strconv.ParseFloat(strings.Trim(got, `"`), 64)
		fraction := strings.HasPrefix(e.Msg, "want an integer") && err == nil && f != float64(int64(f))
		if !fraction && got != "an empty entry" && e.Msg != "a key must be a field name, got nothing" {
			return false
		}
	}
	return true
}

// bigRules is a document of n rules written by item, with head and tail.
func bigRules(head, tail string, n int, item func(i int) string) string {
	var b strings.Builder
	b.WriteString(head)
	for i := range n {
		b.WriteString(item(i))
	}
	b.WriteString(tail)
	return b.String()
}

func flowItem(i int) string {
	return fmt.Sprintf("  - {id: site%d, match: {hosts: [site%d.example.com], path_prefix: [/api]}, key: [ip, host], algorithm: token_bucket, limit: 100, window: 1s}\n", i, i)
}

func blockItem(i int) string {
	return fmt.Sprintf("  # customer %d\n  - id: site%d\n    match:\n      hosts: [site%d.example.com]\n    key: [ip]\n    algorithm: sliding_window\n    limit: %d\n    window: 1m\n\n", i, i, i, i+1)
}

// Merge keys that merge merge keys are refused, not expanded for ever:
// the decoding budget (limits.go) stops them at the rule whose merge went
// over it.
func TestMergeBombRefused(t *testing.T) {
	src := "version: 1\nrules:\n  - &a0 {id: a}\n"
	prev := "a0"
	for i := 1; i < 30; i++ {
		name := "a" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		src += "  - &" + name + " {<<: [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]}\n"
		prev = name
	}
	src += "  - {<<: *" + prev + ", id: b}\n"
	_, err := Parse([]byte(src))
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorContains(t, err, "line 12:") // the first rule whose merges went over the budget
}
