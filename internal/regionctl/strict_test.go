package regionctl

import (
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
)

// put writes a key as a person would by hand, past regionctl's checks.
func put(t *testing.T, key, value string) {
	t.Helper()
	c, err := euWest.Client(euWest.ManagementToken)
	require.NoError(t, err)
	_, err = c.KV().Put(&api.KVPair{Key: key, Value: []byte(value)}, nil)
	require.NoError(t, err)
}

// Issue 42, item 6: what regionctl reads from Consul it reads as the edges
// do, strictly: a key in another case, an unknown key or a key twice is
// an invalid document (exit 4), not a setting applied behind the
// reviewer's back.
func TestStoredDocumentsReadStrictly(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	for _, tc := range []struct {
		name, cmd, key, doc, want string
	}{
		{"enforcement: good", "enforcement", "enforcement/eu-west", `{"mode":"shadow"}`, ""},
		{"enforcement: a key in another case", "enforcement", "enforcement/eu-west", `{"MODE":"shadow"}`, `unknown field "MODE": names are case-sensitive, the field is "mode"`},
		{"enforcement: an unknown key", "enforcement", "enforcement/eu-west", `{"mode":"shadow","pct":1}`, `unknown field "pct"`},
		{"enforcement: a key twice", "enforcement", "enforcement/eu-west", `{"mode":"enforce","mode":"shadow"}`, `field "mode" given twice`},
		{"enforcement: a percent off the steps", "enforcement", "enforcement/eu-west", `{"mode":"enforce","percent":0.001}`, "percent: must be in steps of 0.01"},
		{"shedder: good", "shedder", "shedder/eu-west", `{"enabled":false}`, ""},
		{"shedder: a key in another case", "shedder", "shedder/eu-west", `{"ENABLED":false}`, `unknown field "ENABLED": names are case-sensitive, the field is "enabled"`},
		{"shedder: an unknown key", "shedder", "shedder/eu-west", `{"enabld":false}`, `unknown field "enabld" (did you mean "enabled"?)`},
		{"shedder: a key twice", "shedder", "shedder/eu-west", `{"enabled":true,"enabled":false}`, `field "enabled" given twice`},
		{"shedder: a nested key in another case", "shedder", "shedder/eu-west", `{"tiers":{"Paths":[]}}`, `tiers: unknown field "Paths"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			put(t, p+tc.key, tc.doc)
			r := run(t, tc.cmd, "get", "--prefix", p, "--region", "eu-west")
			if tc.want == "" {
				require.Equal(t, ExitOK, r.code, r)
				return
			}
			require.Equal(t, ExitInvalid, r.code, r)
			require.Contains(t, r.stdout+r.stderr, tc.want)
		})
	}
	// Setting keys likewise: ENABLED is not enabled.
	r := run(t, "shedder", "set", "--prefix", p, "--region", "eu-west", "--reset", "ENABLED=false")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "ENABLED: unknown setting")
}

// The share of keys a switch enforces comes in steps of 0.01 %: a finer
// one is refused, where before 0.001 was written and enforced one key in
// 10,000 while the gauge showed 0.
func TestEnforcementPercentSteps(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	for _, bad := range []string{"0.001", "12.345", "99.999"} {
		r := run(t, "enforcement", "set", "--prefix", p, "--region", "eu-west", "enforce", "--percent", bad)
		require.Equal(t, ExitUsage, r.code, r)
		require.Contains(t, r.stdout+r.stderr, "percent: must be in steps of 0.01 (one key in 10000), got "+bad)
	}
	require.Nil(t, kv(t, euWest, p+"enforcement/eu-west"), "nothing written")
	for _, good := range []string{"0.01", "33.33", "0"} {
		r := run(t, "enforcement", "set", "--prefix", p, "--region", "eu-west", "enforce", "--percent", good)
		require.Equal(t, ExitOK, r.code, r)
	}
}

// Clearing every rule takes an explicit empty document, and regionctl
// pushes one only with --allow-empty: a slip (the wrong file, a generator
// that produced nothing) must not switch a region's limits off.
func TestPushLeavingNoRulesNeedsAllowEmpty(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	empty := file(t, "version: 1\nrules: []\n")
	r := run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", empty)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "leaves eu-west with no rules at all")
	require.Contains(t, r.stderr, "--allow-empty")
	require.Nil(t, kv(t, euWest, p+"rules/global"), "nothing written")
	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", "--dry-run", empty)
	require.Equal(t, ExitInvalid, r.code, "a dry run says what the push would do: %s", r)
	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", "--dry-run", "--allow-empty", empty)
	require.Equal(t, ExitOK, r.code, r)
	require.Nil(t, kv(t, euWest, p+"rules/global"), "nothing written")

	one := file(t, "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 10, window: 1m}\n")
	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", one)
	require.Equal(t, ExitOK, r.code, r)
	// A region document switching the only rule off empties the region too.
	off := file(t, "version: 1\nrules:\n  - {id: per-ip, disabled: true}\n")
	r = run(t, "--output", "json", "rules", "push", "--prefix", p, "--region", "eu-west", off)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Equal(t, []any{"eu-west"}, decodeJSON(t, r.stdout)["regions"])
	require.Nil(t, kv(t, euWest, p+"rules/regions/eu-west"))

	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", "--allow-empty", empty)
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, "version: 1\nrules: []\n", string(kv(t, euWest, p+"rules/global").Value))
	// Rolling back to the document with a rule needs nothing; back to the
	// empty one needs the flag again.
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "eu-west", "--global")
	require.Equal(t, ExitOK, r.code, r)
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "eu-west", "--global")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "--allow-empty")
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "eu-west", "--global", "--allow-empty")
	require.Equal(t, ExitOK, r.code, r)
}
