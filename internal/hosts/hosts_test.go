package hosts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

const example = `version: 1
pools:
  shop:
    urls: ["https://10.0.0.5:8443", "https://10.0.0.6:8443"]
    dial_timeout: 1s
    header_timeout: 5s
    read_idle_timeout: 60s
    timeout: 0s
    max_conns: 128
    max_request_body_size: 10485760
    health_check_interval: 0s
    health_check_path: /healthz
    unhealthy_after: 5
    eject_for: 45s
    rewrite_host: true
    tls: {server_name: origin.shop.example, insecure_skip_verify: true}
  media:
    urls: ["http://10.0.1.5:8080"]
hosts:
  Shop.Example.com: {pool: shop}
  "*.shop.example.com": {pool: shop}
  "*.example.com": {pool: media}
  static.example.com: {pool: default}
`

func TestParseExample(t *testing.T) {
	tb, err := Parse([]byte(example))
	require.NoError(t, err)
	require.Equal(t, 1, tb.Schema)
	require.Equal(t, map[string]Host{
		"shop.example.com":   {Pool: "shop"},
		"*.shop.example.com": {Pool: "shop"},
		"*.example.com":      {Pool: "media"},
		"static.example.com": {Pool: "default"},
	}, tb.Hosts)
	require.Empty(t, tb.Unused())
	require.Len(t, tb.Version(), 12)
	require.NoError(t, tb.Validate())

	base := origin.DefaultConfig()
	base.URLs = []string{"http://edge-default:80"}
	base.Timeout = 30 * time.Second
	base.TLS = origin.TLSConfig{ServerName: "default.example", CAPEM: []byte("x"), InsecureSkipVerify: true}

	shop := tb.Pools["shop"].Origin(base)
	require.Equal(t, origin.Config{
		URLs:                []string{"https://10.0.0.5:8443", "https://10.0.0.6:8443"},
		DialTimeout:         time.Second,
		HeaderTimeout:       5 * time.Second,
		ReadIdleTimeout:     60 * time.Second,
		Timeout:             0, // "0s" overrides the base's 30s
		MaxConnsPerHost:     128,
		MaxRequestBodySize:  10485760,
		HealthCheckInterval: 0, // "0s": active checks off
		HealthCheckPath:     "/healthz",
		UnhealthyAfter:      5,
		RewriteHost:         true,
		EjectFor:            45 * time.Second,
		TLS:                 origin.TLSConfig{ServerName: "origin.shop.example", InsecureSkipVerify: true},
	}, shop)
	require.NoError(t, shop.Validate())

	// What a pool leaves out is the base's; URLs and TLS never are.
	media := tb.Pools["media"].Origin(base)
	want := base
	want.URLs, want.Pool = []string{"http://10.0.1.5:8080"}, ""
	want.TLS = origin.TLSConfig{}
	require.Equal(t, want, media)
	require.Equal(t, []string{"http://edge-default:80"}, base.URLs, "base is not modified")
}

// problemsOf parses doc and returns its problems as "line N: path: msg".
func problemsOf(t *testing.T, doc string) []string {
	t.Helper()
	tb, err := Parse([]byte(doc))
	require.Error(t, err)
	require.Nil(t, tb)
	require.ErrorIs(t, err, ErrInvalid)
	var out []string
	for _, p := range Problems(err) {
		out = append(out, p.Error())
	}
	require.NotEmpty(t, out, "every error is a *Problem: %v", err)
	return out
}

