package regionctl

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// The verdict's thresholds, as documented: any refused document, too little
// traffic, or a rate above max-ratio × the rest's + slack fails the canary.
func TestCanaryJudge(t *testing.T) {
	cf := &canaryFlags{maxRatio: 2, slack: 0.02, minRequests: 100}
	rest := figures{Requests: 1000, Deny: 0.05, Err5xx: 0.01, Shed: 0, Fallback: 0}
	for _, tc := range []struct {
		name    string
		canary  figures
		promote bool
		reason  string
	}{
		{"like the rest", figures{Requests: 500, Deny: 0.05, Err5xx: 0.01}, true, ""},
		{"at the bound", figures{Requests: 500, Deny: 0.12, Err5xx: 0.04, Shed: 0.02, Fallback: 0.02}, true, ""},
		{"denies more", figures{Requests: 500, Deny: 0.13}, false, "deny rate 0.1300 over 0.1200"},
		{"denies everything", figures{Requests: 500, Deny: 1}, false, "deny rate"},
		{"5xx", figures{Requests: 500, Err5xx: 0.05}, false, "5xx rate"},
		{"sheds", figures{Requests: 500, Shed: 0.03}, false, "shed rate"},
		{"falls back", figures{Requests: 500, Fallback: 0.5}, false, "fallback rate"},
		{"refused a document", figures{Requests: 500, Refused: 1}, false, "refused 1 document"},
		{"too little traffic", figures{Requests: 99}, false, "under --canary-min-requests 100"},
		{"garbage figure", figures{Requests: 500, Deny: math.NaN()}, false, "deny rate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := cf.judge(tc.canary, rest)
			require.Equal(t, tc.promote, v.Promote, "%v", v.Reasons)
			if tc.reason != "" {
				require.Contains(t, strings.Join(v.Reasons, "; "), tc.reason)
			}
		})
	}
}

// Bad command lines are usage errors, and write nothing.
func TestCanaryFlagsRefused(t *testing.T) {
	p := prefix(t)
	f := file(t, rulesV1)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"key injection", []string{"--region", "eu-west", "--canary", "ams/../../global"}, "not a PoP name"},
		{"global, key injection", []string{"--region", "eu-west", "--global", "--canary", "../canary/eu-west/ams"}, "not a PoP name"},
		{"global, a region too", []string{"--region", "eu-west", "--global", "--canary", "eu-west/ams"}, "not a PoP name"},
		{"every region, no region", []string{"--all", "--canary", "ams"}, "--all --canary takes REGION/POP"},
		{"every region, empty region", []string{"--all", "--canary", "/ams"}, "--all --canary takes REGION/POP"},
		{"every region, no PoP", []string{"--all", "--canary", "eu-west/"}, "not a PoP name"},
		{"every region, key injection in the PoP", []string{"--all", "--canary", "eu-west/../../global"}, "not a PoP name"},
		{"every region, key injection in the region", []string{"--all", "--canary", "../eu-west/ams"}, `".." is not a region name`},
		{"every region, a region with a slash", []string{"--all", "--canary", "eu-west/ams/x"}, "not a PoP name"},
		{"every region, no duration", []string{"--all", "--canary", "eu-west/ams", "--for", "0s"}, "--for must be > 0"},
		{"every region, no prometheus", []string{"--all", "--canary", "eu-west/ams"}, "--prometheus"},
		{"empty-ish", []string{"--region", "eu-west", "--canary", "-"}, "not a PoP name"},
		{"no duration", []string{"--region", "eu-west", "--canary", "ams", "--for", "0s"}, "--for must be > 0"},
		{"negative ratio", []string{"--region", "eu-west", "--canary", "ams", "--canary-max-ratio", "-1"}, "--canary-max-ratio"},
		{"NaN ratio", []string{"--region", "eu-west", "--canary", "ams", "--canary-max-ratio", "NaN"}, "--canary-max-ratio"},
		{"slack over 1", []string{"--region", "eu-west", "--canary", "ams", "--canary-slack", "2"}, "--canary-slack"},
		{"no prometheus", []string{"--region", "eu-west", "--canary", "ams"}, "--prometheus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--prefix", p, "rules", "push"}, tc.args...)
			if tc.want != "--prometheus" {
				args = append(args, "--prometheus", "http://127.0.0.1:1")
			}
			r := run(t, append(args, f)...)
			require.Equal(t, ExitUsage, r.code, r)
			require.Contains(t, r.stderr, tc.want)
		})
	}
	pairs, _, err := euWestKV(t).List(p, nil)
	require.NoError(t, err)
	require.Empty(t, pairs, "nothing written")
}

