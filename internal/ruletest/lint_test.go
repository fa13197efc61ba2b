package ruletest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/ruletest"
)

// Each lint fires on the rule it is about and stays quiet on its near
// twin that is fine.
func TestLints(t *testing.T) {
	for _, tc := range []struct {
		name, rules string
		want        []ruletest.Warning // Msg not compared
	}{
		{"a key on a field stripped from untrusted peers", `
  - {id: a, key: ["header:X-Real-IP"], algorithm: fixed_window, limit: 1, window: 1m}
  - {id: b, key: ["header:X-Api-Key"], algorithm: fixed_window, limit: 1, window: 1m}`,
			[]ruletest.Warning{{Rule: "a", Lint: ruletest.LintStrippedHeader}}},
		{"a key on a field stripped from every peer", `
  - {id: a, key: ["header:X_Api_Key"], algorithm: fixed_window, limit: 1, window: 1m}`,
			[]ruletest.Warning{{Rule: "a", Lint: ruletest.LintStrippedHeader}}},
		{"a bypass header stripped from untrusted peers", `
  - {id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1m, bypass: {api_key_header: Forwarded, api_key_sha256: ["` + sha + `"]}}`,
			[]ruletest.Warning{{Rule: "a", Lint: ruletest.LintStrippedHeader}}},
		{"a rule within an earlier one with a higher limit", `
  - {id: api, match: {hosts: ["*.example.com"], path_prefix: [/api]}, key: [ip], algorithm: fixed_window, limit: 10, window: 1m}
  - {id: api-v1, match: {hosts: [a.example.com], path_prefix: [/api/v1], methods: [GET]}, key: [ip], algorithm: fixed_window, limit: 20, window: 1m}
  - {id: api-v2, match: {hosts: [a.example.com], path_prefix: [/api/v2]}, key: [ip], algorithm: fixed_window, limit: 5, window: 1m}
  - {id: apix, match: {path_prefix: [/apix]}, key: [ip], algorithm: fixed_window, limit: 20, window: 1m}
  - {id: other-key, match: {path_prefix: [/api]}, key: [host], algorithm: fixed_window, limit: 20, window: 1m}`,
			[]ruletest.Warning{{Rule: "api-v1", Lint: ruletest.LintNeverDenies}}},
		{"a rule for refused methods only", `
  - {id: a, match: {methods: [TRACE, CONNECT]}, key: [ip], algorithm: fixed_window, limit: 1, window: 1m}
  - {id: b, match: {methods: [TRACE, GET]}, key: [ip], algorithm: fixed_window, limit: 1, window: 1m}`,
			[]ruletest.Warning{{Rule: "a", Lint: ruletest.LintRefusedMethod}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, err := ruletest.Lint(mustRules(t, "version: 1\nrules:"+tc.rules+"\n"))
			require.NoError(t, err)
			for i := range ws {
				require.NotEmpty(t, ws[i].Msg)
				ws[i].Msg = ""
			}
			require.Equal(t, tc.want, ws)
		})
	}
}

// sha is the SHA-256 of "k", as a bypass lists an API key.
const sha = "8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a"
