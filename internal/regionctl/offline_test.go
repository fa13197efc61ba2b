package regionctl

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// These commands read files only: no Consul is involved (the address
// regionctl would use points nowhere).
func runOffline(t *testing.T, args ...string) result {
	t.Helper()
	return runApp(t, &app{}, func(k string) string {
		if k == "CONSUL_HTTP_ADDR" {
			return "127.0.0.1:1" // nothing listens: a command that called Consul would fail
		}
		return ""
	}, args...)
}

// goType matches Go type names an operator should never see.
var goType = regexp.MustCompile(`\[\]string|time\.Duration|int64|rules\.[A-Z]|!!(str|int|map|seq)|unmarshal`)

func TestValidateSeveralFilesEveryProblemWithItsLine(t *testing.T) {
	t.Parallel()
	good := file(t, rulesV1)
	bad := file(t, `version: 1
rules:
  - id: per-ip
    key: ip
    algorithm: sliding_log
    limit: lots
    window: 10
    windw: 1m
  - id: per-ip
    key: [ip]
    algorithm: token_bucket
    limit: 5
    window: 1s
    cost: 0
`)
	syntax := file(t, "version: 1\nrules:\n  - id: a\n    key: [ip\n    algorithm: x\n")
	r := runOffline(t, "rules", "validate", good, bad, syntax)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stdout, good+": valid, 2 rules, version ")
	for _, want := range []string{
		bad + `:4: rule "per-ip": key: want a list of strings, got "ip"`,
		bad + `:6: rule "per-ip": limit: want an integer, got "lots"`,
		bad + `:7: rule "per-ip": window: want a duration such as "1m" or "250ms", got "10" (a number needs a unit: s, ms, m, h)`,
		bad + `:8: rule "per-ip": windw: unknown field (did you mean window?)`,
		bad + `:9: rule "per-ip": id: duplicate (also rules[0])`,
		bad + `:14: rule "per-ip": cost: must be >= 1 (got 0)`,
		syntax + `:4: YAML syntax: did not find expected ',' or ']'`,
	} {
		require.Contains(t, r.stderr, "\n"+want+"\n")
	}
	require.Contains(t, r.stderr, bad+": invalid (6 problems)")
	require.Contains(t, r.stderr, syntax+": invalid (1 problem)")
	require.NotRegexp(t, goType, r.stderr)
	require.Contains(t, r.stderr, "regionctl: 2 of 3 files not valid\n")

	r = runOffline(t, "rules", "validate", "--output", "json", good, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, false, m["valid"])
	require.Equal(t, float64(ExitInvalid), m["exit_code"])
	docs := m["documents"].([]any)
	require.Len(t, docs, 2)
	require.Equal(t, true, docs[0].(map[string]any)["valid"])
	probs := docs[1].(map[string]any)["problems"].([]any)
	require.Len(t, probs, 6)
	require.Equal(t, map[string]any{"file": bad, "line": float64(8), "rule": "per-ip", "index": float64(0), "field": "windw",
		"message": "unknown field (did you mean window?)"}, probs[3])

	r = runOffline(t, "rules", "validate", good, file(t, rulesV2))
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, 2, strings.Count(r.stdout, ": valid, "))

	r = runOffline(t, "rules", "validate")
	require.Equal(t, ExitUsage, r.code, r)
}

func TestDiffTwoFilesOffline(t *testing.T) {
	t.Parallel()
	v1, v2 := file(t, rulesV1), file(t, rulesV2)
	r := runOffline(t, "rules", "diff", v1, v2)
	require.Equal(t, ExitDiffers, r.code, r)
	require.Empty(t, r.stderr)
	require.Contains(t, r.stdout, "--- "+v1+"\n+++ "+v2+"\n")
	require.Contains(t, r.stdout, `+ added   rule "api-key"`)
	require.Contains(t, r.stdout, `- removed rule "admin"`)
	require.Contains(t, r.stdout, `~ changed rule "per-ip": limit 10 -> 20; window 10s -> 1m0s`)

	r = runOffline(t, "rules", "diff", "--output", "json", v1, v2)
	require.Equal(t, ExitDiffers, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, false, m["identical"])
	require.Equal(t, []any{"api-key"}, m["added"])

	// A field only the rule table knows of (behaviour) is compared too.
	optIn := file(t, strings.Replace(rulesV1, "    limit: 10\n", "    limit: 10\n    behaviour: true\n", 1))
	r = runOffline(t, "rules", "diff", v1, optIn)
	require.Equal(t, ExitDiffers, r.code, r)
	require.Contains(t, r.stdout, `~ changed rule "per-ip": behaviour false -> true`)

	// Same rules, other spelling: exit 0.
	respelled := file(t, strings.Replace(rulesV1, "limit: 30", "limit: 30 # admins are few", 1))
	r = runOffline(t, "rules", "diff", v1, respelled)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "no changes")
	require.Contains(t, r.stdout, "differ only in formatting")

	// An invalid file: every problem, exit 4, no diff.
	bad := file(t, "version: 1\nrules:\n  - {id: a, limit: 0}\n")
	r = runOffline(t, "rules", "diff", v1, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, bad+`:3: rule "a": algorithm: required`)

	r = runOffline(t, "rules", "diff", "--region", "eu-west", v1, v2)
	require.Equal(t, ExitUsage, r.code, r)
}
