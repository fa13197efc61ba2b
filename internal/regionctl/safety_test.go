package regionctl

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// rules diff exits like diff(1): 0 same, 1 different, 2 and up trouble —
// the general error is 10, never 1.
func TestDiffExitCodes(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "eu-west", file(t, rulesV1)).code)
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"same", []string{"--region", "eu-west", file(t, rulesV1)}, 0},
		{"different", []string{"--region", "eu-west", file(t, rulesV2)}, 1},
		{"files, same", []string{file(t, rulesV1), file(t, rulesV1)}, 0},
		{"files, different", []string{file(t, rulesV1), file(t, rulesV2)}, 1},
		{"usage", []string{"--region", "eu-west"}, 2},
		{"invalid file", []string{"--region", "eu-west", file(t, "version: 1\nrules:\n  - id: x\n    limit: -1\n")}, 4},
		{"unknown region", []string{"--region", "nowhere", file(t, rulesV1)}, 8},
		{"unreadable file: the general error", []string{"--region", "eu-west", "/nonexistent/rules.yaml"}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, append([]string{"rules", "diff", "--prefix", p}, tc.args...)...)
			require.Equal(t, tc.want, r.code, r)
			if tc.want >= 2 {
				require.NotEmpty(t, r.stderr)
				j := run(t, append([]string{"rules", "diff", "--prefix", p, "--output", "json"}, tc.args...)...)
				require.Equal(t, tc.want, j.code, j)
				require.EqualValues(t, tc.want, decodeJSON(t, j.stdout)["exit_code"])
			}
		})
	}
	r := run(t, "rules", "diff", "--consul", "127.0.0.1:1", "--prefix", p, "--region", "eu-west", file(t, rulesV1))
	require.Equal(t, ExitUnreachable, r.code, r)
}

// --expect-version takes the document version (rules history) or the
// effective version (rules get, rules diff); anything else refuses with a
// conflict and writes nothing.
func TestPushExpectVersion(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "eu-west", file(t, rulesV1)).code)
	v1 := version(t, rulesV1)

	r := run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--expect-version", "0123456789ab", file(t, rulesV2))
	require.Equal(t, ExitConflict, r.code, r)
	require.Contains(t, r.stderr, "eu-west: the region document of eu-west is document version "+v1)
	require.Contains(t, r.stderr, "nothing was written")
	g := run(t, "--output", "json", "rules", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, v1, decodeJSON(t, g.stdout)["version"], "still v1")

	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--expect-version", v1, "--message", "raise per-ip", file(t, rulesV2))
	require.Equal(t, ExitOK, r.code, r)
	// The version the operator saw is gone now: the same push again refuses.
	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--expect-version", v1, file(t, rulesV3))
	require.Equal(t, ExitConflict, r.code, r)

	// --message and the author are in the history.
	h := run(t, "--output", "json", "rules", "history", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, h.code, h)
	first := decodeJSON(t, h.stdout)["entries"].([]any)[0].(map[string]any)
	require.Equal(t, "raise per-ip", first["message"])
	require.Equal(t, "tester", first["author"])

	// --all: one stale region refuses them all.
	r = run(t, "rules", "push", "--prefix", p, "--all", "--expect-version", v1, file(t, rulesV3))
	require.Equal(t, ExitConflict, r.code, r)
	require.Nil(t, kv(t, usEast, p+"rules/global"), "nothing written to us-east either")
}

