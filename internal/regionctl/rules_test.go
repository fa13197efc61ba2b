package regionctl

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	bad := file(t, `version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 0
    window: 10s
  - id: api
    key: [ip]
    algorithm: leaky
    limit: 10
    window: 1m
    scope: planet
`)
	r := run(t, "rules", "validate", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, bad+": invalid (3 problems)")
	require.Contains(t, r.stderr, "\n"+bad+`:6: rule "per-ip": limit: must be > 0`)
	require.Contains(t, r.stderr, "\n"+bad+`:10: rule "api": algorithm: unknown "leaky"`)
	require.Contains(t, r.stderr, "\n"+bad+`:13: rule "api": scope: unknown "planet"`)

	r = run(t, "rules", "validate", "--output", "json", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, false, m["valid"])
	probs := m["problems"].([]any)
	require.Len(t, probs, 3)
	require.Equal(t, map[string]any{"file": bad, "line": float64(6), "rule": "per-ip", "index": float64(0), "field": "limit", "message": "must be > 0 (got 0)"}, probs[0])

	// A decode error (unknown field) is reported too.
	r = run(t, "rules", "validate", file(t, "version: 1\nrules:\n  - id: x\n    limt: 3\n"))
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "limt")

	good := file(t, rulesV1)
	r = run(t, "rules", "validate", good)
	require.Equal(t, ExitOK, r.code, r)
	doc, err := rules.Parse([]byte(rulesV1))
	require.NoError(t, err)
	require.Equal(t, good+": valid, 2 rules, version "+rules.Version(doc)+"\n", r.stdout)

	r = run(t, "rules", "validate", "--output", "json", good)
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, rules.Version(doc), decodeJSON(t, r.stdout)["version"])

	r = run(t, "rules", "validate", "/nonexistent/rules.yaml")
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, "no such file")
}

func TestPushAllGetHistory(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	f := file(t, rulesV1)
	r := run(t, "rules", "push", "--prefix", p, "--all", "--author", "alice", "--message", "first rules", f)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "Regions are written one by one")
	require.Contains(t, r.stdout, "eu-west: ok:")
	require.Contains(t, r.stdout, "us-east: ok:")
	require.Contains(t, r.stdout, "all 2 regions done")

	// Each region's own datacenter holds the global document.
	for _, c := range []string{"eu-west", "us-east"} {
		agent := euWest
		if c == "us-east" {
			agent = usEast
		}
		pair := kv(t, agent, p+"rules/global")
		require.NotNil(t, pair, c)
		require.Equal(t, rulesV1, string(pair.Value), c)
		require.Nil(t, kv(t, agent, p+"rules/regions/"+c), c)
	}
	doc, err := rules.Parse([]byte(rulesV1))
	require.NoError(t, err)
	version := rules.Version(doc)

	r = run(t, "rules", "get", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "version "+version)
	require.Contains(t, r.stdout, "id: per-ip")
	require.Contains(t, r.stdout, "id: admin")

	r = run(t, "rules", "get", "--prefix", p, "--region", "us-east", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, version, m["version"])
	ids := []string{}
	for _, rule := range m["rules"].([]any) {
		ids = append(ids, rule.(map[string]any)["id"].(string))
	}
	require.Equal(t, []string{"admin", "per-ip"}, ids)

	r = run(t, "rules", "get", "--prefix", p, "--region", "eu-west", "--global")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, rulesV1)
	r = run(t, "rules", "get", "--prefix", p, "--region", "eu-west", "--document")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "no region document of eu-west")

	host, _ := os.Hostname()
	r = run(t, "rules", "history", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitOK, r.code, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 4, r)
	require.Regexp(t, `^SEQ\s+TIME\s+AUTHOR\s+HOST\s+KIND\s+VERSION\s+MESSAGE$`, lines[0])
	require.Regexp(t, `^\d{20}\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s+alice\s+`+host+`\s+rules/global\s+`+version+`\s+first rules$`, lines[1])
	require.Empty(t, lines[2])
	require.Regexp(t, `^us-east: 1 history entry stored; the last push \(.*\) kept the newest 50 of each document \(--keep-history\); 0 entries pruned in all$`, lines[3])

	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	entries := decodeJSON(t, r.stdout)["entries"].([]any)
	require.Len(t, entries, 1)
	e := entries[0].(map[string]any)
	require.Equal(t, "alice", e["author"])
	require.Equal(t, host, e["host"])
	require.Equal(t, "first rules", e["message"])
	require.Equal(t, version, e["version"])
	ts, err := time.Parse(time.RFC3339Nano, e["time"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), ts, time.Minute)

	// Pushing the same file again changes nothing and records nothing.
	r = run(t, "rules", "push", "--prefix", p, "--all", "--output", "json", f)
	require.Equal(t, ExitOK, r.code, r)
	m = decodeJSON(t, r.stdout)
	require.Contains(t, m["note"], "one by one")
	for _, res := range m["results"].([]any) {
		require.Equal(t, "unchanged", res.(map[string]any)["status"])
		require.Equal(t, version, res.(map[string]any)["version"])
	}
	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--output", "json")
	require.Len(t, decodeJSON(t, r.stdout)["entries"].([]any), 1)
}

