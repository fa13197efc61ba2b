package regionctl

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// laterSchemas are the document schemas of a release after 0.1.0 that
// introduced, at schema 2 of each kind, fields that exist today (a push
// cannot use a field the parsers do not know yet).
func laterSchemas() region.Schemas {
	s := region.Schemas{}
	for k, f := range region.DocumentSchemas {
		s[k] = maps.Clone(f)
	}
	s[region.SchemaRules]["rules.shadow"] = 2
	s[region.SchemaHosts]["pools.*.rewrite_host"] = 2
	s[region.SchemaRLS]["descriptors.shadow_mode"] = 2
	s[region.SchemaShedder]["host_share.tracked_hosts"] = 2
	s[region.SchemaEnforcement]["percent"] = 2
	return s
}

// registerEdge registers an edge with the given catalog meta (a 0.1.0
// edge registers region, pop, rules_version and global_share only) and
// waits until the catalog lists it so.
func registerEdge(t *testing.T, dc *testenv.Consul, id string, meta map[string]string) {
	t.Helper()
	c, err := dc.Client(dc.ManagementToken)
	require.NoError(t, err)
	require.NoError(t, c.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: id, Name: region.Service, Port: 8080, Meta: meta,
		Check: &api.AgentServiceCheck{CheckID: id + ":ttl", TTL: "10m", Status: api.HealthPassing},
	}))
	t.Cleanup(func() { _ = c.Agent().ServiceDeregister(id) })
	err = proc.PollEvery(testenv.Within(t, 10*time.Second), 20*time.Millisecond, "the catalog to list "+id, func(context.Context) error {
		entries, _, err := c.Health().Service(region.Service, "", false, nil)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Service.ID == id && maps.Equal(e.Service.Meta, meta) {
				return nil
			}
		}
		return fmt.Errorf("%s is not listed with meta %v", id, meta)
	})
	require.NoError(t, err)
}

func namedFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

const shadowRules = `version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 10
    window: 10s
    shadow: true
`

// TestPushRefusedToEdgesThatCannotReadIt: a document using a field of a
// newer schema than some registered edge reads is refused (exit 9, nothing
// written) naming that edge and the field, for every kind of document;
// --force --yes writes it; a document of schema-1 fields only, or a region
// whose edges all read the newer schema, is written as before.
func TestPushRefusedToEdgesThatCannotReadIt(t *testing.T) {
	// Not parallel: edges are not namespaced by prefix.
	p := prefix(t)
	later := laterSchemas()
	runLater := func(args ...string) result {
		t.Helper()
		return runApp(t, &app{schemas: later}, testEnv(), append(args[:1:1], append([]string{args[1], "--prefix", p}, args[2:]...)...)...)
	}
	registerEdge(t, euWest, "edge-old-1", map[string]string{"region": "eu-west", "pop": "ams", "rules_version": "x"}) // 0.1.0
	newMeta := map[string]string{"region": "eu-west", "pop": "fra", "rules_version": "x", "version": "v0.2.0"}
	for kind, n := range later.Reads() {
		newMeta["schema_"+kind] = strconv.Itoa(n)
	}
	registerEdge(t, euWest, "edge-new-1", newMeta)

	// Schema-1 fields only: every edge reads it.
	r := runLater("rules", "push", "--region", "eu-west", file(t, rulesV1))
	require.Equal(t, ExitOK, r.code, r)
	before := kv(t, euWest, p+"rules/regions/eu-west")
	require.NotNil(t, before)

	// A field of rules schema 2: refused, naming the old edge only.
	r = runLater("rules", "push", "--region", "eu-west", file(t, shadowRules))
	require.Equal(t, ExitUnreadable, r.code, r)
	require.Contains(t, r.stderr, "rules.shadow, of rules schema 2, which 1 registered edge of eu-west cannot read: edge-old-1 (pop ams, version -, reads rules schema 1)")
	require.Contains(t, r.stderr, "push with --force")
	require.NotContains(t, r.stderr, "edge-new-1")
	require.Equal(t, before.ModifyIndex, kv(t, euWest, p+"rules/regions/eu-west").ModifyIndex, "nothing was written")

	r = runLater("rules", "push", "--output", "json", "--region", "eu-west", file(t, shadowRules))
	require.Equal(t, ExitUnreadable, r.code, r)
	require.Equal(t, "unreadable", decodeJSON(t, r.stdout)["reason"])

	// The same table, as this binary's: every field is schema 1, written.
	require.Equal(t, 1, region.DocumentSchemas.Reads()[region.SchemaRules])

	// --force on a terminal asks (after the push's own question); no is no.
	a := &app{schemas: later, isTerminal: func() bool { return true }, stdin: &lines{"y\n", "n\n"}}
	r = runApp(t, a, testEnv(), "rules", "push", "--prefix", p, "--region", "eu-west", "--force", file(t, shadowRules))
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, "--force: writing to eu-west documents some registered edges cannot read")
	require.Contains(t, r.stderr, "Write to eu-west anyway?")
	require.Contains(t, r.stderr, "not confirmed: nothing was written")
	require.Equal(t, before.ModifyIndex, kv(t, euWest, p+"rules/regions/eu-west").ModifyIndex, "nothing was written")

	// --force --yes writes it.
	a = &app{schemas: later, isTerminal: func() bool { return true }, stdin: strings.NewReader("")}
	r = runApp(t, a, testEnv(), "rules", "push", "--prefix", p, "--region", "eu-west", "--force", "--yes", file(t, shadowRules))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stderr, "edge-old-1 (pop ams, version -, reads rules schema 1)")
	require.Contains(t, string(kv(t, euWest, p+"rules/regions/eu-west").Value), "shadow: true")

	// Every kind of document goes through the same check.
	hostsDoc := "version: 1\npools:\n  api:\n    urls: [http://127.0.0.1:9]\n    rewrite_host: true\nhosts:\n  a.example: {pool: api}\n"
	rlsDoc := "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: k2\n        shadow_mode: true\n        rate_limit: {unit: second, requests_per_unit: 5}\n"
	for _, c := range []struct {
		name  string
		args  []string
		field string
		key   string
	}{
		{"hosts", []string{"hosts", "push", "--region", "eu-west", namedFile(t, "hosts.yaml", hostsDoc)}, "pools.*.rewrite_host, of hosts schema 2", p + "hosts/eu-west"},
		{"rls", []string{"rls", "push", "--region", "eu-west", namedFile(t, "api.yaml", rlsDoc)}, "descriptors.shadow_mode, of rls schema 2", p + "rls/eu-west/api.yaml"},
		{"shedder", []string{"shedder", "set", "--region", "eu-west", "host_share.tracked_hosts=32"}, "host_share.tracked_hosts, of shedder schema 2", p + "shedder/eu-west"},
		{"enforcement", []string{"enforcement", "set", "--region", "eu-west", "enforce", "--percent", "50"}, "percent, of enforcement schema 2", p + "enforcement/eu-west"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runLater(c.args...)
			require.Equal(t, ExitUnreadable, r.code, r)
			require.Contains(t, r.stderr, c.field)
			require.Contains(t, r.stderr, "edge-old-1 (pop ams, version -, reads "+c.name+" schema 1)")
			require.Nil(t, kv(t, euWest, c.key), "nothing was written")

			r = runLater(append(c.args[:2:2], append([]string{"--force", "--yes"}, c.args[2:]...)...)...)
			require.Equal(t, ExitOK, r.code, r)
			require.NotNil(t, kv(t, euWest, c.key))
		})
	}

	// regions status shows each edge's version.
	r = run(t, "regions", "status", "--prefix", p, "--region", "eu-west")
	require.Regexp(t, `edge-new-1\s+\S+\s+healthy\s+version v0\.2\.0\s`, r.stdout)
	require.Regexp(t, `edge-old-1\s+\S+\s+healthy\s+version 0\.1\.0 or older\s`, r.stdout)

	// Once the old edge is upgraded, the push needs no --force.
	registerEdge(t, euWest, "edge-old-1", newMeta)
	r = runLater("rules", "push", "--region", "eu-west", file(t, strings.Replace(shadowRules, "limit: 10", "limit: 11", 1)))
	require.Equal(t, ExitOK, r.code, r)
}

