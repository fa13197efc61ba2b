package regionctl

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/region"
)

func TestUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	for _, args := range [][]string{
		{"rules", "get", "--region", "eu-west"},
		{"rules", "push", "--all", file(t, rulesV1)},
		{"regions", "status"},
		{"shedder", "set", "--region", "eu-west", "good=0.75"},
	} {
		r := run(t, append([]string{"--consul", addr}, args...)...)
		require.Equal(t, ExitUnreachable, r.code, r)
		require.Contains(t, r.stderr, "regionctl: consul unreachable at "+addr+": ")
		require.Contains(t, r.stderr, "connection refused")
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %s", r.stderr)
	}

	// From the environment, with JSON output.
	var out, errOut strings.Builder
	code := (&app{}).run([]string{"rules", "history", "--region", "eu-west", "--output", "json"},
		testEnv("CONSUL_HTTP_ADDR", addr), &out, &errOut)
	require.Equal(t, ExitUnreachable, code)
	m := decodeJSON(t, out.String())
	require.Equal(t, "unreachable", m["reason"])
	require.Equal(t, float64(ExitUnreachable), m["exit_code"])
}

func TestUnknownRegion(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	for _, args := range [][]string{
		{"rules", "get", "--region", "nowhere"},
		{"rules", "push", "--region", "nowhere", file(t, rulesV1)},
		{"rules", "diff", "--region", "nowhere", file(t, rulesV1)},
		{"rules", "history", "--region", "nowhere"},
		{"rules", "rollback", "--region", "nowhere"},
		{"shedder", "get", "--region", "nowhere"},
		{"regions", "status", "--region", "nowhere"},
	} {
		r := run(t, append([]string{"--prefix", p}, args...)...)
		require.Equal(t, ExitUnknown, r.code, r)
		require.Contains(t, r.stderr, `regionctl: unknown region "nowhere": no Consul datacenter of that name (known: eu-west, us-east)`)
	}
}

func TestPermissionDenied(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	env := func(token string) func(string) string {
		return testEnv("CONSUL_HTTP_ADDR", aclAgent.HTTPAddr(), "CONSUL_HTTP_TOKEN", token)
	}
	f := file(t, rulesV1)
	r := runApp(t, &app{}, env(aclAgent.ManagementToken), "rules", "push", "--prefix", p, "--region", "ap-south", f)
	require.Equal(t, ExitOK, r.code, r)

	readOnly, err := aclAgent.Token(`key_prefix "" { policy = "read" }`)
	require.NoError(t, err)
	r = runApp(t, &app{}, env(readOnly), "rules", "get", "--prefix", p, "--region", "ap-south")
	require.Equal(t, ExitOK, r.code, r)

	r = runApp(t, &app{}, env(readOnly), "rules", "push", "--prefix", p, "--region", "ap-south", file(t, rulesV2))
	require.Equal(t, ExitDenied, r.code, r)
	require.Contains(t, r.stderr, "regionctl: permission denied by Consul ACLs (the token lacks key write on "+p+"rules/regions/ap-south and "+p+"history/ap-south/ in ap-south)")

	r = runApp(t, &app{}, env(readOnly), "shedder", "set", "--prefix", p, "--region", "ap-south", "good=0.75")
	require.Equal(t, ExitDenied, r.code, r)
	require.Contains(t, r.stderr, "permission denied")

	// The anonymous token may not even read; --token overrides the env.
	r = runApp(t, &app{}, env(readOnly), "rules", "get", "--token", "", "--prefix", p, "--region", "ap-south")
	require.Equal(t, ExitDenied, r.code, r)
	require.Contains(t, r.stderr, "regionctl: permission denied by Consul ACLs (the token lacks key read on "+p+"rules/global in ap-south)")

	// The catalog filters what a token may not read, silently: regionctl
	// notices and says so rather than reporting no edges.
	admin, err := aclAgent.Client(aclAgent.ManagementToken)
	require.NoError(t, err)
	require.NoError(t, admin.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: "acl-edge", Name: region.Service, Port: 8080,
		Meta:  map[string]string{"region": "ap-south", "pop": "bom"},
		Check: &api.AgentServiceCheck{TTL: "10m", Status: api.HealthPassing},
	}))
	t.Cleanup(func() { _ = admin.Agent().ServiceDeregister("acl-edge") })
	require.Eventually(t, func() bool {
		r = runApp(t, &app{}, env(aclAgent.ManagementToken), "regions", "status", "--prefix", p)
		return strings.Contains(r.stdout, "acl-edge")
	}, 10*time.Second, 50*time.Millisecond)
	r = runApp(t, &app{}, env(readOnly), "regions", "status", "--prefix", p)
	require.Equal(t, ExitDenied, r.code, r)
	require.Contains(t, r.stdout, "ap-south: error: permission denied by Consul ACLs (the token lacks service read on edgeguard-edge and node read in ap-south)")

	r = runApp(t, &app{}, env(readOnly), "rules", "push", "--prefix", p, "--region", "ap-south", "--output", "json", file(t, rulesV2))
	require.Equal(t, ExitDenied, r.code, r)
	require.Equal(t, "permission_denied", decodeJSON(t, r.stdout)["reason"])
}

