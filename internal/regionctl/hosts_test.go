package regionctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/pkg/region"
)

const hostsV1 = `version: 1
pools:
  shop:
    urls: ["https://10.0.0.5:8443"]
    header_timeout: 5s
hosts:
  shop.example.com: {pool: shop}
  "*.shop.example.com": {pool: shop}
  static.example.com: {pool: default}
`

const hostsV2 = `version: 1
pools:
  shop:
    urls: ["https://10.0.0.5:8443"]
    header_timeout: 10s
  media:
    urls: ["http://10.0.1.5:8080"]
hosts:
  shop.example.com: {pool: shop}
  static.example.com: {pool: media}
  img.example.com: {pool: media}
`

// hostsFile writes a host table into the test's temp dir.
func hostsFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestHostsValidate(t *testing.T) {
	t.Parallel()
	good := hostsFile(t, hostsV1)
	v1, err := hosts.Parse([]byte(hostsV1))
	require.NoError(t, err)

	r := run(t, "hosts", "validate", good)
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, good+": valid, 3 hosts, 1 pool, version "+v1.Version()+"\n", r.stdout)

	unused := hostsFile(t, hostsV1+"pools:\n")
	r = run(t, "hosts", "validate", unused)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, unused+": invalid (1 problem):\n"+unused+`:10: pools: mapping key "pools" already defined at line 2`)

	spare := hostsFile(t, strings.Replace(hostsV1, "hosts:", "  spare: {urls: [\"http://s:80\"]}\nhosts:", 1))
	r = run(t, "hosts", "validate", spare)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, spare+`: warning: pool "spare" is defined but no host uses it`)

	bad := hostsFile(t, "version: 1\npools:\n  shop:\n    urls: [\"ftp://x\"]\nhosts:\n  a.com: {pool: nope}\n  A.com.: {pool: shop}\n  \"*\": {pool: shop}\n")
	r = run(t, "hosts", "validate", good, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, "regionctl: "+bad+": invalid (4 problems):\n")
	for _, want := range []string{
		bad + `:4: pools.shop.urls[0]: "ftp://x": scheme must be http or https, got "ftp"`,
		bad + `:6: hosts."a.com".pool: unknown pool "nope" (pools: default, shop)`,
		bad + `:6: hosts."a.com": the same host as "A.com." (line 7): both are "a.com"`,
		bad + `:8: hosts."*": a bare wildcard is not allowed`,
	} {
		require.Contains(t, r.stderr, want+"", r)
	}
	require.Contains(t, r.stderr, "1 of 2 files not valid")

	r = run(t, "hosts", "validate", "--output", "json", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	doc := decodeJSON(t, r.stdout)["documents"].([]any)[0].(map[string]any)
	p0 := doc["problems"].([]any)[0].(map[string]any)
	require.Equal(t, 4.0, p0["line"])
	require.Equal(t, "pools.shop.urls[0]", p0["field"])

	// Garbage, and a file over the size limit: exit 4, said in one line.
	garbage := hostsFile(t, "\x00\xff\xfe{{[[")
	r = run(t, "hosts", "validate", garbage)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, garbage+": invalid (1 problem)")
	huge := hostsFile(t, "version: 1\n#"+strings.Repeat("x", hosts.MaxDocumentSize)+"\n")
	r = run(t, "hosts", "validate", huge)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, huge+": document of 8388621 bytes is over the 8388608 byte limit")

	r = run(t, "hosts", "validate", filepath.Join(t.TempDir(), "absent.yaml"))
	require.Equal(t, ExitError, r.code, r)
	r = run(t, "hosts", "validate")
	require.Equal(t, ExitUsage, r.code, r)
}