func TestPushRegionDocument(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--all", file(t, rulesV1)).code)
	overlay := "version: 1\nrules:\n  - id: admin\n    disabled: true\n"
	r := run(t, "rules", "push", "--prefix", p, "--region", "us-east", "--output", "json", file(t, overlay))
	require.Equal(t, ExitOK, r.code, r)
	res := decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	require.Equal(t, "ok", res["status"])
	require.Equal(t, "region", res["document"])

	require.Equal(t, overlay, string(kv(t, usEast, p+"rules/regions/us-east").Value))
	require.Nil(t, kv(t, euWest, p+"rules/regions/us-east"), "region documents stay in their region")

	g, err := rules.Parse([]byte(rulesV1))
	require.NoError(t, err)
	o, err := rules.Parse([]byte(overlay))
	require.NoError(t, err)
	eff, err := rules.Merge(g, o)
	require.NoError(t, err)
	require.Equal(t, rules.Version(eff), res["version"])
	require.Equal(t, rules.Version(g), res["previous_version"])
	r = run(t, "rules", "get", "--prefix", p, "--region", "us-east")
	require.Contains(t, r.stdout, "version "+rules.Version(eff))
	require.NotContains(t, r.stdout, "id: admin")
}

func TestInvalidPushWritesNothing(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--all", file(t, rulesV1)).code)
	before := kv(t, euWest, p+"rules/global")

	bad := file(t, strings.Replace(rulesV2, "limit: 300", "limit: -1", 1))
	r := run(t, "rules", "push", "--prefix", p, "--all", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, ": invalid (1 problem); nothing was written")
	require.Contains(t, r.stderr, `rule "api-key": limit: must be > 0`)
	require.Empty(t, r.stdout)

	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--output", "json", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Equal(t, float64(ExitInvalid), decodeJSON(t, r.stdout)["exit_code"])

	after := kv(t, euWest, p+"rules/global")
	require.Equal(t, before.ModifyIndex, after.ModifyIndex)
	require.Equal(t, before.Value, after.Value)

	// A valid file whose merge with the region's stored (invalid) document
	// is invalid is refused in every region before any is written.
	c, err := usEast.Client("")
	require.NoError(t, err)
	_, err = c.KV().Put(&api.KVPair{Key: p + "rules/regions/us-east", Value: []byte("version: 1\nrules:\n  - id: x\n")}, nil)
	require.NoError(t, err)
	r = run(t, "rules", "push", "--prefix", p, "--all", file(t, rulesV2))
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "refusing to push")
	require.Contains(t, r.stderr, "the effective rules of us-east would be invalid")
	require.Equal(t, before.ModifyIndex, kv(t, euWest, p+"rules/global").ModifyIndex)
	require.Equal(t, rulesV1, string(kv(t, usEast, p+"rules/global").Value))
	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--output", "json")
	require.Len(t, decodeJSON(t, r.stdout)["entries"].([]any), 1)
}