// --dry-run prints the change and the affected rules' traffic from a real
// Prometheus, and writes nothing.
func TestPushDryRun(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "eu-west", file(t, rulesV1)).code)
	v1, v2 := version(t, rulesV1), version(t, rulesV2)

	// An exporter standing in for an edge of eu-west, scraped by Prometheus.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var start = time.Now()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := int(time.Since(start).Seconds() * 40)
		fmt.Fprintf(w, "edgeguard_edge_decisions_total{rule=\"per-ip\",decision=\"allowed\",reason=\"redis\"} %d\n", n)
		fmt.Fprintf(w, "edgeguard_edge_decisions_total{rule=\"per-ip\",decision=\"denied\",reason=\"redis\"} %d\n", n/4)
		fmt.Fprintf(w, "edgeguard_edge_decisions_total{rule=\"_other\",decision=\"allowed\",reason=\"redis\"} %d\n", n)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	prom, err := testenv.StartPrometheus(testenv.PrometheusOptions{ScrapeInterval: 200 * time.Millisecond,
		Jobs: []testenv.ScrapeJob{{Name: "edge", Targets: []string{ln.Addr().String()}, Labels: map[string]string{"region": "eu-west"}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = prom.Close() })

	var r result
	require.Eventually(t, func() bool {
		r = runApp(t, &app{}, testEnv("PROMETHEUS_URL", prom.URL), "rules", "push", "--prefix", p, "--region", "eu-west", "--dry-run", file(t, rulesV2))
		return r.code == ExitOK && strings.Contains(r.stdout, "per-ip: allowed ")
	}, 20*time.Second, 200*time.Millisecond, "the dry run shows per-ip's traffic: %s", r)
	require.Contains(t, r.stdout, "eu-west: the region document ("+p+"rules/regions/eu-west): document version "+v1+" -> "+v2)
	require.Contains(t, r.stdout, `+ added   rule "api-key"`)
	require.Contains(t, r.stdout, `- removed rule "admin"`)
	require.Contains(t, r.stdout, "denied ")
	require.Contains(t, r.stdout, "admin: no series")
	require.Contains(t, r.stdout, "dry run: nothing was written")
	g := run(t, "--output", "json", "rules", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, v1, decodeJSON(t, g.stdout)["version"], "nothing was written")

	j := runApp(t, &app{}, testEnv("PROMETHEUS_URL", prom.URL), "--output", "json", "rules", "push", "--prefix", p, "--region", "eu-west", "--dry-run", file(t, rulesV2))
	require.Equal(t, ExitOK, j.code, j)
	ch := decodeJSON(t, j.stdout)["changes"].([]any)[0].(map[string]any)
	require.Equal(t, v2, ch["document_version"])
	require.Positive(t, ch["traffic"].(map[string]any)["per-ip"].(map[string]any)["allowed"])

	// The enforcement switch's dry run shows the region's decisions.
	r = runApp(t, &app{}, testEnv("PROMETHEUS_URL", prom.URL), "enforcement", "set", "--prefix", p, "--region", "eu-west", "--dry-run", "shadow")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "enforce -> shadow")
	require.Regexp(t, `traffic of eu-west \(requests/s per decision over the last 5m, every rule\): allowed [0-9.e+]+/s, denied [0-9.e+]+/s`, r.stdout)
	require.Nil(t, kv(t, euWest, p+"enforcement/eu-west"), "nothing was written")

	// No Prometheus: the change without traffic.
	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--dry-run", file(t, rulesV2))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "traffic not shown")
}