// A global canary (--region R --global, or --all REGION/POP) is refused
// before anything is written when the candidate under a region's document
// would be invalid in any region it goes to, when its region is unknown,
// or when its PoP has no edge; the canary key is never written.
func TestGlobalCanaryRefused(t *testing.T) {
	p := prefix(t)
	layout := region.NewLayout(p)
	f := file(t, rulesV1)
	c, err := usEast.Client(usEast.ManagementToken)
	require.NoError(t, err)
	common := []string{"--for", "1s", "--prometheus", "http://127.0.0.1:1", "--yes"}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown region", []string{"--all", "--canary", "nowhere/ams"}, ExitUnknown, `unknown region "nowhere"`},
		{"no edge in the PoP", []string{"--region", "eu-west", "--global", "--canary", "ams"}, ExitUsage, "no healthy edge of eu-west is in PoP ams"},
		{"every region, no edge in the PoP", []string{"--all", "--canary", "eu-west/ams"}, ExitUsage, "no healthy edge of eu-west is in PoP ams"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"--prefix", p, "rules", "push"}, tc.args...), common...)
			r := run(t, append(args, f)...)
			require.Equal(t, tc.code, r.code, r)
			require.Contains(t, r.stderr, tc.want)
		})
	}
	pairs, _, err := euWestKV(t).List(p, nil)
	require.NoError(t, err)
	require.Empty(t, pairs, "nothing written")

	// us-east's region document is broken: any global document makes its
	// effective rules invalid, so a canary in eu-west of a document --all
	// also writes to us-east is refused, and nothing is written anywhere.
	_, err = c.KV().Put(&api.KVPair{Key: layout.RegionRules("us-east"), Value: []byte("version: 1\nrules:\n  - id: x\n")}, nil)
	require.NoError(t, err)
	r := run(t, append(append([]string{"--prefix", p, "rules", "push", "--all", "--canary", "eu-west/ams"}, common...), f)...)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "nothing was written:\n  the effective rules of us-east would be invalid")
	r = run(t, append(append([]string{"--prefix", p, "rules", "push", "--region", "us-east", "--global", "--canary", "ams"}, common...), f)...)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "the effective rules of us-east would be invalid")
	pairs, _, err = euWestKV(t).List(p, nil)
	require.NoError(t, err)
	require.Empty(t, pairs, "nothing written in eu-west")
	pairs, _, err = c.KV().List(p, nil)
	require.NoError(t, err)
	require.Len(t, pairs, 1, "nothing written in us-east but its region document")
}

// A PoP whose edges never report the candidate is rolled back once
// --canary-load-timeout passes, naming the edges that lag, even when that
// is longer than --timeout (which bounds each Consul request, and so each
// blocking read of the catalog). Nothing is written and the key is gone.
func TestCanaryLoadTimeoutNamesTheLaggingEdges(t *testing.T) {
	p := prefix(t)
	layout := region.NewLayout(p)
	for _, pop := range []string{"ams", "fra"} {
		registerEdge(t, euWest, "load-timeout-"+pop, map[string]string{"region": "eu-west", "pop": pop, "rules_version": "old"})
	}
	r := run(t, "--prefix", p, "--timeout", "2s", "rules", "push", "--region", "eu-west", "--global", "--canary", "ams",
		"--for", "1s", "--canary-load-timeout", "3s", "--prometheus", "http://127.0.0.1:1", "--yes", file(t, rulesV1))
	require.Equal(t, ExitRolledBack, r.code, r)
	require.Contains(t, r.stdout, "canary rolled back: PoP ams did not load rules version ")
	require.Contains(t, r.stdout, "within 3s (a refused document?): load-timeout-ams runs old")
	require.Nil(t, kv(t, euWest, layout.GlobalCanary("eu-west", "ams")))
	require.Nil(t, kv(t, euWest, layout.GlobalRules()))
}

// A canary needs edges in its PoP and others to compare with; a region
// already running one refuses a second. Nothing is written.
func TestCanaryRefusedWithoutEdgesOrWhileRunning(t *testing.T) {
	p := prefix(t)
	f := file(t, rulesV1)
	args := []string{"--prefix", p, "rules", "push", "--region", "eu-west", "--canary", "ams", "--for", "1s", "--prometheus", "http://127.0.0.1:1", f}
	r := run(t, args...)
	require.Equal(t, ExitUsage, r.code, r)
	require.Contains(t, r.stderr, "no healthy edge of eu-west is in PoP ams")

	// A canary left running (here by hand) blocks another.
	layout := region.NewLayout(p)
	_, err := euWestKV(t).Put(&api.KVPair{Key: layout.RulesCanary("eu-west", "fra"), Value: []byte(rulesV2)}, nil)
	require.NoError(t, err)
	cfg := api.DefaultConfig()
	cfg.Address = euWest.HTTPAddr()
	rc, err := region.NewClient(cfg, p)
	require.NoError(t, err)
	require.ErrorIs(t, rc.StartCanary(context.Background(), region.CanaryRules, "eu-west", "ams", []byte(rulesV1)), region.ErrCanaryRunning)
	require.Nil(t, kv(t, euWest, layout.RulesCanary("eu-west", "ams")))
	require.Nil(t, kv(t, euWest, layout.RegionRules("eu-west")))
}