func TestValidationProblems(t *testing.T) {
	pool := "version: 1\npools:\n  p:\n    urls: [\"https://o:443\"]\n"
	tests := []struct {
		name, doc, want string
	}{
		{"empty document", "", `version: empty document`},
		{"comments only", "# nothing\n", `version: empty document`},
		{"no version", "hosts: {}\n", `line 1: version: required: 1`},
		{"version 2", "version: 2\n", `line 1: version: unsupported version 2`},
		{"not a mapping", "- a\n", `line 1: cannot unmarshal !!seq into hosts.Table`},
		{"syntax", "version: 1\nhosts: {a: [\n", `line 2: did not find expected node content`},
		{"unknown top field", "version: 1\norigins: {}\n", `line 2: origins: unknown field "origins"`},
		{"unknown pool field", pool + "    colour: blue\n", `line 5: pools.p.colour: unknown field "colour"`},
		{"unknown tls field", pool + "    tls: {sni: x}\n", `line 5: pools.p.tls.sni: unknown field "sni"`},
		{"unknown host field", "version: 1\nhosts:\n  a.com: {pool: default, share: 1}\n", `line 3: hosts."a.com".share: unknown field "share"`},
		{"repeated key", "version: 1\nversion: 1\n", `line 2: version: mapping key "version" already defined at line 1`},
		{"duration without unit", pool + "    dial_timeout: 5\n", `line 5: pools.p.dial_timeout: want a duration such as "1m" or "250ms", got "5" (a number needs a unit: s, ms, m, h)`},
		{"negative duration", pool + "    eject_for: -1s\n", `line 5: pools.p.eject_for: must be >= 0 (0 means 30s), got -1s`},
		{"negative max_conns", pool + "    max_conns: -1\n", `line 5: pools.p.max_conns: must be >= 0 (0 means 512), got -1`},
		{"adaptive without limit", pool + "    concurrency: {adaptive: true}\n", `line 5: pools.p.concurrency.limit: adaptive needs a limit, the most the learned limit may reach`},
		{"negative queue", pool + "    concurrency:\n      limit: 4\n      queue: -1\n", `line 7: pools.p.concurrency.queue: must be >= 0, got -1`},
		{"min over limit", pool + "    concurrency: {limit: 4, adaptive: true, min_limit: 8}\n", `line 5: pools.p.concurrency.min_limit: must be in [0, limit 4], got 8`},
		{"unknown concurrency field", pool + "    concurrency: {max: 4}\n", `line 5: pools.p.concurrency.max: unknown field "max"`},
		{"queue timeout without unit", pool + "    concurrency: {limit: 4, queue_timeout: 100}\n", `line 5: pools.p.concurrency.queue_timeout: want a duration`},
		{"health path", pool + "    health_check_path: healthz\n", `line 5: pools.p.health_check_path: must start with '/', got "healthz"`},
		{"int overflow", pool + "    max_request_body_size: 99999999999999999999\n", `line 5: pools.p.max_request_body_size: cannot unmarshal`},
		{"no urls", "version: 1\npools:\n  p: {dial_timeout: 1s}\n", `line 3: pools.p.urls: at least one origin is required`},
		{"null pool", "version: 1\npools:\n  p:\n", `line 3: pools.p.urls: at least one origin is required`},
		{"bad url", "version: 1\npools:\n  p:\n    urls:\n      - https://o:443\n      - ftp://o/x\n", `line 6: pools.p.urls[1]: "ftp://o/x": scheme must be http or https, got "ftp"; path must be empty or "/", got "/x"`},
		{"duplicate url", "version: 1\npools:\n  p:\n    urls: [\"http://o:80\", \"http://O:80\"]\n", `line 4: pools.p.urls[1]: duplicates urls[0] (http://O:80)`},
		{"bad ca", pool + "    tls: {ca_pem: \"not a certificate\"}\n", `line 5: pools.p.tls.ca_pem: no PEM certificate in it`},
		{"insecure with ca", pool + "    tls:\n      ca_pem: \"" + strings.ReplaceAll(testCA, "\n", `\n`) + "\"\n      insecure_skip_verify: true\n", `line 7: pools.p.tls.insecure_skip_verify: contradicts ca_pem`},
		{"tls without https", "version: 1\npools:\n  p:\n    urls: [\"http://o:80\"]\n    tls: {server_name: o}\n", `line 5: pools.p.tls: the pool has no https origin`},
		{"default defined", "version: 1\npools:\n  default:\n    urls: [\"http://o:80\"]\n", `line 3: pools.default: "default" is the edge's own pool`},
		{"pool name", "version: 1\npools:\n  Shop:\n    urls: [\"http://o:80\"]\n", `line 3: pools.Shop: a pool name is 1-64 characters`},
		{"unknown pool", "version: 1\nhosts:\n  a.com: {pool: shop}\n", `line 3: hosts."a.com".pool: unknown pool "shop" (pools: default)`},
		{"no pool", "version: 1\nhosts:\n  a.com: {}\n", `line 3: hosts."a.com".pool: required: one of the table's pools or "default"`},
		{"null host", "version: 1\nhosts:\n  a.com:\n", `line 3: hosts."a.com".pool: required`},
		{"bare star", "version: 1\nhosts:\n  \"*\": {pool: default}\n", `line 3: hosts."*": a bare wildcard is not allowed (hosts the table does not name go to the "default" pool)`},
		{"star dot", "version: 1\nhosts:\n  \"*.\": {pool: default}\n", `line 3: hosts."*.": a bare wildcard is not allowed`},
		{"inner star", "version: 1\nhosts:\n  \"a.*.com\": {pool: default}\n", `line 3: hosts."a.*.com": a wildcard is only allowed as a leading "*."`},
		{"double star", "version: 1\nhosts:\n  \"*.*.x\": {pool: default}\n", `line 3: hosts."*.*.x": a wildcard is only allowed as a leading "*."`},
		{"partial star", "version: 1\nhosts:\n  \"*a.com\": {pool: default}\n", `line 3: hosts."*a.com": a wildcard is only allowed as a leading "*."`},
		{"port", "version: 1\nhosts:\n  \"a.com:443\": {pool: default}\n", `line 3: hosts."a.com:443": must not contain a port`},
		{"scheme", "version: 1\nhosts:\n  \"https://a.com\": {pool: default}\n", `line 3: hosts."https://a.com": a host pattern has no scheme`},
		{"path", "version: 1\nhosts:\n  \"a.com/shop\": {pool: default}\n", `line 3: hosts."a.com/shop": a host pattern has no path`},
		{"empty label", "version: 1\nhosts:\n  \"a..com\": {pool: default}\n", `line 3: hosts."a..com": labels must be 1-63 characters`},
		{"two trailing dots", "version: 1\nhosts:\n  \"a.com..\": {pool: default}\n", `line 3: hosts."a.com..": labels must be 1-63 characters`},
		{"leading dot", "version: 1\nhosts:\n  \".a.com\": {pool: default}\n", `line 3: hosts.".a.com": labels must be 1-63 characters`},
		{"empty pattern", "version: 1\nhosts:\n  \"\": {pool: default}\n", `line 3: hosts."": empty host pattern`},
		{"long label", "version: 1\nhosts:\n  " + strings.Repeat("a", 64) + ".com: {pool: default}\n", `labels must be 1-63 characters`},
		{"unicode", "version: 1\nhosts:\n  bücher.de: {pool: default}\n", `line 3: hosts."bücher.de": only printable ASCII (write an internationalised name in its xn-- form)`},
		{"kelvin sign", "version: 1\nhosts:\n  \"\u212aa.com\": {pool: default}\n", `only printable ASCII`},
		{"nul byte", "version: 1\nhosts:\n  \"a\\0.com\": {pool: default}\n", `line 3: hosts."a\x00.com": only printable ASCII`},
		{"space", "version: 1\nhosts:\n  \"a b.com\": {pool: default}\n", `line 3: hosts."a b.com": invalid character ' '`},
		{"wildcard ip", "version: 1\nhosts:\n  \"*.10.0.0.1\": {pool: default}\n", `a wildcard cannot apply to an IP address`},
		{"ipv6 zone", "version: 1\nhosts:\n  \"fe80::1%eth0\": {pool: default}\n", `IPv6 zones are not allowed`},
		{"ipv6 with port", "version: 1\nhosts:\n  \"[::1]:443\": {pool: default}\n", `must not contain a port`},
		{"collision", "version: 1\nhosts:\n  Shop.Example.com: {pool: default}\n  shop.example.com.: {pool: default}\n", `line 4: hosts."shop.example.com.": the same host as "Shop.Example.com" (line 3): both are "shop.example.com"`},
		{"ipv6 collision", "version: 1\nhosts:\n  \"[2001:DB8::1]\": {pool: default}\n  \"2001:db8:0::1\": {pool: default}\n", `both are "2001:db8::1"`},
		{"wildcard collision", "version: 1\nhosts:\n  \"*.A.com\": {pool: default}\n  \"*.a.com.\": {pool: default}\n", `both are "*.a.com"`},
		{"anchor", "version: 1\npools:\n  p: &p {urls: [\"http://o:80\"]}\n  q: *p\n", `line 3: YAML anchors and aliases are not allowed`},
		{"second document", "version: 1\n---\nversion: 1\n", `line 2: only one YAML document is allowed`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := problemsOf(t, tc.doc)
			require.True(t, anyContains(got, tc.want), "want %q among:\n%s", tc.want, strings.Join(got, "\n"))
		})
	}
}

