package edge

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// fieldDocs reads the doc comments of a struct type's fields from the Go
// source of its package, by YAML name: field comments double as the
// user's documentation.
func fieldDocs(t *testing.T, dir, typeName string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	out := map[string]string{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != typeName {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			require.True(t, ok, "%s is not a struct", typeName)
			for _, fl := range st.Fields.List {
				if fl.Tag == nil {
					continue
				}
				tag := reflect.StructTag(strings.Trim(fl.Tag.Value, "`"))
				name, _, _ := strings.Cut(tag.Get("yaml"), ",")
				if name == "" || name == "-" {
					continue
				}
				out[name] = strings.Join(strings.Fields(fl.Doc.Text()), " ")
			}
			return false
		})
	}
	require.NotEmpty(t, out, "no fields of %s in %s", typeName, dir)
	return out
}

// yamlFields lists a struct type's YAML field names and Go types in
// declaration order.
func yamlFields(typ reflect.Type) (names, types []string) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		names = append(names, name)
		types = append(types, typeName(f.Type))
	}
	return names, types
}

func typeName(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[rules.Duration]() || t.String() == "time.Duration":
		return "duration"
	case t.Implements(reflect.TypeFor[encoding.TextMarshaler]()):
		return "string"
	case t.Kind() == reflect.Slice:
		return "list of " + typeName(t.Elem())
	case t.Kind() == reflect.Pointer:
		return typeName(t.Elem())
	case t.Kind() == reflect.Struct:
		return "mapping"
	case t.Kind() == reflect.Float64:
		return "number"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return "integer"
	default:
		return t.Kind().String()
	}
}

func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// ruleFieldsExtra describes the rule fields whose Go declaration carries no
// comment of its own, or one written for Go callers.
var ruleFieldsExtra = map[string]string{
	"id":           "The rule's name: unique in a document, the `rule` label (with `metrics: true`), the RateLimit field's policy name and the prefix of its Redis keys. A region document overrides the global rule with the same id.",
	"match":        "Which requests the rule applies to (hosts, path_prefix, methods; every list optional, empty matches anything).",
	"key":          "What is counted per: `ip` (IPv6 by --ipv6-prefix), `host`, `header:NAME`, `query:NAME`, …; several make a composite key. A request without a key's value skips the rule.",
	"algorithm":    "How it counts: " + strings.Join(limit.Names(), ", ") + ".",
	"limit":        "Units admitted per window (for concurrency: slots held at once).",
	"window":       "The window (token_bucket: the refill period of limit tokens; concurrency: how long a slot outlives an edge that never released it).",
	"cost":         "Units one request takes (default 1).",
	"burst":        "token_bucket and leaky_bucket: the bucket's capacity (default: limit).",
	"min_interval": "sliding_log only: the least time between two admissions of one key, within the limit.",
	"shadow":       "Count, log and export decisions, never deny: a rule being tried out.",
	"scope":        "Where counters live: `region` (default: the region's Redis, shared by its PoPs), `pop` (per PoP) or `global` (one quota across regions, leased from the key's home region; fixed_window only; docs/guarantees.md).",
	"hosts":        "Exact host names, or `*.example.com` for any subdomain (not the apex).",
	"methods":      "HTTP methods (upper case).",
}

// shedderFieldsExtra describes the shedder fields whose Go declaration
// carries no comment of its own.
var shedderFieldsExtra = map[string]string{
	"prefix": "The path prefix (whole segments) or API-key prefix the rule matches.",
	"tier":   "The tier it grants: critical, write, read or test.",
}

// rulesReference is the rule-field table: every YAML field of a rule and of
// its match, from pkg/rules' types.
func rulesReference(t *testing.T) string {
	dir := filepath.Join("..", "..", "pkg", "rules")
	var b strings.Builder
	b.WriteString("# Rule fields\n\nGenerated from pkg/rules (`go test ./internal/edge -run TestReferenceDocs -update-reference`).\n" +
		"A rules document is `version: 1`, a `rules:` list and an optional `behaviour:` section ([behaviour layer](../behaviour.md)); " +
		"`regionctl rules validate FILE` checks one offline.\n\n")
	for _, tc := range []struct {
		title, typ string
		rt         reflect.Type
	}{
		{"Rule (`rules:` items)", "Rule", reflect.TypeFor[rules.Rule]()},
		{"Match (`match:`)", "MatchSpec", reflect.TypeFor[rules.MatchSpec]()},
		{"Bypass (`bypass:`, see [escapes](../escapes.md))", "Bypass", reflect.TypeFor[rules.Bypass]()},
		{"Override (`overrides:` items)", "Override", reflect.TypeFor[rules.Override]()},
		{"Count by the response (`count_if:`)", "CountIf", reflect.TypeFor[rules.CountIf]()},
	} {
		docs := fieldDocs(t, dir, tc.typ)
		fmt.Fprintf(&b, "## %s\n\n| field | type | meaning |\n|---|---|---|\n", tc.title)
		names, types := yamlFields(tc.rt)
		for i, n := range names {
			d := ""
			if tc.typ == "Rule" || tc.typ == "MatchSpec" {
				d = ruleFieldsExtra[n] // where the Go comment speaks to Go callers
			}
			if d == "" {
				d = docs[n]
			}
			require.NotEmpty(t, d, "rule field %q has neither a doc comment in pkg/rules nor a description in ruleFieldsExtra", n)
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", n, types[i], cell(d))
		}
		b.WriteString("\n")
	}
	b.WriteString("## Algorithms\n\n| algorithm | `burst` | `min_interval` |\n|---|---|---|\n")
	for _, a := range limit.All() {
		s := a.Spec()
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", s.Name, yesNo(s.Burst), yesNo(s.MinInterval))
	}
	b.WriteString(rulesLimitsReference())
	return b.String()
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "refused"
}

