package regionctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
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
	require.Contains(t, r.stdout, filepath.Join(good, "config/api.yaml")+": valid, domain api, 2 descriptors\n")
	for _, want := range []string{
		bad + `:5: descriptor web.remote_address: rate_limit.unit: invalid unit "fortnight"`,
		bad + `:6: descriptor web.remote_address: rate_limit.requests_per_unit: want a whole number`,
		bad + `:7: descriptor web: descriptors[1].kee: unknown key`,
		bad + `:7: descriptor web: descriptors[1].key: required and not empty`,
	} {
		require.Contains(t, r.stderr, "\n"+want)
	}
	require.Contains(t, r.stderr, bad+": invalid (4 problems)")
	require.Contains(t, r.stderr, "regionctl: 1 of 2 files not valid\n")
	require.NotContains(t, r.stderr, ".hidden", "hidden entries are skipped, as the edge skips them")

	// Valid alone, invalid together: one domain twice, unless merged.
	other := filepath.Join(rlsDir(t, map[string]string{"more.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"}), "more.yaml")
	r = runOffline(t, "rls", "validate", good, other)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, other+`: domain: domain "api" already declared in `+filepath.Join(good, "config/api.yaml"))
	r = runOffline(t, "rls", "validate", "--merge-domains", good, other)
	require.Equal(t, ExitOK, r.code, r)

	r = runOffline(t, "rls", "validate", "--output", "json", good, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, false, m["valid"])
	docs := m["documents"].([]any)
	require.Len(t, docs, 2)
	require.Equal(t, "api", docs[0].(map[string]any)["domain"])
	probs := docs[1].(map[string]any)["problems"].([]any)
	require.Len(t, probs, 4)
	require.Equal(t, map[string]any{"file": bad, "line": float64(5), "descriptor": "web.remote_address",
		"field": "rate_limit.unit", "message": `invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`}, probs[0])

	r = runOffline(t, "rls", "validate", filepath.Join(good, "missing.yaml"))
	require.Equal(t, ExitError, r.code, r)
	r = runOffline(t, "rls", "validate")
	require.Equal(t, ExitUsage, r.code, r)
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
	require.Contains(t, r.stdout, "no changes: "+same+" has the same limits as "+old+" (2 limits)\n")

	r = runOffline(t, "rls", "diff", old, changed)
	require.Equal(t, ExitDiffers, r.code, r)
	require.Equal(t, "--- "+old+"\n+++ "+changed+"\n"+
		"+ added   domain web\n"+
		"+ added   limit api.path_/signup: 5/minute, fixed_window\n"+
		"- removed limit api.path_/login: 5/minute, fixed_window\n"+
		"~ changed limit api.remote_address: rate 10/second -> 20/second; shadow_mode false -> true\n", r.stdout)
	require.Empty(t, r.stderr)

	r = runOffline(t, "rls", "diff", "--output", "json", old, changed)
	require.Equal(t, ExitDiffers, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, false, m["identical"])
	require.Equal(t, []any{"web"}, m["domains_added"])
	require.Equal(t, []any{"api.path_/signup"}, m["added"])

	// Trouble is 2 and up: invalid 4, the general error 10 (not 1).
	bad := rlsDir(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n  - key: x\n    rate_limit: {unit: second}\n"})
	r = runOffline(t, "rls", "diff", old, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, filepath.Join(bad, "api.yaml")+":4: descriptor api.x: rate_limit")
	r = runOffline(t, "rls", "diff", old, filepath.Join(old, "missing"))
	require.Equal(t, ExitDiffError, r.code, r)
	r = runOffline(t, "rls", "diff", old)
	require.Equal(t, ExitUsage, r.code, r)
}

