package regionctl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// testFile writes a rule test file next to nothing else.
func testFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.test.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// perIPTests hold for rulesV1 (per-ip: 10 per 10s) and fail for a limit of 5.
const perIPTests = `tests:
  - name: ten in ten seconds
    request: {host: www.example.com, path: /, peer: 203.0.113.7}
    repeat: 12
    expect: {matches: [per-ip], allowed: 10, denied: 2, violated: [per-ip]}
`

func TestRulesTestRunsTheExample(t *testing.T) {
	t.Parallel()
	r := runOffline(t, "rules", "test", filepath.Join("..", "..", "examples", "rules.test.yaml"))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "  PASS  a client gets 10 requests in 10 seconds\n")
	require.Contains(t, r.stdout, "10 of 10 cases passed\n")
	require.Empty(t, r.stderr)
}

func TestRulesTestFailsWithWhatDiffers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(rulesV1), 0o600))
	good := filepath.Join(dir, "good.test.yaml")
	require.NoError(t, os.WriteFile(good, []byte("rules: r.yaml\n"+perIPTests), 0o600))
	bad := filepath.Join(dir, "bad.test.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("rules: r.yaml\n"+perIPTests+`  - name: admin too
    request: {host: www.example.com, path: /admin, peer: 203.0.113.7}
    expect: {matches: [per-ip]}
`), 0o600))

	r := runOffline(t, "rules", "test", good, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stdout, good+": 1 of 1 case passed\n")
	require.Contains(t, r.stdout, "  FAIL  admin too\n          matches: expected [per-ip], got [per-ip admin]\n")
	require.Contains(t, r.stdout, bad+": 1 of 2 cases passed\n")

	r = runOffline(t, "rules", "test", "--output", "json", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	out := decodeJSON(t, r.stdout)
	require.Equal(t, false, out["pass"])
	f := out["files"].([]any)[0].(map[string]any)
	require.EqualValues(t, 1, f["failed"])
	require.EqualValues(t, 1, f["passed"])
}

func TestRulesTestRefusesBadFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		code       int
		want       string
	}{
		{"unknown field", "rules: r.yaml\ntests:\n  - name: a\n    requets: {}\n", ExitInvalid, "line 4: field requets not found"},
		{"no rules named", perIPTests, ExitInvalid, "names no rules file"},
		{"rules that are not there", "rules: nowhere.yaml\n" + perIPTests, ExitError, "reading rules file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runOffline(t, "rules", "test", testFile(t, tc.text))
			require.Equal(t, tc.code, r.code, r)
			require.Contains(t, r.stderr, tc.want)
		})
	}
	r := runOffline(t, "rules", "test", filepath.Join(t.TempDir(), "absent.yaml"))
	require.Equal(t, ExitError, r.code, r)
	require.Equal(t, ExitUsage, runOffline(t, "rules", "test").code)
}

func TestValidateRunsTestsAndLints(t *testing.T) {
	t.Parallel()
	tests := testFile(t, perIPTests)
	r := runOffline(t, "rules", "validate", "--tests", tests, file(t, rulesV1))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "1 of 1 case passed")

	five := file(t, "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 5, window: 10s}\n")
	r = runOffline(t, "rules", "validate", "--tests", tests, five)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stdout, "allowed: expected 10, got 5")
	require.Contains(t, r.stderr, "the rule tests of "+tests+" failed")

	// A lint warns on validate, and fails it with --lint-errors.
	spoofed := file(t, "version: 1\nrules:\n  - {id: by-real-ip, key: [\"header:X-Real-IP\"], algorithm: fixed_window, limit: 5, window: 10s}\n")
	r = runOffline(t, "rules", "validate", spoofed)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stderr, "warning: rule by-real-ip: key header:X-Real-Ip: the edge removes X-Real-Ip from peers that are not trusted proxies")
	r = runOffline(t, "rules", "validate", "--lint-errors", spoofed)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "1 lint warning (--lint-errors)")
	r = runOffline(t, "rules", "validate", "--output", "json", spoofed)
	require.Equal(t, ExitOK, r.code, r)
	require.Len(t, decodeJSON(t, r.stdout)["warnings"], 1)
}

// A push with --tests writes nothing when a case fails (real Consul).
func TestPushRefusesWhenTestsFail(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	tests := testFile(t, perIPTests)
	five := "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 5, window: 10s}\n"
	r := run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--tests", tests, file(t, five))
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "nothing was written")
	require.Nil(t, kv(t, euWest, p+"rules/regions/eu-west"), "a failing test refuses the push")

	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--tests", tests, file(t, rulesV1))
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, rulesV1, string(kv(t, euWest, p+"rules/regions/eu-west").Value))
}
