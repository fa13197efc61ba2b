package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// pinnedDocuments hold every rule field, set and unset, with strings that
// need escaping; their versions are pinned below.
var pinnedDocuments = map[string]string{
	"every field, token bucket": `version: 1
rules:
  - id: all
    match: {hosts: ["API.example.com", "*.example.org"], path_prefix: ["/v1", "/a<b>&c"], methods: [get, POST]}
    key: [ip, "header:X-User"]
    algorithm: token_bucket
    limit: 100
    window: 1m
    burst: 150
    cost: 2
    scope: pop
    behaviour: true
    metrics: true
    bypass:
      cidrs: ["192.0.2.0/24", "2001:db8::/32"]
      hosts: ["internal.example.com"]
      path_prefix: ["/healthz"]
      api_key_header: X-API-Key
      api_key_sha256: ["` + "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8" + `"]
    overrides:
      - {key: ["192.0.2.7", "bob"], limit: 1000, burst: 2000}
      - {key: ["192.0.2.8", "alice"], limit: 10}
    limit_header: X-Plan-Limit
    penalty: 5m
    count_if: {status: ["401", "5xx"], header: X-Failed}
    cost_header: X-Cost
    max_cost: 50
    accuracy: leased
    tolerance: 0.1
  - id: off
    disabled: true
`,
	"every field, sliding log, global": `version: 1
rules:
  - id: slow.log_1
    match: {hosts: ["b.example.com"], methods: [DELETE]}
    key: ["query:q\u2028", "path"]
    algorithm: sliding_log
    limit: 7
    window: 10s
    min_interval: 1s
    shadow: true
    scope: region
    count_if: {status: ["403"]}
    cost_header: X-Units
  - id: leaky
    key: [ip]
    algorithm: leaky_bucket
    limit: 5
    window: 1s
    burst: 5
  - id: fixed
    key: [ip]
    algorithm: fixed_window
    limit: 3
    window: 1h
    accuracy: leased
    tolerance: 0.001
    scope: global
    bypass: {api_key_header: X-Key, api_key_sha256: ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]}
`,
}

// Version and DocumentVersion of the examples and of pinnedDocuments, as
// computed before the hash was driven by the rule field table. A change
// here changes the version of documents already stored and compared
// against: it must be a deliberate schema bump.
var pinnedVersions = map[string][2]string{
	"examples/rules.yaml":              {"383abc301d42", "383abc301d42"},
	"examples/rules-cdn.yaml":          {"384964151763", "384964151763"},
	"examples/rules-cdn-region.yaml":   {"e84d75dd6969", "e38c8bdf0d14"},
	"examples/rules-behaviour.yaml":    {"ef21b718b1a4", "ef21b718b1a4"},
	"every field, token bucket":        {"9ffb2ffdd746", "ad6e11621d0e"},
	"every field, sliding log, global": {"cc26f9f2827c", "cc26f9f2827c"},
}

func TestVersionPinned(t *testing.T) {
	for name, want := range pinnedVersions {
		t.Run(name, func(t *testing.T) {
			src, ok := pinnedDocuments[name]
			if !ok {
				data, err := os.ReadFile(filepath.Join("..", "..", name))
				require.NoError(t, err)
				src = string(data)
			}
			d, err := Parse([]byte(src))
			require.NoError(t, err)
			require.Equal(t, want, [2]string{Version(d), DocumentVersion(d)})
		})
	}
}

// The JSON of /debug/rules for the rules of pinnedDocuments, byte for byte
// (field order included), as written before it was driven by the rule
// field table.
func TestCompiledRuleJSONPinned(t *testing.T) {
	want := []string{
		`{"id":"all","algorithm":"token_bucket","limit":100,"window":"1m0s","burst":150,"cost":2,"shadow":false,"scope":"pop","behaviour":true,"metrics":true,"tolerance":0.1,"key":["ip","header:X-User"],"hosts":["*.example.org","api.example.com"],"path_prefix":["/a\u003cb\u003e\u0026c","/v1"],"methods":["GET","POST"],"bypass":{"cidrs":["192.0.2.0/24","2001:db8::/32"],"hosts":["internal.example.com"],"path_prefix":["/healthz"],"api_key_header":"X-Api-Key","api_key_sha256":["5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"]},"overrides":2,"limit_header":"X-Plan-Limit","penalty":"5m0s","count_if":{"status":["401","5xx"],"header":"X-Failed"},"cost_header":"X-Cost"}`,
		`{"id":"slow.log_1","algorithm":"sliding_log","limit":7,"window":"10s","cost":1,"min_interval":"1s","shadow":true,"scope":"region","key":["query:q\u2028","path"],"hosts":["b.example.com"],"methods":["DELETE"],"count_if":{"status":["403"]},"cost_header":"X-Units"}`,
		`{"id":"leaky","algorithm":"leaky_bucket","limit":5,"window":"1s","burst":5,"cost":1,"shadow":false,"scope":"region","key":["ip"]}`,
		`{"id":"fixed","algorithm":"fixed_window","limit":3,"window":"1h0m0s","cost":1,"shadow":false,"scope":"global","tolerance":0.001,"key":["ip"],"bypass":{"api_key_header":"X-Key","api_key_sha256":["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]}}`,
	}
	var got []string
	for _, name := range []string{"every field, token bucket", "every field, sliding log, global"} {
		for _, r := range mustCompile(t, mustParse(t, pinnedDocuments[name])).Rules() {
			b, err := r.MarshalJSON()
			require.NoError(t, err)
			got = append(got, string(b))
		}
	}
	require.Equal(t, want, got)
}

// Every problem of a document, found wherever errors.Join put it, printed
// after the file it is in.
func TestFieldErrorsLocated(t *testing.T) {
	_, err := Parse([]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: fixed_window, limit: -1, window: 1m}\n  - {key: [ip], algorithm: fixed_window, limit: 1, window: 1m}\n"))
	require.Error(t, err)
	var got []string
	for _, fe := range FieldErrors(fmt.Errorf("loading: %w", err)) {
		got = append(got, fe.Located("rules.yaml"))
	}
	require.Equal(t, []string{
		`rules.yaml:3: rule "a": limit: must be > 0 (got -1)`,
		`rules.yaml:4: rules[1]: id: required`,
	}, got)
	require.Equal(t, "rules.yaml: rule \"b\": limit: x", (&FieldError{RuleID: "b", Field: "limit", Msg: "x"}).Located("rules.yaml"))
	require.Empty(t, FieldErrors(errors.New("not a rules problem")))
}
