package ruletest_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/ruletest"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

func mustRules(t *testing.T, text string) *rules.Document {
	t.Helper()
	doc, err := rules.Parse([]byte(text))
	require.NoError(t, err)
	return doc
}

func run(t *testing.T, rulesText, testText string) []ruletest.Result {
	t.Helper()
	f, err := ruletest.Parse([]byte(testText))
	require.NoError(t, err)
	res, err := ruletest.Run(f, mustRules(t, rulesText))
	require.NoError(t, err)
	return res
}

func TestParseRefusesWhatIsNotATest(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"unknown field, with its line", "tests:\n  - name: a\n    request: {path: /, peer: 192.0.2.1}\n    expcet: {}\n", "line 4: field expcet not found"},
		{"a key twice", "tests:\n  - name: a\n    name: b\n    request: {path: /, peer: 192.0.2.1}\n", "already defined"},
		{"two documents", "tests: [{name: a, request: {path: /, peer: 192.0.2.1}}]\n---\ntests: []\n", "one YAML document"},
		{"empty", "", "empty"},
		{"no cases", "rules: r.yaml\n", "no cases"},
		{"a name twice", "tests: [{name: a, request: {path: /, peer: 192.0.2.1}}, {name: a, request: {path: /, peer: 192.0.2.1}}]", `name "a" is given twice`},
		{"a header value smuggling a field", "tests: [{name: a, request: {path: /, peer: 192.0.2.1, headers: {X-A: \"v\\r\\nX-Forwarded-For: 1.2.3.4\"}}}]", "control characters"},
		{"a header name that is not a token", "tests: [{name: a, request: {path: /, peer: 192.0.2.1, headers: {\"X-A:\": v}}}]", "not an HTTP token"},
		{"a path with a space", "tests: [{name: a, request: {path: \"/a HTTP/1.1\", peer: 192.0.2.1}}]", "white space"},
		{"a peer that is not an address", "tests: [{name: a, request: {path: /, peer: example.com}}]", `peer "example.com"`},
		{"a Host in headers", "tests: [{name: a, request: {path: /, peer: 192.0.2.1, headers: {host: x}}}]", "give the Host as host"},
		{"too many requests", "tests: [{name: a, repeat: 1000001, request: {path: /, peer: 192.0.2.1}}]", "repeat must be"},
		{"too many requests in all", "tests:\n" + strings.Repeat("  - {name: a, repeat: 100000, request: {path: /, peer: 192.0.2.1}}\n", 1) + manyCases(11), "more than 1000000 requests in all"},
		{"a negative every", "tests: [{name: a, every: -1s, request: {path: /, peer: 192.0.2.1}}]", "not a duration"},
		{"a bad trusted proxy", "trusted_proxies: [10.0.0.0/99]\ntests: [{name: a, request: {path: /, peer: 192.0.2.1}}]", "trusted_proxies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ruletest.Parse([]byte(tc.text))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// The limiter runs on the case's frozen clock: 8 requests 250 ms apart
// fall in two 1 s windows of 3, whatever the machine's speed. On the
// wall clock they would all fall in one (3 allowed, 5 denied).
func TestDecisionsFollowTheFrozenClock(t *testing.T) {
	res := run(t, `version: 1
rules:
  - {id: w, key: [ip], algorithm: fixed_window, limit: 3, window: 1s}
`, `tests:
  - name: two windows
    request: {host: a.example, path: /, peer: 192.0.2.1}
    repeat: 8
    every: 250ms
    expect: {allowed: 6, denied: 2, status: 429, violated: [w]}
`)
	require.True(t, res[0].Pass, "%v", res[0].Diffs)
}

// What a failing case says: each expectation that did not hold, with
// what was expected and what came.
func TestFailuresSayWhatDiffers(t *testing.T) {
	res := run(t, `version: 1
rules:
  - {id: w, key: [ip], algorithm: fixed_window, limit: 3, window: 1m}
  - {id: s, key: [ip], algorithm: fixed_window, limit: 1, window: 1m, shadow: true}
`, `tests:
  - name: wrong
    request: {host: a.example, path: /, peer: 192.0.2.1}
    repeat: 5
    expect:
      matches: [w]
      keys: {w: [192.0.2.2], s: [192.0.2.1]}
      allowed: 5
      violated: []
      client: 192.0.2.9
`)
	require.False(t, res[0].Pass)
	require.Equal(t, []string{
		"client: expected 192.0.2.9, got 192.0.2.1",
		"matches: expected [w], got [w s]",
		res[0].Diffs[2], // the key hashes, checked below
		"allowed: expected 5, got 3",
		"violated: expected [], got [w]",
	}, res[0].Diffs)
	require.True(t, strings.HasPrefix(res[0].Diffs[2], "keys.w: expected w:"), res[0].Diffs[2])
	require.Contains(t, res[0].Diffs[2], "(from [192.0.2.2]), got w:")
}

// The trust model is the edge's: a field the screen strips from an
// untrusted peer never reaches the rules, and X-Forwarded-For counts only
// through trusted proxies.
func TestTheTrustModelIsTheEdges(t *testing.T) {
	res := run(t, `version: 1
rules:
  - {id: real-ip, key: ["header:X-Real-IP"], algorithm: fixed_window, limit: 1, window: 1m}
  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 100, window: 1m}
`, `trusted_proxies: [10.0.0.0/8]
tests:
  - name: untrusted
    request: {host: a.example, path: /, peer: 192.0.2.1, headers: {X-Real-IP: 198.51.100.1, X-Forwarded-For: 198.51.100.1}}
    expect: {client: 192.0.2.1, matches: [per-ip], keys: {per-ip: [192.0.2.1]}}
  - name: trusted by the file
    request: {host: a.example, path: /, peer: 10.0.0.1, headers: {X-Real-IP: 198.51.100.1, X-Forwarded-For: "203.0.113.5, 10.0.0.2"}}
    expect: {client: 203.0.113.5, matches: [real-ip, per-ip], keys: {real-ip: [198.51.100.1]}}
  - name: trusted by the case
    request: {host: a.example, path: /, peer: 192.0.2.1, trusted: true, headers: {X-Forwarded-For: 203.0.113.5}}
    expect: {client: 203.0.113.5}
`)
	for _, r := range res {
		require.True(t, r.Pass, "%s: %v", r.Name, r.Diffs)
	}
}

// Hostile requests get what the edge gives them.
func TestHostileRequests(t *testing.T) {
	res := run(t, `version: 1
rules:
  - {id: evil, match: {hosts: [evil.example]}, key: [ip], algorithm: fixed_window, limit: 1, window: 1m}
  - {id: admin, match: {path_prefix: [/admin]}, key: [ip], algorithm: fixed_window, limit: 1, window: 1m}
  - {id: keyed, key: ["header:X-Api-Key"], algorithm: fixed_window, limit: 1, window: 1m}
`, `tests:
  - name: an absolute-form target's authority is the host
    request: {host: www.example, path: "http://EVIL.example./x", peer: 192.0.2.1}
    expect: {matches: [evil]}
  - name: user info is refused
    request: {host: "u:p@evil.example", path: /, peer: 192.0.2.1}
    expect: {refused: 400}
  - name: a Host with a space is refused
    request: {host: "evil .example", path: /, peer: 192.0.2.1}
    expect: {refused: 400}
  - name: dot segments and escapes do not escape a prefix
    request: {host: a.example, path: "/x/..%2F%2e%2e/%61dmin/", peer: 192.0.2.1}
    expect: {matches: [admin]}
  - name: TRACE is refused
    request: {method: TRACE, host: a.example, path: /, peer: 192.0.2.1}
    expect: {refused: 405}
  - name: an empty key value does not count
    request: {host: a.example, path: /, peer: 192.0.2.1, headers: {X-Api-Key: ""}}
    expect: {matches: []}
  - name: an underscore twin of a key header is dropped
    request: {host: a.example, path: /, peer: 192.0.2.1, headers: {X_Api_Key: k}}
    expect: {matches: []}
`)
	for _, r := range res {
		require.True(t, r.Pass, "%s: %v", r.Name, r.Diffs)
	}
}

func TestKeyExpectationErrors(t *testing.T) {
	f, err := ruletest.Parse([]byte("tests: [{name: a, request: {host: a.example, path: /, peer: 192.0.2.1}, expect: {keys: {w: [a, b]}}}]"))
	require.NoError(t, err)
	_, err = ruletest.Run(f, mustRules(t, "version: 1\nrules:\n  - {id: w, key: [ip], algorithm: fixed_window, limit: 3, window: 1m}\n"))
	require.ErrorContains(t, err, "keyed by 1 values")
}

// Overrides and a trusted peer's limit header set the limit as at the
// edge; an untrusted peer's limit header is ignored.
func TestEscapesSetTheLimit(t *testing.T) {
	res := run(t, `version: 1
rules:
  - id: plan
    key: ["header:X-Api-Key"]
    algorithm: fixed_window
    limit: 2
    window: 1m
    limit_header: X-Plan-Limit
    overrides: [{key: [partner], limit: 5}]
`, `tests:
  - name: the rule's own
    request: {host: a.example, path: /, peer: 192.0.2.1, headers: {X-Api-Key: k}}
    repeat: 8
    expect: {allowed: 2, denied: 6}
  - name: an override
    request: {host: a.example, path: /, peer: 192.0.2.1, headers: {X-Api-Key: partner}}
    repeat: 8
    expect: {allowed: 5, denied: 3}
  - name: a trusted peer's limit header
    request: {host: a.example, path: /, peer: 10.0.0.1, trusted: true, headers: {X-Api-Key: k, X-Plan-Limit: "4"}}
    repeat: 8
    expect: {allowed: 4, denied: 4}
  - name: an untrusted peer's limit header
    request: {host: a.example, path: /, peer: 192.0.2.1, headers: {X-Api-Key: k, X-Plan-Limit: "7"}}
    repeat: 8
    expect: {allowed: 2, denied: 6}
  - name: a limit header that is not a limit
    request: {host: a.example, path: /, peer: 10.0.0.1, trusted: true, headers: {X-Api-Key: k, X-Plan-Limit: "-3"}}
    repeat: 8
    expect: {allowed: 2, denied: 6}
`)
	for _, r := range res {
		require.True(t, r.Pass, "%s: %v", r.Name, r.Diffs)
	}
}

// manyCases are n cases of 100,000 requests each, named apart.
func manyCases(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("  - {name: c" + strconv.Itoa(i) + ", repeat: 100000, request: {path: /, peer: 192.0.2.1}}\n")
	}
	return b.String()
}