func TestHostsDiffFiles(t *testing.T) {
	t.Parallel()
	v1, v2 := hostsFile(t, hostsV1), hostsFile(t, hostsV2)
	// The same table, reordered and spelled otherwise.
	same := hostsFile(t, `hosts:
  static.example.com.: {pool: default}
  "*.Shop.example.com": {pool: shop}
  Shop.Example.com: {pool: shop}
pools:
  shop: {header_timeout: 5000ms, urls: ["https://10.0.0.5:8443"]}
version: 1
`)
	r := run(t, "hosts", "diff", v1, same)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "no changes: "+same+" is the same host table as "+v1+" (the texts differ only in formatting, comments, order or spelling)")

	r = run(t, "hosts", "diff", v1, v2)
	require.Equal(t, ExitDiffers, r.code, r)
	require.Equal(t, fmt.Sprintf(`--- %s
+++ %s
hosts (3 changed):
  + img.example.com -> media
  ~ static.example.com: default -> media
  - *.shop.example.com: shop -> default pool (not in the table)
pools (2 changed):
  + media
  ~ shop: header_timeout 5s -> 10s
`, v1, v2), r.stdout[:strings.Index(r.stdout, "version: ")])

	// An empty table: every host loses its pool, and the diff says so.
	empty := hostsFile(t, "version: 1\n")
	r = run(t, "hosts", "diff", v1, empty)
	require.Equal(t, ExitDiffers, r.code, r)
	require.Contains(t, r.stdout, "  - shop.example.com: shop -> default pool (not in the table)\n")
	require.Contains(t, r.stdout, "  - static.example.com: default -> default pool (not in the table)\n")
	require.Contains(t, r.stdout, "pools (1 changed):\n  - shop\n")

	r = run(t, "hosts", "diff", "--output", "json", v1, v2)
	require.Equal(t, ExitDiffers, r.code, r)
	d := decodeJSON(t, r.stdout)["diff"].(map[string]any)
	require.Equal(t, []any{"media"}, d["pools_added"])

	bad := hostsFile(t, "version: 1\nhosts:\n  a.com: {pool: nope}\n")
	r = run(t, "hosts", "diff", v1, bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, bad+`:3: hosts."a.com".pool: unknown pool "nope"`)
	r = run(t, "hosts", "diff", v1, filepath.Join(t.TempDir(), "absent.yaml"))
	require.Equal(t, ExitDiffError, r.code, r)
	r = run(t, "hosts", "diff", v1)
	require.Equal(t, ExitUsage, r.code, r)
}