// shedderReference is the shedder-settings table: every field of
// shedder.Config (and its tiers), its default and its doc comment.
func shedderReference(t *testing.T) string {
	dir := filepath.Join("..", "..", "pkg", "shedder")
	raw, err := json.Marshal(shedder.DefaultConfig())
	require.NoError(t, err)
	var defaults map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &defaults))
	var b strings.Builder
	b.WriteString("# Shedder settings\n\nGenerated from pkg/shedder (`go test ./internal/edge -run TestReferenceDocs -update-reference`).\n" +
		"The settings of a region live in Consul (`regionctl shedder set --region R key=value…`) or in the `--shedder` file (JSON or YAML); " +
		"unknown keys are refused with the nearest valid name, and so are keys in another case (`ENABLED`) and a key given twice: " +
		"the edges and regionctl read the document one way (pkg/strictjson). A document missing from Consul leaves the settings in force " +
		"(`regionctl shedder set --region R --reset` writes the defaults).\n\n")
	section := func(title, typ string, rt reflect.Type, defaults map[string]json.RawMessage, prefix string) {
		docs := fieldDocs(t, dir, typ)
		fmt.Fprintf(&b, "## %s\n\n| setting | type | default | meaning |\n|---|---|---|---|\n", title)
		names, types := yamlFields(rt)
		for i, n := range names {
			if docs[n] == "" {
				docs[n] = shedderFieldsExtra[n]
			}
			require.NotEmpty(t, docs[n], "shedder setting %q has neither a doc comment in pkg/shedder nor a description in shedderFieldsExtra", n)
			def := ""
			if v, ok := defaults[n]; ok && types[i] != "mapping" {
				var c bytes.Buffer
				require.NoError(t, json.Compact(&c, v))
				def = "`" + c.String() + "`"
			}
			fmt.Fprintf(&b, "| `%s%s` | %s | %s | %s |\n", prefix, n, types[i], cell(def), cell(docs[n]))
		}
		b.WriteString("\n")
	}
	section("Settings", "Config", reflect.TypeFor[shedder.Config](), defaults, "")
	var tiers map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(defaults["tiers"], &tiers))
	section("Classification (`tiers`)", "TierConfig", reflect.TypeFor[shedder.TierConfig](), tiers, "tiers.")
	section("Prefix rules (`tiers.paths`, `tiers.api_keys` items)", "PrefixRule", reflect.TypeFor[shedder.PrefixRule](), nil, "")
	var adaptive, shares map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(defaults["adaptive"], &adaptive))
	require.NoError(t, json.Unmarshal(adaptive["shares"], &shares))
	section("Adaptive origin limit (`adaptive`)", "AdaptiveConfig", reflect.TypeFor[shedder.AdaptiveConfig](), adaptive, "adaptive.")
	section("Guaranteed shares (`adaptive.shares`)", "TierShares", reflect.TypeFor[shedder.TierShares](), shares, "adaptive.shares.")
	return b.String()
}

// regionctlReference is every regionctl command's --help, as the program
// prints it.
func regionctlReference(t *testing.T) string {
	env := func(string) string { return "" }
	help := func(args ...string) string {
		var out, errOut bytes.Buffer
		code := regionctl.Main(append(args, "--help"), env, &out, &errOut)
		require.Zero(t, code, "regionctl %v --help: %s", args, errOut.String())
		require.Empty(t, errOut.String(), "regionctl %v --help writes to stdout", args)
		return out.String()
	}
	top := help()
	var cmds []string
	for line := range strings.Lines(top) {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasPrefix(line, "  ") && (f[0] == "rules" || f[0] == "shedder" || f[0] == "enforcement" || f[0] == "regions" || f[0] == "rls" || f[0] == "hosts") && !strings.HasPrefix(f[1], "-") {
			cmds = append(cmds, f[0]+" "+f[1])
		}
	}
	cmds = uniqueSorted(cmds)
	require.NotEmpty(t, cmds)
	var b strings.Builder
	b.WriteString("# regionctl commands\n\nGenerated from `regionctl --help` and each command's `--help` (`go test ./internal/edge -run TestReferenceDocs -update-reference`).\n\n")
	b.WriteString("## regionctl\n\n```\n" + top + "```\n")
	for _, c := range cmds {
		fmt.Fprintf(&b, "\n## regionctl %s\n\n```\n%s```\n", c, help(strings.Fields(c)...))
	}
	return b.String()
}

func uniqueSorted(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
