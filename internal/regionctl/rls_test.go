package regionctl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const rlsAPI = `domain: api
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: path
    value: /login
    rate_limit:
      unit: minute
      requests_per_unit: 5
`

// rlsDir writes documents (name → text) into a directory of their own.
func rlsDir(t *testing.T, docs map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range docs {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	}
	return dir
}

func TestRLSValidateEveryProblemWithItsLine(t *testing.T) {
	t.Parallel()
	good := rlsDir(t, map[string]string{"config/api.yaml": rlsAPI, ".hidden/x.yaml": "not: [valid"})
	bad := filepath.Join(rlsDir(t, map[string]string{"bad.yaml": `domain: web
descriptors:
  - key: remote_address
    rate_limit:
      unit: fortnight
      requests_per_unit: -1
  - kee: x
`}), "bad.yaml")
	r := runOffline(t, "rls", "validate", good, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	assert.Contains(t, r.stdout, filepath.Join(good, "config/api.yaml")+": valid, domain api, 2 descriptors\n")
	for _, want := range []string{
		bad + `:5: descriptor web.remote_address: rate_limit.unit: invalid unit "fortnight"`,
		bad + `:6: descriptor web.remote_address: rate_limit.requests_per_unit: want a whole number`,
		bad + `:7: descriptor web: descriptors[1].kee: unknown key`,
		bad + `:7: descriptor web: descriptors[1].key: required and not empty`,
	} {
		assert.Contains(t, r.stderr, "\n"+want)
	}
	assert.Contains(t, r.stderr, bad+": invalid (4 problems)")
	assert.Contains(t, r.stderr, "regionctl: 1 of 2 files not valid\n")
	assert.NotContains(t, r.stderr, ".hidden", "hidden entries are skipped, as the edge skips them")

	// Valid alone, invalid together: one domain twice, unless merged.
	other := filepath.Join(rlsDir(t, map[string]string{"more.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"}), "more.yaml")
	r = runOffline(t, "rls", "validate", good, other)
	require.Equal(t, ExitInvalid, r.code, r)
	assert.Contains(t, r.stderr, other+`: domain: domain "api" already declared in `+filepath.Join(good, "config/api.yaml"))
	r = runOffline(t, "rls", "validate", "--merge-domains", good, other)
	require.Equal(t, ExitOK, r.code, r)

	r = runOffline(t, "rls", "validate", "--output", "json", good, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	m := decodeJSON(t, r.stdout)
	assert.Equal(t, false, m["valid"])
	docs := m["documents"].([]any)
	require.Len(t, docs, 2)
	assert.Equal(t, "api", docs[0].(map[string]any)["domain"])
	probs := docs[1].(map[string]any)["problems"].([]any)
	require.Len(t, probs, 4)
	assert.Equal(t, map[string]any{"file": bad, "line": float64(5), "descriptor": "web.remote_address",
		"field": "rate_limit.unit", "message": `invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`}, probs[0])

	r = runOffline(t, "rls", "validate", filepath.Join(good, "missing.yaml"))
	assert.Equal(t, ExitError, r.code, r)
	r = runOffline(t, "rls", "validate")
	assert.Equal(t, ExitUsage, r.code, r)
}

func TestRLSDiffExitCodes(t *testing.T) {
	t.Parallel()
	old := rlsDir(t, map[string]string{"api.yaml": rlsAPI})
	same := rlsDir(t, map[string]string{"nested/api.yml": "# reformatted\ndomain: api\ndescriptors:\n  - {key: path, value: /login, rate_limit: {unit: MINUTE, requests_per_unit: 5}}\n  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 10}}\n"})
	changed := rlsDir(t, map[string]string{"api.yaml": `domain: api
descriptors:
  - key: remote_address
    shadow_mode: true
    rate_limit:
      unit: second
      requests_per_unit: 20
  - key: path
    value: /signup
    rate_limit:
      unit: minute
      requests_per_unit: 5
`, "web.yaml": "domain: web\ndescriptors: []\n"})

	r := runOffline(t, "rls", "diff", old, same)
	require.Equal(t, ExitOK, r.code, r)
	assert.Contains(t, r.stdout, "no changes: "+same+" has the same limits as "+old+" (2 limits)\n")

	r = runOffline(t, "rls", "diff", old, changed)
	require.Equal(t, ExitDiffers, r.code, r)
	assert.Equal(t, "--- "+old+"\n+++ "+changed+"\n"+
		"+ added   domain web\n"+
		"+ added   limit api.path_/signup: 5/minute, fixed_window\n"+
		"- removed limit api.path_/login: 5/minute, fixed_window\n"+
		"~ changed limit api.remote_address: rate 10/second -> 20/second; shadow_mode false -> true\n", r.stdout)
	assert.Empty(t, r.stderr)

	r = runOffline(t, "rls", "diff", "--output", "json", old, changed)
	require.Equal(t, ExitDiffers, r.code, r)
	m := decodeJSON(t, r.stdout)
	assert.Equal(t, false, m["identical"])
	assert.Equal(t, []any{"web"}, m["domains_added"])
	assert.Equal(t, []any{"api.path_/signup"}, m["added"])

	// Trouble is 2 and up: invalid 4, the general error 10 (not 1).
	bad := rlsDir(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n  - key: x\n    rate_limit: {unit: second}\n"})
	r = runOffline(t, "rls", "diff", old, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	assert.Contains(t, r.stderr, filepath.Join(bad, "api.yaml")+":4: descriptor api.x: rate_limit")
	r = runOffline(t, "rls", "diff", old, filepath.Join(old, "missing"))
	assert.Equal(t, ExitDiffError, r.code, r)
	r = runOffline(t, "rls", "diff", old)
	assert.Equal(t, ExitUsage, r.code, r)
}