func TestHostsPushGetRollback(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	key := p + "hosts/eu-west"
	v1, v2 := hostsFile(t, hostsV1), hostsFile(t, hostsV2)
	t1, err := hosts.Parse([]byte(hostsV1))
	require.NoError(t, err)
	t2, err := hosts.Parse([]byte(hostsV2))
	require.NoError(t, err)

	r := run(t, "hosts", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "no host table in eu-west ("+key+" is absent): every host goes to the default pool")

	// A dry run shows the change and writes nothing.
	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", "--dry-run", v1)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "eu-west: the host table ("+key+"): version - -> "+t1.Version())
	require.Contains(t, r.stdout, "  + shop.example.com -> shop\n")
	require.Contains(t, r.stdout, "dry run: nothing was written")
	require.Nil(t, kv(t, euWest, key))

	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", "--message", "first", v1)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "eu-west: ok: pushed "+v1+": version - -> "+t1.Version())
	pair := kv(t, euWest, key)
	require.Equal(t, hostsV1, string(pair.Value))
	require.Nil(t, kv(t, usEast, key), "written to eu-west's datacenter only")

	r = run(t, "hosts", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, fmt.Sprintf("# host table of eu-west (%s, ModifyIndex %d, version %s): 3 hosts, 1 pool\n%s", key, pair.ModifyIndex, t1.Version(), hostsV1), r.stdout)

	r = run(t, "hosts", "diff", "--prefix", p, "--region", "eu-west", v1)
	require.Equal(t, ExitOK, r.code, r)
	r = run(t, "hosts", "diff", "--prefix", p, "--region", "eu-west", v2)
	require.Equal(t, ExitDiffers, r.code, r)
	require.Contains(t, r.stdout, "--- host table of eu-west ("+key+")\n+++ "+v2)

	// The same again: unchanged, nothing written.
	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", v1)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "eu-west: unchanged")
	require.Equal(t, pair.ModifyIndex, kv(t, euWest, key).ModifyIndex)

	// --expect-version: refused (exit 3) unless the table in force is it.
	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", "--expect-version", "0123456789ab", v2)
	require.Equal(t, ExitConflict, r.code, r)
	require.Contains(t, r.stderr, "the host table of eu-west is version "+t1.Version()+", not 0123456789ab; nothing was written")
	require.Equal(t, pair.ModifyIndex, kv(t, euWest, key).ModifyIndex)

	// A write between the read and the push: check-and-set refuses it.
	other := &app{beforeWrite: func(string) {
		c, err := euWest.Client(euWest.ManagementToken)
		require.NoError(t, err)
		_, err = c.KV().Put(&api.KVPair{Key: key, Value: []byte(hostsV1 + "# edited\n")}, nil)
		require.NoError(t, err)
	}}
	r = runApp(t, other, testEnv(), "hosts", "push", "--prefix", p, "--region", "eu-west", v2)
	require.Equal(t, ExitConflict, r.code, r)
	require.Equal(t, hostsV1+"# edited\n", string(kv(t, euWest, key).Value))

	// An invalid table: every problem as FILE:LINE, exit 4, nothing written.
	bad := hostsFile(t, "version: 1\nhosts:\n  a.com:443: {pool: shop}\n")
	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", bad)
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, bad+": invalid (2 problems); nothing was written:\n")
	require.Contains(t, r.stderr, bad+`:3: hosts."a.com:443": must not contain a port`)
	require.Contains(t, r.stderr, bad+`:3: hosts."a.com:443".pool: unknown pool "shop" (pools: default)`)
	require.Equal(t, hostsV1+"# edited\n", string(kv(t, euWest, key).Value))

	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", "--expect-version", t1.Version(), "--author", "ops", v2)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "version "+t1.Version()+" -> "+t2.Version())
	require.Contains(t, r.stdout, "  ~ static.example.com: default -> media\n")
	require.Equal(t, hostsV2, string(kv(t, euWest, key).Value))

	// History lists the pushes under kind hosts.
	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--kind", "hosts", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	es := decodeJSON(t, r.stdout)["entries"].([]any)
	require.Len(t, es, 2)
	require.Equal(t, "hosts", es[0].(map[string]any)["kind"])
	require.Equal(t, t2.Version(), es[0].(map[string]any)["version"])
	require.Equal(t, "ops", es[0].(map[string]any)["author"])
	require.Equal(t, "first", es[1].(map[string]any)["message"])
	r = run(t, "rules", "history", "--prefix", p, "--region", "eu-west", "--kind", "shedder", "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	require.Empty(t, decodeJSON(t, r.stdout)["entries"])

	// Rollback restores the previous table; --to a version restores that one.
	r = run(t, "hosts", "rollback", "--prefix", p, "--region", "eu-west", "--dry-run")
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, hostsV2, string(kv(t, euWest, key).Value))
	r = run(t, "hosts", "rollback", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "rolled the host table back to")
	require.Equal(t, hostsV1, string(kv(t, euWest, key).Value))
	r = run(t, "hosts", "rollback", "--prefix", p, "--region", "eu-west", "--to", t2.Version())
	require.Equal(t, ExitOK, r.code, r)
	require.Equal(t, hostsV2, string(kv(t, euWest, key).Value))
	r = run(t, "hosts", "rollback", "--prefix", p, "--region", "eu-west", "--to", "0123456789ab")
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, `no host table with version "0123456789ab" in the history of eu-west`)

	// An empty table is a valid push: every host goes back to the
	// default pool, which the push shows.
	empty := hostsFile(t, "version: 1\n")
	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", empty)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "  - img.example.com: media -> default pool (not in the table)\n")
	require.Equal(t, "version: 1\n", string(kv(t, euWest, key).Value))
}

// A table stored by hand that does not parse is reported as such by get
// and diff (exit 4); a push replaces it.
func TestHostsStoredInvalid(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	key := p + "hosts/eu-west"
	put(t, key, "version: 1\nhosts:\n  a.com: {pool: gone}\n")
	r := run(t, "hosts", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, `line 3`)
	require.Contains(t, r.stderr, `hosts."a.com".pool: unknown pool "gone"`)
	r = run(t, "hosts", "diff", "--prefix", p, "--region", "eu-west", hostsFile(t, hostsV1))
	require.Equal(t, ExitInvalid, r.code, r)
	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", hostsFile(t, hostsV1))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "version invalid -> ")
	require.Equal(t, hostsV1, string(kv(t, euWest, key).Value))
}

// The largest table the limits allow fits the parts a document may be
// stored in (TestHostsTableInPartsReachesTheEdge pushes one over
// region.InlineMax).
func TestHostsLimitFitsParts(t *testing.T) {
	require.LessOrEqual(t, hosts.MaxDocumentSize, region.MaxDocument)
}