func TestConcurrentPushConflict(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "eu-west", file(t, rulesV1)).code)

	// Both pushes read the document (same ModifyIndex) before either
	// writes: the barrier holds each in beforeWrite until both got there.
	var arrived sync.WaitGroup
	arrived.Add(2)
	release := make(chan struct{})
	go func() {
		arrived.Wait()
		close(release)
	}()
	hook := func(string) {
		arrived.Done()
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
	}
	files := []string{file(t, rulesV2), file(t, rulesV3)}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runApp(t, &app{beforeWrite: hook}, testEnv(),
				"rules", "push", "--prefix", p, "--region", "eu-west", files[i])
		}()
	}
	wg.Wait()
	codes := []int{results[0].code, results[1].code}
	require.ElementsMatch(t, []int{ExitOK, ExitConflict}, codes, "%s\n%s", results[0], results[1])
	loser, winner := results[0], 1
	if loser.code == ExitOK {
		loser, winner = results[1], 0
	}
	require.Contains(t, loser.stderr, "regionctl: pushing "+p+"rules/regions/eu-west to eu-west: conflict")
	require.Contains(t, loser.stderr, "re-run to retry")
	want, err := os.ReadFile(files[winner])
	require.NoError(t, err)
	require.Equal(t, string(want), string(kv(t, euWest, p+"rules/regions/eu-west").Value))

	// Exactly one history entry per landed push.
	r := run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--output", "json")
	require.Len(t, decodeJSON(t, r.stdout)["entries"].([]any), 2)

	// The same through the push machinery with an explicitly stale index.
	s, err := connectFor(t, p)
	require.NoError(t, err)
	defer s.close()
	pl := s.plan(docFlags{region: "eu-west"}, []byte(rulesV1), "v")
	require.NoError(t, pl.err)
	pl.index--
	res := s.write(pl, meta{author: "t"})
	require.Equal(t, "conflict", res.Status)
	require.Equal(t, ExitConflict, res.ExitCode)
}

func TestDiff(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "eu-west", file(t, rulesV1)).code)

	r := run(t, "rules", "diff", "--prefix", p, "--region", "eu-west", file(t, rulesV2))
	require.Equal(t, ExitDiffers, r.code, r)
	require.Empty(t, r.stderr)
	v1, v2 := version(t, rulesV1), version(t, rulesV2)
	require.Contains(t, r.stdout, `+ added   rule "api-key"`)
	require.Contains(t, r.stdout, `- removed rule "admin"`)
	require.Contains(t, r.stdout, `~ changed rule "per-ip": limit 10 -> 20; window 10s -> 1m0s`)
	require.Contains(t, r.stdout, "effective rules version of eu-west: "+v1+" -> "+v2)

	r = run(t, "rules", "diff", "--prefix", p, "--region", "eu-west", "--output", "json", file(t, rulesV2))
	require.Equal(t, ExitDiffers, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, []any{"api-key"}, m["added"])
	require.Equal(t, []any{"admin"}, m["removed"])
	require.Equal(t, "per-ip", m["changed"].([]any)[0].(map[string]any)["id"])
	require.Equal(t, v1, m["effective_version_before"])
	require.Equal(t, v2, m["effective_version_after"])

	// Same rules, other spelling: no changes, exit 0.
	respelled := strings.Replace(rulesV1, "limit: 30", "limit: 30 # admins are few", 1)
	r = run(t, "rules", "diff", "--prefix", p, "--region", "eu-west", file(t, respelled))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "no changes")
	require.Contains(t, r.stdout, "differ only in formatting")

	// The global document is absent: everything is added.
	r = run(t, "rules", "diff", "--prefix", p, "--region", "eu-west", "--global", file(t, rulesV3))
	require.Equal(t, ExitDiffers, r.code, r)
	require.Contains(t, r.stdout, `+ added   rule "per-ip"`)
}

func version(t *testing.T, doc string) string {
	t.Helper()
	d, err := rules.Parse([]byte(doc))
	require.NoError(t, err)
	return rules.Version(d)
}

func effective(t *testing.T, p, r string) string {
	t.Helper()
	res := run(t, "rules", "get", "--prefix", p, "--region", r, "--output", "json")
	require.Equal(t, ExitOK, res.code, res)
	return decodeJSON(t, res.stdout)["version"].(string)
}