// TestRLSPush: a push writes the documents (pushed to us-east through
// eu-west's agent, over the WAN) with a history entry each; an identical
// push changes nothing; a document invalid alone or with the region's
// others is refused before anything is written; a dry run writes nothing;
// a document changed between the read and the write loses the
// check-and-set.
func TestRLSPush(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	dir := rlsDir(t, map[string]string{"api.yaml": rlsAPI})
	api1 := filepath.Join(dir, "api.yaml")
	key := p + "rls/us-east/api.yaml"

	r := run(t, "rls", "push", "--prefix", p, "--region", "us-east", "--message", "first limits", api1)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "+ added   domain api\n")
	require.Contains(t, r.stdout, "+ added   limit api.remote_address: 10/second, fixed_window\n")
	require.Contains(t, r.stdout, "us-east: ok: wrote "+key+" (version ")
	require.Equal(t, rlsAPI, string(kv(t, usEast, key).Value))

	h := run(t, "--output", "json", "rules", "history", "--prefix", p, "--region", "us-east", "--kind", "rls")
	require.Equal(t, ExitOK, h.code, h)
	entries := decodeJSON(t, h.stdout)["entries"].([]any)
	require.Len(t, entries, 1)
	e := entries[0].(map[string]any)
	require.Equal(t, "rls", e["kind"])
	require.Equal(t, key, e["key"])
	require.Equal(t, "tester", e["author"])
	require.Equal(t, "first limits", e["message"])

	r = run(t, "rls", "push", "--prefix", p, "--region", "us-east", api1)
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, "us-east: unchanged: the region already holds these documents\n", r.stdout)

	// Valid alone, invalid with the stored api.yaml: one domain twice.
	more := filepath.Join(rlsDir(t, map[string]string{"more.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"}), "more.yaml")
	r = run(t, "rls", "push", "--prefix", p, "--region", "us-east", more)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, p+`rls/us-east/more.yaml: domain: domain "api" already declared in `+key)
	require.Contains(t, r.stderr, "nothing was written")
	require.Nil(t, kv(t, usEast, p+"rls/us-east/more.yaml"))
	// Invalid alone: the file's lines, and Consul is not even asked.
	bad := filepath.Join(rlsDir(t, map[string]string{"bad.yaml": "domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: hours, requests_per_unit: 1}\n"}), "bad.yaml")
	r = runOffline(t, "rls", "push", "--prefix", p, "--region", "us-east", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, bad+`:4: descriptor web.k: rate_limit.unit: invalid unit "hours"`)

	changed := filepath.Join(rlsDir(t, map[string]string{"api.yaml": strings.Replace(rlsAPI, "10", "20", 1)}), "api.yaml")
	r = run(t, "rls", "push", "--prefix", p, "--region", "us-east", "--dry-run", changed)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "~ changed limit api.remote_address: rate 10/second -> 20/second\n")
	require.Contains(t, r.stdout, "dry run: nothing was written\n")
	require.Equal(t, rlsAPI, string(kv(t, usEast, key).Value))

	// Someone else writes between the read and the write: conflict.
	other := &app{beforeWrite: func(string) {
		c, err := usEast.Client(usEast.ManagementToken)
		require.NoError(t, err)
		_, err = c.KV().Put(&api.KVPair{Key: key, Value: []byte(rlsAPI + "# edited\n")}, nil)
		require.NoError(t, err)
	}}
	r = runApp(t, other, testEnv(), "rls", "push", "--prefix", p, "--region", "us-east", changed)
	require.Equal(t, ExitConflict, r.code, r)
	require.Equal(t, rlsAPI+"# edited\n", string(kv(t, usEast, key).Value))

	// Read again, it goes through; retention keeps the newest entry.
	r = run(t, "rls", "push", "--prefix", p, "--region", "us-east", "--keep-history", "1", changed)
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, strings.Replace(rlsAPI, "10", "20", 1), string(kv(t, usEast, key).Value))
	h = run(t, "--output", "json", "rules", "history", "--prefix", p, "--region", "us-east", "--kind", "rls")
	require.Equal(t, ExitOK, h.code, h)
	require.Len(t, decodeJSON(t, h.stdout)["entries"].([]any), 1)
}

