package regionctl

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/stretchr/testify/assert"
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
		assert.Equal(t, ExitUnreachable, r.code, r)
		assert.Contains(t, r.stderr, "regionctl: consul unreachable at "+addr+": ")
		assert.Contains(t, r.stderr, "connection refused")
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %s", r.stderr)
	}

	// From the environment, with JSON output.
	var out, errOut strings.Builder
	code := (&app{}).run([]string{"rules", "history", "--region", "eu-west", "--output", "json"},
		testEnv("CONSUL_HTTP_ADDR", addr), &out, &errOut)
	assert.Equal(t, ExitUnreachable, code)
	m := decodeJSON(t, out.String())
	assert.Equal(t, "unreachable", m["reason"])
	assert.Equal(t, float64(ExitUnreachable), m["exit_code"])
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
		assert.Equal(t, ExitUnknown, r.code, r)
		assert.Contains(t, r.stderr, `regionctl: unknown region "nowhere": no Consul datacenter of that name (known: eu-west, us-east)`)
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
	assert.Equal(t, ExitDenied, r.code, r)
	assert.Contains(t, r.stderr, "regionctl: permission denied by Consul ACLs (the token lacks key write on "+p+"rules/regions/ap-south and "+p+"history/ap-south/ in ap-south)")

	r = runApp(t, &app{}, env(readOnly), "shedder", "set", "--prefix", p, "--region", "ap-south", "good=0.75")
	assert.Equal(t, ExitDenied, r.code, r)
	assert.Contains(t, r.stderr, "permission denied")

	// The anonymous token may not even read; --token overrides the env.
	r = runApp(t, &app{}, env(readOnly), "rules", "get", "--token", "", "--prefix", p, "--region", "ap-south")
	assert.Equal(t, ExitDenied, r.code, r)
	assert.Contains(t, r.stderr, "regionctl: permission denied by Consul ACLs (the token lacks key read on "+p+"rules/global in ap-south)")

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
	assert.Equal(t, ExitDenied, r.code, r)
	assert.Contains(t, r.stdout, "ap-south: error: permission denied by Consul ACLs (the token lacks service read on edgeguard-edge and node read in ap-south)")

	r = runApp(t, &app{}, env(readOnly), "rules", "push", "--prefix", p, "--region", "ap-south", "--output", "json", file(t, rulesV2))
	assert.Equal(t, ExitDenied, r.code, r)
	assert.Equal(t, "permission_denied", decodeJSON(t, r.stdout)["reason"])
}

func TestUsage(t *testing.T) {
	t.Parallel()
	r := run(t)
	assert.Equal(t, ExitUsage, r.code, r)
	assert.Contains(t, r.stderr, "Exit codes:")

	r = run(t, "--help")
	assert.Equal(t, ExitOK, r.code, r)
	assert.Contains(t, r.stdout, "6  not converged")

	r = run(t, "rules", "push", "--help")
	assert.Equal(t, ExitOK, r.code, r)
	assert.Contains(t, r.stdout, "Usage: regionctl rules push")
	assert.Contains(t, r.stdout, "-message")

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
		assert.Equal(t, ExitUsage, r.code, "%v: %s", args, r)
		assert.True(t, strings.HasPrefix(r.stderr, "regionctl: "), "%v: %s", args, r)
	}
}

func TestCombine(t *testing.T) {
	assert.Equal(t, ExitOK, combine(nil))
	assert.Equal(t, ExitOK, combine([]int{0, 0}))
	assert.Equal(t, ExitConflict, combine([]int{0, 3, 3}))
	assert.Equal(t, ExitError, combine([]int{3, 0, 7}))
}

func TestDiffRules(t *testing.T) {
	d := diffRules(nil, nil)
	assert.True(t, d.empty())
	old, err := parseStored([]byte(rulesV1))
	require.NoError(t, err)
	d = diffRules(old, old)
	assert.True(t, d.empty())
	n, err := parseStored([]byte(strings.Replace(rulesV1, "path_prefix: [\"/admin\"]", "path_prefix: [\"/admin\", \"/ops\"]\n      methods: [get]", 1)))
	require.NoError(t, err)
	d = diffRules(old, n)
	assert.Equal(t, []changedRule{{ID: "admin", Fields: []fieldChange{
		{Field: "match.path_prefix", Old: "[/admin]", New: "[/admin, /ops]"},
		{Field: "match.methods", Old: "[]", New: "[GET]"},
	}}}, d.Changed)
	assert.Empty(t, d.Added)
	assert.Empty(t, d.Removed)
}