func TestUsage(t *testing.T) {
	t.Parallel()
	r := run(t)
	require.Equal(t, ExitUsage, r.code, r)
	require.Contains(t, r.stderr, "Exit codes:")

	r = run(t, "--help")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "6  not converged")

	r = run(t, "rules", "push", "--help")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "Usage: regionctl rules push")
	require.Contains(t, r.stdout, "-message")

	for _, args := range [][]string{
		{"rules"},
		{"rules", "frobnicate"},
		{"rules", "push", "f.yaml"},
		{"rules", "push", "--all", "--region", "eu-west", "f.yaml"},
		{"rules", "get", "--region", "eu-west", "--global", "--document"},
		{"rules", "get", "--region", "eu-west", "--output", "xml"},
		{"rules", "validate", "--bogus", "f.yaml"},
		{"rules", "validate"},
		{"shedder", "set", "--region", "eu-west"},
		{"rules", "get"},
	} {
		r := run(t, args...)
		require.Equal(t, ExitUsage, r.code, "%v: %s", args, r)
		require.True(t, strings.HasPrefix(r.stderr, "regionctl: "), "%v: %s", args, r)
	}
}

func TestCombine(t *testing.T) {
	require.Equal(t, ExitOK, combine(nil))
	require.Equal(t, ExitOK, combine([]int{0, 0}))
	require.Equal(t, ExitConflict, combine([]int{0, 3, 3}))
	require.Equal(t, ExitError, combine([]int{3, 0, 7}))
}

func TestDiffRules(t *testing.T) {
	d := diffRules(nil, nil)
	require.True(t, d.empty())
	var a app
	old, err := a.parseStoredOnce([]byte(rulesV1))
	require.NoError(t, err)
	d = diffRules(old, old)
	require.True(t, d.empty())
	n, err := a.parseStoredOnce([]byte(strings.Replace(rulesV1, "path_prefix: [\"/admin\"]", "path_prefix: [\"/admin\", \"/ops\"]\n      methods: [get]", 1)))
	require.NoError(t, err)
	d = diffRules(old, n)
	require.Equal(t, []changedRule{{ID: "admin", Fields: []fieldChange{
		{Field: "match.path_prefix", Old: "[/admin]", New: "[/admin, /ops]"},
		{Field: "match.methods", Old: "[]", New: "[GET]"},
	}}}, d.Changed)
	require.Empty(t, d.Added)
	require.Empty(t, d.Removed)
}