func euWestKV(t *testing.T) *api.KV {
	t.Helper()
	c, err := euWest.Client(euWest.ManagementToken)
	require.NoError(t, err)
	return c.KV()
}

// shedder set --canary checks its command line as rules push --canary
// does (a PoP name that cannot reach another key, a duration, Prometheus),
// before anything is read or written; without edges in the PoP it is
// refused; and a canary of another kind running in the region blocks it.
func TestShedderCanaryRefused(t *testing.T) {
	p := prefix(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"key injection", []string{"--canary", "ams/../../../shedder/eu-west"}, "not a PoP name"},
		{"no duration", []string{"--canary", "ams", "--for", "-1s"}, "--for must be > 0"},
		{"NaN ratio", []string{"--canary", "ams", "--canary-max-ratio", "NaN"}, "--canary-max-ratio"},
		{"no prometheus", []string{"--canary", "ams"}, "--prometheus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--prefix", p, "shedder", "set", "--region", "eu-west"}, tc.args...)
			if tc.want != "--prometheus" {
				args = append(args, "--prometheus", "http://127.0.0.1:1")
			}
			r := run(t, append(args, "good=0.6")...)
			require.Equal(t, ExitUsage, r.code, r)
			require.Contains(t, r.stderr, tc.want)
		})
	}
	layout := region.NewLayout(p)
	args := []string{"--prefix", p, "shedder", "set", "--region", "eu-west", "--canary", "ams", "--for", "1s", "--prometheus", "http://127.0.0.1:1", "good=0.6"}
	r := run(t, args...)
	require.Equal(t, ExitUsage, r.code, r)
	require.Contains(t, r.stderr, "no healthy edge of eu-west is in PoP ams")
	pairs, _, err := euWestKV(t).List(p, nil)
	require.NoError(t, err)
	require.Empty(t, pairs, "nothing written")

	// Edges in two PoPs, and a rules canary left running (by hand) at fra.
	for _, pop := range []string{"ams", "fra"} {
		registerEdge(t, euWest, "shedder-canary-"+pop, map[string]string{"region": "eu-west", "pop": pop})
	}
	_, err = euWestKV(t).Put(&api.KVPair{Key: layout.RulesCanary("eu-west", "fra"), Value: []byte(rulesV2)}, nil)
	require.NoError(t, err)
	r = run(t, args...)
	require.Equal(t, ExitConflict, r.code, r)
	require.Contains(t, r.stderr, "a canary is already running in eu-west")
	require.Nil(t, kv(t, euWest, layout.ShedderCanary("eu-west", "ams")))
	require.Nil(t, kv(t, euWest, layout.Shedder("eu-west")))
}

// hosts push --canary checks its command line as the other canaries do,
// and refuses a region without a stored host table (the PoP would have
// nothing to return to); nothing is written.
func TestHostsCanaryRefused(t *testing.T) {
	p := prefix(t)
	f := file(t, "version: 1\nhosts:\n  a.example: {pool: default}\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"key injection", []string{"--canary", "../eu-west"}, "not a PoP name"},
		{"no duration", []string{"--canary", "ams", "--for", "0s"}, "--for must be > 0"},
		{"no prometheus", []string{"--canary", "ams"}, "--prometheus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--prefix", p, "hosts", "push", "--region", "eu-west", "--yes"}, tc.args...)
			if tc.want != "--prometheus" {
				args = append(args, "--prometheus", "http://127.0.0.1:1")
			}
			r := run(t, append(args, f)...)
			require.Equal(t, ExitUsage, r.code, r)
			require.Contains(t, r.stderr, tc.want)
		})
	}
	r := run(t, "--prefix", p, "hosts", "push", "--region", "eu-west", "--yes", "--canary", "ams", "--for", "1s", "--prometheus", "http://127.0.0.1:1", f)
	require.Equal(t, ExitUsage, r.code, r)
	require.Contains(t, r.stderr, "eu-west has no host table for PoP ams to return to")
	pairs, _, err := euWestKV(t).List(p, nil)
	require.NoError(t, err)
	require.Empty(t, pairs, "nothing written")
}
