package region_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// everyHostField uses every field of the host table.
const everyHostField = `version: 1
pools:
  api:
    urls: [https://127.0.0.1:8443]
    dial_timeout: 1s
    header_timeout: 2s
    read_idle_timeout: 3s
    timeout: 4s
    max_conns: 10
    max_request_body_size: 1024
    health_check_interval: 5s
    health_check_path: /healthz
    unhealthy_after: 3
    eject_for: 10s
    rewrite_host: true
    tls: {server_name: api.internal, insecure_skip_verify: true}
hosts:
  api.example.com: {pool: api}
  "*.example.org": {pool: default}
`

// TestReleasedDocumentsNeedSchema1: documents the parsers accept — the
// examples, a rate limit service document, the shedder's every setting, a
// host table using every field — are read by every edge since 0.1.0.
func TestReleasedDocumentsNeedSchema1(t *testing.T) {
	type doc struct {
		kind  string
		data  []byte
		parse func([]byte) error
	}
	var docs []doc
	examples, err := filepath.Glob("../../examples/rules*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, examples)
	for _, f := range examples {
		if strings.HasSuffix(f, ".test.yaml") {
			continue // a rule test file (regionctl rules test), not a rules document
		}
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		docs = append(docs, doc{region.SchemaRules, data, func(b []byte) error { _, err := rules.Parse(b); return err }})
	}
	rls, err := os.ReadFile("../rlsconfig/testdata/messaging.yaml")
	require.NoError(t, err)
	sh, err := json.Marshal(shedder.DefaultConfig())
	require.NoError(t, err)
	docs = append(docs,
		doc{region.SchemaRLS, rls, func(b []byte) error { _, err := rlsconfig.Parse("messaging.yaml", b); return err }},
		doc{region.SchemaShedder, sh, func(b []byte) error { _, err := shedder.ParseConfig(b); return err }},
		doc{region.SchemaHosts, []byte(everyHostField), func(b []byte) error { _, err := hosts.Parse(b); return err }},
		doc{region.SchemaEnforcement, []byte(`{"mode":"enforce","percent":12.5}`), func(b []byte) error { _, err := region.ParseEnforcement(b); return err }},
	)
	for _, d := range docs {
		require.NoError(t, d.parse(d.data), "%s: the parser must accept the document", d.kind)
		need, err := region.DocumentSchemas.Required(d.kind, d.data)
		require.NoError(t, err, d.kind)
		require.Equal(t, region.Need{Kind: d.kind, Schema: 1}, need, d.kind)
	}
	require.Equal(t, map[string]int{"rules": 1, "shedder": 3, "hosts": 2, "enforcement": 1, "rls": 1},
		region.DocumentSchemas.Reads(), "the host table's schema 2: pools' concurrency; the shedder's: host weights")
}

// TestPoolConcurrencyNeedsHostsSchema2: a host table using a pool's
// concurrency limit (after 0.1.0) needs schema 2, naming the field, so a
// push is refused while a 0.1.0 edge (which would refuse the unknown
// field) serves the region.
func TestPoolConcurrencyNeedsHostsSchema2(t *testing.T) {
	doc := strings.Replace(everyHostField, "    rewrite_host: true\n", "    rewrite_host: true\n    concurrency: {limit: 8, queue: 2}\n", 1)
	_, err := hosts.Parse([]byte(doc))
	require.NoError(t, err)
	need, err := region.DocumentSchemas.Required(region.SchemaHosts, []byte(doc))
	require.NoError(t, err)
	require.Equal(t, 2, need.Schema)
	require.Contains(t, need.Fields, "pools.*.concurrency.limit")
}

// TestHostQueueNeedsShedderSchema3: settings changing the host queue need
// shedder schema 3, naming the fields; settings at its defaults (regionctl
// writes every setting) stay schema 1.
func TestHostQueueNeedsShedderSchema3(t *testing.T) {
	cfg, err := shedder.ApplySettings(shedder.DefaultConfig(), map[string]string{"host_share.queue_timeout": "250ms", "host_share.max_queued": "100"})
	require.NoError(t, err)
	data, err := json.Marshal(cfg)
	require.NoError(t, err)
	need, err := region.DocumentSchemas.Required(region.SchemaShedder, data)
	require.NoError(t, err)
	require.Equal(t, region.Need{Kind: region.SchemaShedder, Schema: 3, Fields: []string{"host_share.max_queued", "host_share.queue_timeout"}}, need)

	cfg, err = shedder.ApplySettings(shedder.DefaultConfig(), map[string]string{"host_share.queue_timeout": "1s", "host_share.max_queued": "0"})
	require.NoError(t, err)
	data, err = json.Marshal(cfg)
	require.NoError(t, err)
	need, err = region.DocumentSchemas.Required(region.SchemaShedder, data)
	require.NoError(t, err)
	require.Equal(t, region.Need{Kind: region.SchemaShedder, Schema: 1}, need)
}

// TestHostWeightsNeedShedderSchema2: settings weighting hosts need shedder
// schema 2, naming the fields, while settings that weight nothing (as
// regionctl writes them: every setting) stay schema 1, so setting another
// field is not refused while an edge of 0.1.0 serves the region.
func TestHostWeightsNeedShedderSchema2(t *testing.T) {
	cfg, err := shedder.ApplySettings(shedder.DefaultConfig(), map[string]string{"host_share.weights": "a.example:2,*.big.example:4"})
	require.NoError(t, err)
	data, err := json.Marshal(cfg)
	require.NoError(t, err)
	need, err := region.DocumentSchemas.Required(region.SchemaShedder, data)
	require.NoError(t, err)
	require.Equal(t, region.Need{Kind: region.SchemaShedder, Schema: 2, Fields: []string{"host_share.weights", "host_share.weights.*"}}, need)

	cfg, err = shedder.ApplySettings(shedder.DefaultConfig(), map[string]string{"host_share.default_weight": "3"})
	require.NoError(t, err)
	data, err = json.Marshal(cfg)
	require.NoError(t, err)
	need, err = region.DocumentSchemas.Required(region.SchemaShedder, data)
	require.NoError(t, err)
	require.Equal(t, region.Need{Kind: region.SchemaShedder, Schema: 2, Fields: []string{"host_share.default_weight"}}, need)
	back, err := shedder.ParseConfig(data)
	require.NoError(t, err)
	require.Equal(t, cfg, back)

	cfg, err = shedder.ApplySettings(shedder.DefaultConfig(), map[string]string{"host_share.tracked_hosts": "8", "host_share.default_weight": "1"})
	require.NoError(t, err)
	data, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NotContains(t, string(data), "weight")
	need, err = region.DocumentSchemas.Required(region.SchemaShedder, data)
	require.NoError(t, err)
	require.Equal(t, 1, need.Schema)
}

// newer is DocumentSchemas with a field of schema 2 in each of rules, hosts
// (under a host, a map entry) and rls (in a nested descriptor), and one of
// schema 3 in rules.
func newer() region.Schemas {
	s := region.Schemas{}
	for k, f := range region.DocumentSchemas {
		s[k] = maps.Clone(f)
	}
	s[region.SchemaRules]["rules.tenant"] = 2
	s[region.SchemaRules]["rules.match.ja4"] = 2
	s[region.SchemaRules]["rules.quota"] = 3
	s[region.SchemaHosts]["hosts.*.path_semantics"] = 2
	s[region.SchemaRLS]["descriptors.rate_limit.jitter"] = 2
	return s
}

func TestRequiredSchema(t *testing.T) {
	cases := []struct {
		name, kind, doc string
		want            region.Need
		err             string
	}{
		{"schema 1 fields only", "rules", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, key: [ip]}\n",
			region.Need{Kind: "rules", Schema: 1}, ""},
		{"a schema 2 field", "rules", "version: 1\nrules:\n  - {id: a, limit: 1, window: 1s, match: {ja4: [x]}}\n  - {id: b, tenant: t}\n",
			region.Need{Kind: "rules", Schema: 2, Fields: []string{"rules.match.ja4", "rules.tenant"}}, ""},
		{"the newest field wins", "rules", "rules:\n  - {id: a, tenant: t}\n  - {id: b, quota: 3}\n",
			region.Need{Kind: "rules", Schema: 3, Fields: []string{"rules.quota"}}, ""},
		{"a field under a map entry", "hosts", "version: 1\nhosts:\n  a.example: {pool: default}\n  b.example: {pool: default, path_semantics: raw}\n",
			region.Need{Kind: "hosts", Schema: 2, Fields: []string{"hosts.*.path_semantics"}}, ""},
		{"a host named like a field", "hosts", "hosts:\n  pool: {pool: default}\n",
			region.Need{Kind: "hosts", Schema: 1}, ""},
		{"a field of a nested descriptor", "rls", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1, jitter: 1}\n",
			region.Need{Kind: "rls", Schema: 2, Fields: []string{"descriptors.rate_limit.jitter"}}, ""},
		{"free-form metadata", "rls", "domain: d\ndescriptors:\n  - key: a\n    metadata: {tenant: x, quota: {any: thing}}\n",
			region.Need{Kind: "rls", Schema: 1}, ""},
		{"an empty document", "shedder", "", region.Need{Kind: "shedder", Schema: 1}, ""},
		{"json", "enforcement", `{"mode": "shadow"}`, region.Need{Kind: "enforcement", Schema: 1}, ""},
		{"an unknown field", "rules", "rules:\n  - {id: a, tenant: t, colour: red}\n", region.Need{}, `unknown field "rules.colour"`},
		{"an unknown kind", "certs", "a: 1", region.Need{}, `unknown kind "certs"`},
		{"not yaml", "rules", "rules: [\n", region.Need{}, "rules document schema"},
		{"numeric keys", "hosts", "hosts:\n  1: {pool: default}\n  2: {path_semantics: raw}\n",
			region.Need{Kind: "hosts", Schema: 2, Fields: []string{"hosts.*.path_semantics"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			need, err := newer().Required(c.kind, []byte(c.doc))
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, need)
		})
	}
	require.Equal(t, 3, newer().Reads()["rules"])
	require.Equal(t, 2, newer().Reads()["hosts"])
	require.Equal(t, 3, newer().Reads()["shedder"], "host queues")
}

func TestEdgeReads(t *testing.T) {
	require.Equal(t, 1, region.Edge{}.Reads("rules"), "an edge of 0.1.0 registered no schemas")
	require.Equal(t, 1, region.Edge{Schemas: map[string]int{"hosts": 4}}.Reads("rules"))
	require.Equal(t, 4, region.Edge{Schemas: map[string]int{"hosts": 4}}.Reads("hosts"))
}