// lines answers one line per read, as a terminal does.
type lines []string

func (l *lines) Read(p []byte) (int, error) {
	if len(*l) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*l)[0])
	*l = (*l)[1:]
	return n, nil
}

// A refusal names at most maxListed edges, sorted, and counts the rest.
func TestUnreadableNamesBoundedEdges(t *testing.T) {
	u := unreadable{need: region.Need{Kind: "rules", Schema: 2, Fields: []string{"rules.shadow"}}, key: "edgeguard/rules/global"}
	for i := range maxListed + 5 {
		u.edges = append(u.edges, region.Edge{ID: "edge-" + strconv.Itoa(100+i), PoP: "ams", Healthy: i != 0})
	}
	got := u.describe("eu-west")
	require.Contains(t, got, "edgeguard/rules/global uses rules.shadow, of rules schema 2, which 25 registered edges of eu-west cannot read: ")
	require.Contains(t, got, "edge-100 (pop ams, version -, reads rules schema 1, unhealthy)")
	require.Contains(t, got, "edge-119 (pop ams, version -, reads rules schema 1); and 5 more")
	require.NotContains(t, got, "edge-120")
}

// A token that may not list the edges cannot push a document of a newer
// schema (the check needs the catalog) unless --force, which warns.
func TestNewerSchemaPushNeedsTheCatalog(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	env := func(token string) func(string) string {
		return testEnv("CONSUL_HTTP_ADDR", aclAgent.HTTPAddr(), "CONSUL_HTTP_TOKEN", token)
	}
	kvOnly, err := aclAgent.Token(`key_prefix "" { policy = "write" }`)
	require.NoError(t, err)
	registerEdge(t, aclAgent, "acl-old-edge", map[string]string{"region": "ap-south", "pop": "bom"})
	push := func(extra ...string) result {
		args := append([]string{"rules", "push", "--prefix", p, "--region", "ap-south"}, extra...)
		return runApp(t, &app{schemas: laterSchemas()}, env(kvOnly), append(args, file(t, shadowRules))...)
	}
	// Schema 1: no catalog read needed.
	r := runApp(t, &app{schemas: laterSchemas()}, env(kvOnly), "rules", "push", "--prefix", p, "--region", "ap-south", file(t, rulesV1))
	require.Equal(t, ExitOK, r.code, r)

	r = runApp(t, &app{schemas: laterSchemas()}, env(aclAgent.ManagementToken), "rules", "push", "--prefix", p, "--region", "ap-south", file(t, shadowRules))
	require.Equal(t, ExitUnreadable, r.code, r)
	require.Contains(t, r.stderr, "acl-old-edge (pop bom, version -, reads rules schema 1)")

	r = push()
	require.Equal(t, ExitDenied, r.code, r)
	require.Contains(t, r.stderr, "the token lacks service read on edgeguard-edge and node read in ap-south")

	r = push("--force", "--yes")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stderr, "regionctl: warning: --force: writing to ap-south without checking that its edges can read it: permission denied")
}