// rls get shows what a region holds; rls rm removes a document (history
// entry, the others validated without it); rls rollback brings it back,
// then goes back to the state before, and takes --to; each step is what
// the region holds afterwards.
func TestRLSGetRmRollback(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	web := "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 30}\n"
	dir := rlsDir(t, map[string]string{"api.yaml": rlsAPI, "web.yaml": web})
	apiKey, webKey := p+"rls/us-east/api.yaml", p+"rls/us-east/web.yaml"

	r := run(t, "rls", "get", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, "# no rate limit service documents in us-east ("+p+"rls/us-east/ is empty)\n", r.stdout)

	r = run(t, "rls", "push", "--prefix", p, "--region", "us-east", "--message", "first", dir)
	require.Equal(t, ExitOK, r.code, r)
	r = run(t, "rls", "get", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "# "+apiKey+" (ModifyIndex ")
	require.Contains(t, r.stdout, "), version "+rlsVersion([]byte(rlsAPI))+"\n"+rlsAPI)
	require.Contains(t, r.stdout, "), version "+rlsVersion([]byte(web))+"\n"+web)
	r = run(t, "--output", "json", "rls", "get", "--prefix", p, "--region", "us-east", "web.yaml")
	require.Equal(t, ExitOK, r.code, r)
	docs := decodeJSON(t, r.stdout)["documents"].([]any)
	require.Len(t, docs, 1)
	require.Equal(t, "web", docs[0].(map[string]any)["domain"])
	require.Equal(t, web, docs[0].(map[string]any)["content"])
	r = run(t, "rls", "get", "--prefix", p, "--region", "us-east", "nope.yaml")
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, "us-east holds no rate limit service document nope.yaml (api.yaml, web.yaml)")

	// rm: a name not there is refused, nothing written.
	r = run(t, "rls", "rm", "--prefix", p, "--region", "us-east", "web.yaml", "nope.yaml")
	require.Equal(t, ExitError, r.code, r)
	require.NotNil(t, kv(t, usEast, webKey))
	r = run(t, "rls", "rm", "--prefix", p, "--region", "us-east", "--dry-run", "web.yaml")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "us-east: remove "+webKey+"\n- removed domain web\n- removed limit web.user: 30/minute")
	require.NotNil(t, kv(t, usEast, webKey))
	r = run(t, "rls", "rm", "--prefix", p, "--region", "us-east", "--message", "web retired", "web.yaml")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "us-east: ok: removed "+webKey+" (history ")
	require.Nil(t, kv(t, usEast, webKey))
	require.Equal(t, rlsAPI, string(kv(t, usEast, apiKey).Value), "the other documents stay")

	h := run(t, "--output", "json", "rules", "history", "--prefix", p, "--region", "us-east", "--kind", "rls")
	require.Equal(t, ExitOK, h.code, h)
	entries := decodeJSON(t, h.stdout)["entries"].([]any)
	require.Len(t, entries, 3)
	rm := entries[0].(map[string]any)
	require.Equal(t, webKey, rm["key"])
	require.Equal(t, "web retired", rm["message"])
	require.Empty(t, rm["document"])

	// rollback: the removed document comes back...
	r = run(t, "rls", "rollback", "--prefix", p, "--region", "us-east", "web.yaml")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "+ added   domain web\n")
	require.Equal(t, web, string(kv(t, usEast, webKey).Value))
	h = run(t, "--output", "json", "rules", "history", "--prefix", p, "--region", "us-east", "--kind", "rls", "--limit", "1")
	require.Equal(t, ExitOK, h.code, h)
	back := decodeJSON(t, h.stdout)["entries"].([]any)[0].(map[string]any)
	require.Contains(t, back["message"], "rollback to version "+rlsVersion([]byte(web))+" (history ")
	// ...rolling back again restores the state before it: absent.
	r = run(t, "rls", "rollback", "--prefix", p, "--region", "us-east", "web.yaml")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "- removed domain web\n")
	require.Nil(t, kv(t, usEast, webKey))
	// --to a version; an unknown one is an error.
	r = run(t, "rls", "rollback", "--prefix", p, "--region", "us-east", "--to", rlsVersion([]byte(web)), "web.yaml")
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, web, string(kv(t, usEast, webKey).Value))
	r = run(t, "rls", "rollback", "--prefix", p, "--region", "us-east", "--to", "0123456789ab", "web.yaml")
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, `no version "0123456789ab" of `+webKey)

	// A rollback that would leave the region invalid is refused: api.yaml
	// replaced by a document of domain web collides with web.yaml.
	clash := filepath.Join(rlsDir(t, map[string]string{"api.yaml": web}), "api.yaml")
	r = run(t, "rls", "rm", "--prefix", p, "--region", "us-east", "web.yaml")
	require.Equal(t, ExitOK, r.code, r)
	r = run(t, "rls", "push", "--prefix", p, "--region", "us-east", clash)
	require.Equal(t, ExitOK, r.code, r)
	r = run(t, "rls", "rollback", "--prefix", p, "--region", "us-east", "web.yaml")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "the documents of us-east after rls rollback: invalid")
	require.Nil(t, kv(t, usEast, webKey))
}

// rls push --all writes the documents into every region, one by one, after
// checking every region: one region that would be left invalid stops all.
func TestRLSPushAll(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	api1 := filepath.Join(rlsDir(t, map[string]string{"api.yaml": rlsAPI}), "api.yaml")
	r := run(t, "rls", "push", "--prefix", p, "--region", "eu-west", "--all", api1)
	require.Equal(t, ExitUsage, r.code, r)

	// us-east holds another document of domain api: pushing api.yaml
	// everywhere would leave it invalid, so nothing is written anywhere.
	other := filepath.Join(rlsDir(t, map[string]string{"other.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"}), "other.yaml")
	r = run(t, "rls", "push", "--prefix", p, "--region", "us-east", other)
	require.Equal(t, ExitOK, r.code, r)
	r = run(t, "rls", "push", "--prefix", p, "--all", api1)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "the documents of us-east after rls push: invalid")
	require.Contains(t, r.stderr, "1 of 2 regions would be left invalid; nothing was written")
	require.Nil(t, kv(t, euWest, p+"rls/eu-west/api.yaml"))

	r = run(t, "rls", "rm", "--prefix", p, "--region", "us-east", "other.yaml")
	require.Equal(t, ExitOK, r.code, r)
	r = run(t, "--output", "json", "rls", "push", "--prefix", p, "--all", "--message", "everywhere", api1)
	require.Equal(t, ExitOK, r.code, r)
	results := decodeJSON(t, r.stdout)["results"].([]any)
	require.Len(t, results, 2)
	for i, dc := range []string{"eu-west", "us-east"} {
		res := results[i].(map[string]any)
		require.Equal(t, dc, res["region"])
		require.Equal(t, []any{p + "rls/" + dc + "/api.yaml"}, res["written"])
	}
	require.Equal(t, rlsAPI, string(kv(t, euWest, p+"rls/eu-west/api.yaml").Value))
	require.Equal(t, rlsAPI, string(kv(t, usEast, p+"rls/us-east/api.yaml").Value))

	r = run(t, "rls", "push", "--prefix", p, "--all", api1)
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, "eu-west: unchanged: the region already holds these documents\nus-east: unchanged: the region already holds these documents\n", r.stdout)
}