// README promises JSON on stdout for every command, errors included: a bad
// command line too, with the usage text on stderr.
func TestUsageErrorJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		args      []string
		usage     string // expected on stderr ("" for none)
		errSubstr string
	}{
		{"unknown flag", []string{"--output", "json", "rules", "get", "--region", "eu-west", "--no-such-flag"},
			"Usage: regionctl rules get", "flag provided but not defined: -no-such-flag"},
		{"flag without its value", []string{"--output", "json", "rules", "rollback", "--region", "eu-west", "--to"},
			"Usage: regionctl rules rollback", "flag needs an argument: -to"},
		{"--output json after the bad flag", []string{"rules", "history", "--bogus", "--region", "eu-west", "--output=json"},
			"Usage: regionctl rules history", "flag provided but not defined: -bogus"},
		{"bad value", []string{"rules", "history", "--output", "json", "--limit", "many"},
			"Usage: regionctl rules history", `invalid value "many" for flag -limit`},
		{"no command", []string{"--output", "json"}, "Exit codes:", "no command given"},
		{"unknown command", []string{"--output", "json", "rules", "frobnicate"}, "", `unknown command "rules frobnicate"`},
		{"bad global flag", []string{"--output", "json", "--nope", "rules", "get"}, "", "flag provided but not defined: -nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.args...)
			require.Equal(t, ExitUsage, r.code, r)
			m := decodeJSON(t, r.stdout)
			require.Equal(t, "usage", m["reason"], r)
			require.Equal(t, float64(ExitUsage), m["exit_code"], r)
			require.Contains(t, m["error"], tc.errSubstr, r)
			if tc.usage != "" {
				require.Contains(t, r.stderr, tc.usage, r)
			}
		})
	}

	// --help is not an error: its usage goes to stdout, once.
	r := run(t, "rules", "rollback", "--help")
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, 1, strings.Count(r.stdout, "Usage: regionctl rules rollback"), r)
	require.Empty(t, r.stderr)
	// In text mode a bad flag prints the usage and the error to stderr.
	r = run(t, "rules", "get", "--no-such-flag")
	require.Equal(t, ExitUsage, r.code, r)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "Usage: regionctl rules get")
	require.Contains(t, r.stderr, "regionctl: regionctl rules get: flag provided but not defined: -no-such-flag")
	require.Equal(t, 2, strings.Count(r.stderr, "\n"), "the error and the synopsis, not every flag: %s", r.stderr)
}

// With one region's Consul servers down, the other region's agent still
// answers, with a 500 saying it could not forward the request: that region
// is unreachable (exit 7), and the message says which one. Not parallel: it
// stops us-east, and restarts and re-federates it before the parallel tests
// run.
func TestRegionUnreachableThroughAnotherAgent(t *testing.T) {
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--all", file(t, rulesV1)).code)
	require.NoError(t, usEast.Stop())
	t.Cleanup(func() {
		require.NoError(t, usEast.Start())
		require.NoError(t, euWest.JoinWAN(usEast))
	})

	r := run(t, "regions", "status", "--prefix", p)
	require.Equal(t, ExitUnreachable, r.code, r)
	require.Contains(t, r.stdout, "eu-west: expected rules version "+version(t, rulesV1), r)
	require.Contains(t, r.stdout, "us-east: error: region us-east unreachable: the Consul agent at "+euWest.HTTPAddr()+" answered, but could not reach the servers of us-east: ", r)
	require.Contains(t, r.stderr, "regionctl: status incomplete: us-east (unreachable)", r)

	r = run(t, "regions", "status", "--prefix", p, "--output", "json")
	require.Equal(t, ExitUnreachable, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, "unreachable", m["reason"])
	regions := m["regions"].([]any)
	require.Len(t, regions, 2)
	us := regions[1].(map[string]any)
	require.Equal(t, "us-east", us["region"])
	require.Equal(t, float64(ExitUnreachable), us["exit_code"])
	require.Contains(t, us["error"], "region us-east unreachable")

	r = run(t, "rules", "push", "--prefix", p, "--all", file(t, rulesV2))
	require.Equal(t, ExitUnreachable, r.code, r)
	require.Contains(t, r.stdout, "eu-west: ok:", r)
	require.Contains(t, r.stdout, "us-east: unreachable: region us-east unreachable: ", r)
	require.Contains(t, r.stdout, "1 of 2 regions failed: us-east (unreachable)", r)

	r = run(t, "rules", "get", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitUnreachable, r.code, r)
	require.True(t, strings.HasPrefix(r.stderr, "regionctl: region us-east unreachable: "), r)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %s", r.stderr)
}