// On a terminal a push asks; only y or yes goes ahead, --yes skips the
// question, and without a terminal nothing is asked.
func TestPushConfirmation(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	v1 := version(t, rulesV1)
	tty := func(answer string) *app {
		return &app{stdin: strings.NewReader(answer), isTerminal: func() bool { return true }}
	}
	push := func(a *app, extra ...string) result {
		return runApp(t, a, testEnv(), append([]string{"rules", "push", "--prefix", p, "--region", "eu-west"}, append(extra, file(t, rulesV1))...)...)
	}
	r := push(tty("n\n"))
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, `+ added   rule "per-ip"`)
	require.Contains(t, r.stderr, "Push ")
	require.Contains(t, r.stderr, "not confirmed: nothing was written")
	require.Nil(t, kv(t, euWest, p+"rules/regions/eu-west"))

	r = push(tty("")) // stdin closed
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, "no answer")

	r = push(tty("yes\n"))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "ok: wrote")

	// --yes on a terminal: no question (an unanswered one would refuse).
	r = runApp(t, tty(""), testEnv(), "rules", "push", "--prefix", p, "--region", "eu-west", "--global", "--yes", file(t, rulesV1))
	require.Equal(t, ExitOK, r.code, r)
	require.NotContains(t, r.stderr, "Push ")

	// No terminal (the app Main builds when stdin is a pipe): no question.
	r = runApp(t, &app{stdin: strings.NewReader(""), isTerminal: func() bool { return false }}, testEnv(),
		"rules", "rollback", "--prefix", p, "--region", "eu-west", "--global")
	require.Equal(t, ExitError, r.code, "nothing to roll back to: %s", r)
	r = runApp(t, &app{stdin: strings.NewReader(""), isTerminal: func() bool { return false }}, testEnv(),
		"rules", "push", "--prefix", p, "--region", "eu-west", file(t, rulesV2))
	require.Equal(t, ExitOK, r.code, r)
	require.Empty(t, r.stderr)
	r = runApp(t, tty("y\n"), testEnv(), "rules", "rollback", "--prefix", p, "--region", "eu-west", "--expect-version", version(t, rulesV2))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stderr, "document version "+version(t, rulesV2)+" -> "+v1)
}

// The enforcement switch: set, dry run, expect-version, history with the
// message, rollback.
func TestEnforcementCommands(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	en := func(args ...string) result {
		return run(t, append([]string{"enforcement", args[0], "--prefix", p, "--region", "eu-west"}, args[1:]...)...)
	}
	r := en("get")
	require.Equal(t, ExitOK, r.code, r)
	def := region.DefaultEnforcement().Version()
	require.Contains(t, r.stdout, "eu-west: enforce (version "+def+"; "+p+"enforcement/eu-west is absent: the default)")

	shadow := region.Enforcement{Mode: region.ModeShadow, Percent: 100}
	r = en("set", "shadow", "--dry-run")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "enforce -> shadow; version "+def+" -> "+shadow.Version())
	require.Nil(t, kv(t, euWest, p+"enforcement/eu-west"))

	r = en("set", "shadow", "--expect-version", "0123456789ab")
	require.Equal(t, ExitConflict, r.code, r)
	r = en("set", "shadow", "--expect-version", def, "--message", "new rules in shadow first")
	require.Equal(t, ExitOK, r.code, r)
	require.JSONEq(t, `{"mode":"shadow"}`, string(kv(t, euWest, p+"enforcement/eu-west").Value))

	ten := region.Enforcement{Mode: region.ModeEnforce, Percent: 10}
	r = en("set", "enforce", "--percent", "10")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "shadow -> enforce 10%")
	j := run(t, "--output", "json", "enforcement", "get", "--prefix", p, "--region", "eu-west")
	m := decodeJSON(t, j.stdout)
	require.Equal(t, ten.Version(), m["version"])
	require.EqualValues(t, 10, m["percent"])

	for _, bad := range [][]string{{"set", "off"}, {"set", "shadow", "--percent", "5"}, {"set", "enforce", "--percent", "101"}, {"set"}} {
		r = en(bad...)
		require.Equal(t, ExitUsage, r.code, "%v: %s", bad, r)
	}

	h := run(t, "--output", "json", "rules", "history", "--prefix", p, "--region", "eu-west", "--kind", "enforcement")
	require.Equal(t, ExitOK, h.code, h)
	entries := decodeJSON(t, h.stdout)["entries"].([]any)
	require.Len(t, entries, 2)
	require.Equal(t, "new rules in shadow first", entries[1].(map[string]any)["message"])
	require.Equal(t, "tester", entries[1].(map[string]any)["author"])

	r = en("rollback")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "enforce 10% -> shadow")
	r = en("rollback", "--to", ten.Version())
	require.Equal(t, ExitOK, r.code, r)
	j = run(t, "--output", "json", "enforcement", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ten.Version(), decodeJSON(t, j.stdout)["version"])
	r = en("set", "enforce", "--percent", "10")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "unchanged")
}