func anyContains(list []string, s string) bool {
	for _, l := range list {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// Every problem comes out of one Parse, in line order.
func TestEveryProblemAtOnce(t *testing.T) {
	doc := `version: 1
pools:
  shop:
    urls: ["ftp://x"]
    dial_timeout: 1
    colour: blue
  default:
    urls: ["http://a:80"]
hosts:
  a.com: {pool: nope}
  "*": {pool: shop}
  b.com:443: {pool: shop}
`
	got := problemsOf(t, doc)
	require.Equal(t, []string{
		`line 4: pools.shop.urls[0]: "ftp://x": scheme must be http or https, got "ftp"`,
		`line 5: pools.shop.dial_timeout: want a duration such as "1m" or "250ms", got "1" (a number needs a unit: s, ms, m, h)`,
		`line 6: pools.shop.colour: unknown field "colour"`,
		`line 7: pools.default: "default" is the edge's own pool (its --origin flags): hosts may use it, the table cannot define it`,
		`line 10: hosts."a.com".pool: unknown pool "nope" (pools: default, shop)`,
		`line 11: hosts."*": a bare wildcard is not allowed (hosts the table does not name go to the "default" pool)`,
		`line 12: hosts."b.com:443": must not contain a port (hosts are matched without their port)`,
	}, got)
}

func TestParseFileNamesFileAndLine(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "hosts.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("version: 1\nhosts:\n  a.com: {pool: nope}\n"), 0o600))
	_, err := ParseFile(bad)
	require.EqualError(t, err, bad+`:3: hosts."a.com".pool: unknown pool "nope" (pools: default)`)

	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, []byte(example), 0o600))
	tb, err := ParseFile(good)
	require.NoError(t, err)
	require.Len(t, tb.Hosts, 4)

	_, err = ParseFile(filepath.Join(dir, "absent.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)

	big := filepath.Join(dir, "big.yaml")
	require.NoError(t, os.WriteFile(big, []byte("version: 1\n#"+strings.Repeat("x", MaxDocumentSize)+"\n"), 0o600))
	_, err = ParseFile(big)
	require.EqualError(t, err, big+": file is over the 8388608 byte limit")
}

// Validate on a table built in Go reports the same problems, without lines.
func TestValidateInGo(t *testing.T) {
	tb := &Table{Schema: 1,
		Pools: map[string]Pool{"shop": {URLs: []string{"https://o:443"}}},
		Hosts: map[string]Host{"A.com": {Pool: "shop"}, "a.com.": {Pool: "shop"}, "b.com": {Pool: "gone"}},
	}
	require.EqualError(t, tb.Validate(), `hosts."a.com.": the same host as "A.com": both are "a.com"`+"\n"+
		`hosts."b.com".pool: unknown pool "gone" (pools: default, shop)`)
	tb.Hosts = map[string]Host{"a.com": {Pool: "shop"}}
	require.NoError(t, tb.Validate())
	tb.Pools["spare"] = Pool{URLs: []string{"http://s:80"}}
	require.NoError(t, tb.Validate(), "an unused pool is valid")
	require.Equal(t, []string{"spare"}, tb.Unused())
}

func TestLimits(t *testing.T) {
	t.Run("document size", func(t *testing.T) {
		doc := "version: 1\n#" + strings.Repeat("x", MaxDocumentSize) + "\n"
		require.Equal(t, []string{"document of 8388621 bytes is over the 8388608 byte limit"}, problemsOf(t, doc))
	})
	t.Run("hosts", func(t *testing.T) {
		// The size limit comes first in a document; a table built in Go
		// meets the count.
		tb := benchTable(MaxHosts + 2)
		require.EqualError(t, tb.Validate(), "hosts: 100002 hosts, at most 100000")
		require.NoError(t, benchTable(MaxHosts).Validate())
	})
	t.Run("pools", func(t *testing.T) {
		var b strings.Builder
		b.WriteString("version: 1\npools:\n")
		for i := range MaxPools + 1 {
			fmt.Fprintf(&b, " p%d: {urls: [\"http://o:80\"]}\n", i)
		}
		require.Equal(t, []string{"line 2: pools: 257 pools, at most 256"}, problemsOf(t, b.String()))
	})
	t.Run("urls", func(t *testing.T) {
		var b strings.Builder
		b.WriteString("version: 1\npools:\n p:\n  urls:\n")
		for i := range MaxURLsPerPool + 1 {
			fmt.Fprintf(&b, "  - http://o%d:80\n", i)
		}
		require.Equal(t, []string{"line 4: pools.p.urls: 65 origins, at most 64"}, problemsOf(t, b.String()))
	})
	t.Run("10k labels", func(t *testing.T) {
		host := strings.Repeat("a.", 10000) + "com"
		got := problemsOf(t, "version: 1\nhosts:\n  ? \"*."+host+"\"\n  : {pool: default}\n")
		require.Len(t, got, 1)
		require.Contains(t, got[0], "host name longer than 253 characters")
		// A request for such a host matches nothing (no name is that
		// long), and costs no more than a short one: nothing tried.
		tb, err := Parse([]byte("version: 1\nhosts:\n  \"*.com\": {pool: default}\n  x.org: {pool: default}\n"))
		require.NoError(t, err)
		ix := tb.Index()
		_, _, ok := ix.Lookup(host)
		require.False(t, ok)
		_, _, ok = ix.Lookup(strings.Repeat("a.", 10000) + "net")
		require.False(t, ok)
		// The longest name that can be matched still is.
		long := strings.Repeat("abcdefghi.", 24) + "x.com" // 245 characters
		p, _, ok := ix.Lookup(long)
		require.True(t, ok)
		require.Equal(t, "*.com", p)
	})
	t.Run("deep nesting", func(t *testing.T) {
		got := problemsOf(t, "version: 1\nhosts: "+strings.Repeat("[", 100000)+"\n")
		require.NotEmpty(t, got)
	})
	t.Run("binary garbage", func(t *testing.T) {
		doc := make([]byte, 4096)
		for i := range doc {
			doc[i] = byte(i*7 + i/13)
		}
		_, err := Parse(doc)
		require.ErrorIs(t, err, ErrInvalid)
		require.NotEmpty(t, Problems(err))
	})
	t.Run("wrong shapes", func(t *testing.T) {
		for doc, want := range map[string]string{
			"version: one\n":                              "line 1: version: cannot unmarshal !!str `one` into int",
			"version: 1\nhosts: [a.com]\n":                "line 2: hosts: cannot unmarshal !!seq into map[string]hosts.Host",
			"version: 1\nhosts: {a.com: shop}\n":          "line 2: hosts.\"a.com\": cannot unmarshal !!str `shop` into hosts.Host",
			"version: 1\npools: {p: {urls: http://o}}\n":  "line 2: pools.p.urls: cannot unmarshal !!str `http://o` into []string",
			"version: 1\npools: {p: {rewrite_host: 1}}\n": "line 2: pools.p.rewrite_host: cannot unmarshal !!int `1` into bool",
		} {
			require.Contains(t, problemsOf(t, doc), want, doc)
		}
	})
	t.Run("alias expansion", func(t *testing.T) {
		doc := "version: 1\nx: &a [1,1,1,1,1,1,1,1,1]\ny: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nz: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
		require.Equal(t, []string{"line 2: YAML anchors and aliases are not allowed"}, problemsOf(t, doc))
	})
}

// The table normalises a pattern as the rules normalise match.hosts and
// as rules.NormalizeHost normalises a request's Host, so a host cannot be
// spelled to land in another entry, or miss its own.
func TestNormalisationAgreesWithRules(t *testing.T) {
	tests := []struct {
		pattern  string
		requests []string // Host headers that must normalise to the pattern
	}{
		{"shop.example.com", []string{"shop.example.com", "Shop.Example.com:443", "shop.example.com."}},
		{"Shop.Example.COM", []string{"shop.example.com", "SHOP.EXAMPLE.COM.:8443"}},
		{"shop.example.com.", []string{"shop.example.com"}},
		{"under_score.example", []string{"Under_Score.example"}},
		{"*.Example.com", nil},
		{"*.example.com.", nil},
		{"10.0.0.1", []string{"10.0.0.1", "10.0.0.1:80"}},
		{"[2001:DB8::1]", []string{"[2001:db8::1]", "[2001:DB8:0:0::1]:443", "2001:db8::1"}},
		{"2001:db8:0:0::1", []string{"[2001:db8::1]:443"}},
		{"::FFFF:10.0.0.1", []string{"[::ffff:10.0.0.1]:443"}},
	}
	for _, tc := range tests {
		t.Run(tc.pattern, func(t *testing.T) {
			got, err := NormalizePattern(tc.pattern)
			require.NoError(t, err)
			doc := fmt.Sprintf("version: 1\nrules:\n  - {id: r, match: {hosts: [%q]}, key: [ip], algorithm: fixed_window, limit: 1, window: 1s}\n", tc.pattern)
			rd, err := rules.Parse([]byte(doc))
			require.NoError(t, err)
			require.Equal(t, rd.Rules[0].Match.Hosts, []string{got}, "the rules' normalisation")
			for _, req := range tc.requests {
				require.Equal(t, got, rules.NormalizeHost(req), "a request for %q", req)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	doc := `version: 1
hosts:
  example.com: {pool: apex}
  "*.example.com": {pool: wild}
  "*.shop.example.com": {pool: shop-wild}
  www.shop.example.com: {pool: www}
  "*.b.shop.example.com": {pool: deep}
  "[::1]": {pool: v6}
  10.0.0.1: {pool: v4}
pools:
` + func() string {
		var b strings.Builder
		for _, p := range []string{"apex", "wild", "shop-wild", "www", "deep", "v6", "v4"} {
			fmt.Fprintf(&b, "  %s: {urls: [\"http://%s:80\"]}\n", p, p)
		}
		return b.String()
	}()
	tb, err := Parse([]byte(doc))
	require.NoError(t, err)
	ix := tb.Index()
	require.Equal(t, 7, ix.Len())
	tests := []struct{ host, pattern, pool string }{
		{"example.com", "example.com", "apex"},
		{"a.example.com", "*.example.com", "wild"},
		{"a.b.example.com", "*.example.com", "wild"},
		{"shop.example.com", "*.example.com", "wild"},
		{"x.shop.example.com", "*.shop.example.com", "shop-wild"},
		{"www.shop.example.com", "www.shop.example.com", "www"}, // exact beats a wildcard
		{"a.www.shop.example.com", "*.shop.example.com", "shop-wild"},
		{"b.shop.example.com", "*.shop.example.com", "shop-wild"}, // "*.b…" needs a label before b
		{"x.b.shop.example.com", "*.b.shop.example.com", "deep"},  // the longest suffix wins
		{"y.x.b.shop.example.com", "*.b.shop.example.com", "deep"},
		{"::1", "::1", "v6"},
		{"10.0.0.1", "10.0.0.1", "v4"},
		{"com", "", ""},
		{"example.org", "", ""},
		{"notexample.com", "", ""},
		{".example.com", "", ""},   // an empty label matches no wildcard
		{"a..example.com", "", ""}, // nor does a suffix after one
		{"", "", ""},
		{"EXAMPLE.com", "", ""}, // Lookup takes normalised hosts
		{"x.0.0.1", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			p, h, ok := ix.Lookup(tc.host)
			require.Equal(t, tc.pattern != "", ok)
			require.Equal(t, tc.pattern, p)
			require.Equal(t, tc.pool, h.Pool)
		})
	}
	var nilIx *Index
	_, _, ok := nilIx.Lookup("example.com")
	require.False(t, ok)
}

func TestLookupAllocatesNothing(t *testing.T) {
	ix := benchTable(1000).Index()
	for _, host := range []string{"h1.example", "x.y.w2.example", "miss.example.org", "a.b.c.d.e.f.g"} {
		allocs := testing.AllocsPerRun(1000, func() { _, _, _ = ix.Lookup(host) })
		require.Zero(t, allocs, host)
	}
}

func TestVersion(t *testing.T) {
	a, err := Parse([]byte(example))
	require.NoError(t, err)
	// Other key order, spelling, comments and formatting: the same table.
	b, err := Parse([]byte(`# reordered
hosts:
  static.example.com.: {pool: default}
  "*.Example.com": {pool: media}
  "*.shop.example.com": {pool: shop}
  shop.example.com: {pool: shop}
pools:
  media: {urls: ["http://10.0.1.5:8080"]}
  shop:
    tls: {insecure_skip_verify: true, server_name: origin.shop.example}
    rewrite_host: true
    eject_for: 45000ms
    unhealthy_after: 5
    health_check_path: /healthz
    health_check_interval: 0s
    max_request_body_size: 10485760
    max_conns: 128
    timeout: 0s
    read_idle_timeout: 1m
    header_timeout: 5s
    dial_timeout: 1s
    urls: ["https://10.0.0.5:8443", "https://10.0.0.6:8443"]
version: 1
`))
	require.NoError(t, err)
	require.Equal(t, a.Version(), b.Version())

	for name, change := range map[string]func(*Table){
		"host pool":   func(t *Table) { t.Hosts["shop.example.com"] = Host{Pool: "media"} },
		"host added":  func(t *Table) { t.Hosts["new.example.com"] = Host{Pool: "media"} },
		"timeout set": func(t *Table) { p := t.Pools["media"]; d := rules.Duration(0); p.Timeout = &d; t.Pools["media"] = p },
		"url order":   func(t *Table) { p := t.Pools["shop"]; p.URLs = []string{p.URLs[1], p.URLs[0]}; t.Pools["shop"] = p },
		"verification on": func(t *Table) {
			p := t.Pools["shop"]
			p.TLS = &TLS{ServerName: "origin.shop.example"}
			t.Pools["shop"] = p
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := Parse([]byte(example))
			require.NoError(t, err)
			change(c)
			require.NotEqual(t, a.Version(), c.Version())
		})
	}
}

func TestProblemsOfOtherErrors(t *testing.T) {
	require.Empty(t, Problems(errors.New("x")))
	require.Empty(t, Problems(nil))
}

// A test CA (ecdsa, self-signed), only for the PEM check.
const testCA = `-----BEGIN CERTIFICATE-----
MIIBhTCCASugAwIBAgIQIRi6zePL6mKjOipn+dNuaTAKBggqhkjOPQQDAjASMRAw
DgYDVQQKEwdBY21lIENvMB4XDTE3MTAyMDE5NDMwNloXDTE4MTAyMDE5NDMwNlow
EjEQMA4GA1UEChMHQWNtZSBDbzBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABD0d
7VNhbWvZLWPuj/RtHFjvtJBEwOkhbN/BnnE8rnZR8+sbwnc/KhCk3FhnpHZnQz7B
5aETbbIgmuvewdjvSBSjYzBhMA4GA1UdDwEB/wQEAwICpDATBgNVHSUEDDAKBggr
BgEFBQcDATAPBgNVHRMBAf8EBTADAQH/MCkGA1UdEQQiMCCCDmxvY2FsaG9zdDo1
NDUzgg4xMjcuMC4wLjE6NTQ1MzAKBggqhkjOPQQDAgNIADBFAiEA2zpJEPQyz6/l
Wf86aX6PepsntZv2GYlA5UpabfT2EZICICpJ5h/iI+i341gBmLiAFQOyTDT+/wQc
6MF9+Yw1Yy0t
-----END CERTIFICATE-----
`

func TestPoolConcurrencyReachesTheOrigin(t *testing.T) {
	tab, err := Parse([]byte("version: 1\npools:\n  p:\n    urls: [\"http://o:80\"]\n    concurrency: {limit: 64, adaptive: true, min_limit: 2, queue: 16, queue_timeout: 50ms}\n  q:\n    urls: [\"http://o:81\"]\n"))
	require.NoError(t, err)
	base := origin.DefaultConfig()
	base.Concurrency.Limit = 7 // the --origin pool's
	c := tab.Pools["p"].Origin(base)
	require.Equal(t, shedder.PoolLimitConfig{Limit: 64, Adaptive: true, MinLimit: 2, Queue: 16, QueueTimeout: 50 * time.Millisecond}, c.Concurrency)
	require.Equal(t, 7, tab.Pools["q"].Origin(base).Concurrency.Limit, "a pool without its own takes the --origin pool's")
}