func TestRollback(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	r := run(t, "rules", "rollback", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, "no earlier version of the region document of us-east")

	for _, doc := range []string{rulesV1, rulesV2} {
		require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "us-east", file(t, doc)).code)
	}
	require.Equal(t, version(t, rulesV2), effective(t, p, "us-east"))

	r = run(t, "rules", "rollback", "--prefix", p, "--region", "us-east", "--author", "bob")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "us-east: ok: rolled the region document back to")
	require.Equal(t, version(t, rulesV1), effective(t, p, "us-east"))
	require.Equal(t, rulesV1, string(kv(t, usEast, p+"rules/regions/us-east").Value))

	r = run(t, "rules", "history", "--prefix", p, "--region", "us-east", "--output", "json")
	e := decodeJSON(t, r.stdout)["entries"].([]any)[0].(map[string]any)
	require.Equal(t, "rollback to "+version(t, rulesV1), e["message"])
	require.Equal(t, "bob", e["author"])
	require.Equal(t, region.KindRegionRules, e["kind"])

	// --to a version further back.
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "us-east", file(t, rulesV3)).code)
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "us-east", "--to", version(t, rulesV2), "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	res := decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	require.Equal(t, version(t, rulesV2), res["version"])
	require.Equal(t, version(t, rulesV3), res["previous_version"])
	require.Equal(t, version(t, rulesV2), effective(t, p, "us-east"))

	r = run(t, "rules", "rollback", "--prefix", p, "--region", "us-east", "--to", "000000000000")
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, `no region document of us-east with version "000000000000"`)

	// The global document has its own history.
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "us-east", "--global")
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, "no earlier version of the global document of us-east")
}

// connectFor is a session as a command would open it, on prefix p.
func connectFor(t *testing.T, p string) (*session, error) {
	t.Helper()
	a := &app{env: testEnv()}
	a.g.fill(a.env)
	a.g.prefix = p
	return a.connect()
}

// Region documents that only switch global rules off all run no rules of
// their own, yet each is a different document: history must tell them
// apart, and rollback --to must restore the one asked for.
func TestRollbackToDisablingDocument(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	global := `version: 1
rules:
  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: burst, key: [ip], algorithm: token_bucket, limit: 100, window: 1s}
`
	offPerIP := "version: 1\nrules:\n  - {id: per-ip, disabled: true}\n"
	offBurst := "version: 1\nrules:\n  - {id: burst, disabled: true}\n"
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "us-east", "--global", file(t, global)).code)
	for _, doc := range []string{offPerIP, offBurst} {
		r := run(t, "rules", "push", "--prefix", p, "--region", "us-east", file(t, doc))
		require.Equal(t, ExitOK, r.code, r)
	}

	r := run(t, "rules", "history", "--prefix", p, "--region", "us-east", "--kind", "region", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	entries := decodeJSON(t, r.stdout)["entries"].([]any)
	require.Len(t, entries, 2)
	newest, older := entries[0].(map[string]any), entries[1].(map[string]any)
	require.Equal(t, offBurst, newest["document"])
	require.Equal(t, offPerIP, older["document"])
	require.NotEqual(t, newest["version"], older["version"], "two different documents share a version")

	r = run(t, "rules", "rollback", "--prefix", p, "--region", "us-east", "--to", older["version"].(string), "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	res := decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	require.Equal(t, "ok", res["status"], r)
	require.Equal(t, offPerIP, string(kv(t, usEast, p+"rules/regions/us-east").Value))
	g, err := rules.Parse([]byte(global))
	require.NoError(t, err)
	eff, err := rules.Merge(g, mustParseRules(t, offPerIP))
	require.NoError(t, err)
	require.Len(t, eff.Rules, 1)
	require.Equal(t, "burst", eff.Rules[0].ID)
	require.Equal(t, rules.Version(eff), effective(t, p, "us-east"), "the edges run the restored rules")

	// The stored document reports the version history gave it.
	r = run(t, "rules", "get", "--prefix", p, "--region", "us-east", "--document", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, older["version"], decodeJSON(t, r.stdout)["version"])

	// An empty region document is a third document, with its own version.
	r = run(t, "rules", "push", "--prefix", p, "--region", "us-east", "--output", "json", file(t, "version: 1\n"))
	require.Equal(t, ExitOK, r.code, r)
	res = decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	require.NotContains(t, []any{newest["version"], older["version"]}, res["document_version"])
}

func mustParseRules(t *testing.T, src string) *rules.Document {
	t.Helper()
	d, err := rules.Parse([]byte(src))
	require.NoError(t, err)
	return d
}
