package rules

import (
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

const matchRules = `
version: 1
rules:
  - {id: any, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: host-exact, match: {hosts: [api.example.com]}, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: host-wild, match: {hosts: ["*.example.com"]}, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: get-only, match: {methods: [GET]}, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: api-prefix, match: {path_prefix: [/api]}, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: root-prefix, match: {path_prefix: [/, /x]}, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: by-key, key: ["header:X-API-Key"], algorithm: token_bucket, limit: 10, window: 10s}
  - {id: by-query, key: ["query:token"], algorithm: token_bucket, limit: 10, window: 10s}
  - {id: combined, match: {hosts: [api.example.com], methods: [POST], path_prefix: [/admin]}, key: [ip, method], algorithm: fixed_window, limit: 1, window: 1s}
`

func matchedIDs(ms []Match) []string {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.Rule.ID
	}
	return ids
}

func headers(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[strings.ToLower(kv[i])] = kv[i+1]
	}
	return func(name string) (string, bool) {
		v, ok := m[strings.ToLower(name)]
		return v, ok
	}
}

// params is an exact-name getter, like query parameters.
func params(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func TestMatchSelection(t *testing.T) {
	s := mustCompile(t, mustParse(t, matchRules))
	ip := netip.MustParseAddr("203.0.113.7")
	tests := []struct {
		name string
		req  Request
		want []string
	}{
		{"other host GET /", Request{Host: "other.org", Method: "GET", Path: "/", ClientIP: ip},
			[]string{"any", "get-only", "root-prefix"}},
		{"exact and wildcard host", Request{Host: "api.example.com", Method: "PUT", Path: "/", ClientIP: ip},
			[]string{"any", "host-exact", "host-wild", "root-prefix"}},
		{"trailing dot host", Request{Host: "api.example.com.", Method: "PUT", Path: "/", ClientIP: ip},
			[]string{"any", "host-exact", "host-wild", "root-prefix"}},
		{"wildcard deep subdomain", Request{Host: "a.b.example.com", Method: "PUT", Path: "/", ClientIP: ip},
			[]string{"any", "host-wild", "root-prefix"}},
		{"wildcard excludes apex", Request{Host: "example.com", Method: "PUT", Path: "/", ClientIP: ip},
			[]string{"any", "root-prefix"}},
		{"wildcard is not a plain suffix", Request{Host: "badexample.com", Method: "PUT", Path: "/", ClientIP: ip},
			[]string{"any", "root-prefix"}},
		{"prefix exact", Request{Host: "h", Method: "PUT", Path: "/api", ClientIP: ip},
			[]string{"any", "api-prefix", "root-prefix"}},
		{"prefix child", Request{Host: "h", Method: "PUT", Path: "/api/v1", ClientIP: ip},
			[]string{"any", "api-prefix", "root-prefix"}},
		{"prefix segment boundary", Request{Host: "h", Method: "PUT", Path: "/apix", ClientIP: ip},
			[]string{"any", "root-prefix"}},
		{"all conditions of one rule", Request{Host: "api.example.com", Method: "POST", Path: "/admin/users", ClientIP: ip},
			[]string{"any", "host-exact", "host-wild", "root-prefix", "combined"}},
		{"one condition short", Request{Host: "api.example.com", Method: "GET", Path: "/admin/users", ClientIP: ip},
			[]string{"any", "host-exact", "host-wild", "get-only", "root-prefix"}},
		{"header and query present", Request{Host: "h", Method: "PUT", Path: "/", ClientIP: ip,
			Header: headers("x-api-key", "k1"), Query: params("token", "t1")},
			[]string{"any", "root-prefix", "by-key", "by-query"}},
		{"header present but empty", Request{Host: "h", Method: "PUT", Path: "/", ClientIP: ip,
			Header: headers("X-API-Key", "")},
			[]string{"any", "root-prefix"}},
		{"query name is exact", Request{Host: "h", Method: "PUT", Path: "/", ClientIP: ip,
			Query: params("Token", "t1")},
			[]string{"any", "root-prefix"}},
		{"invalid client IP skips ip rules", Request{Host: "h", Method: "GET", Path: "/", Header: headers("X-API-Key", "k")},
			[]string{"by-key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := s.Match(&tc.req, nil)
			require.Equal(t, tc.want, matchedIDs(got))
			for _, m := range got {
				require.True(t, strings.HasPrefix(m.Key, m.Rule.ID+":"), m.Key)
				require.Len(t, m.Key, len(m.Rule.ID)+1+22)
				require.NotContains(t, m.Key, "{")
				require.NotContains(t, m.Key, "}")
			}
		})
	}
}

func TestMatchNilSafety(t *testing.T) {
	var s *Snapshot
	require.Empty(t, s.Match(&Request{}, nil))
	s = mustCompile(t, mustParse(t, matchRules))
	require.Empty(t, s.Match(nil, nil))
}

func TestMatchEmptyRequest(t *testing.T) {
	s := mustCompile(t, mustParse(t, matchRules))
	// No host, IP or query: only the rule keyed on the header can be counted.
	got := s.Match(&Request{Method: "PUT", Path: "/x/y", Header: headers("X-Api-Key", "k")}, nil)
	require.Equal(t, []string{"by-key"}, matchedIDs(got))
}

func TestMatchAppendsToDst(t *testing.T) {
	s := mustCompile(t, mustParse(t, matchRules))
	dst := []Match{{Key: "earlier"}}
	got := s.Match(&Request{Host: "h", Method: "PUT", Path: "/", ClientIP: netip.MustParseAddr("10.0.0.1")}, dst)
	require.Len(t, got, 3)
	require.Equal(t, "earlier", got[0].Key)
	require.Equal(t, []string{"any", "root-prefix"}, matchedIDs(got[1:]))
}

// keyOf compiles one rule and returns the key it gives req ("" if skipped).
func keyOf(t *testing.T, s *Snapshot, id string, req Request) string {
	t.Helper()
	for _, m := range s.Match(&req, nil) {
		if m.Rule.ID == id {
			return m.Key
		}
	}
	return ""
}

func TestMatchKeys(t *testing.T) {
	s := mustCompile(t, mustParse(t, `
version: 1
rules:
  - {id: ip, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: ip2, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: pair, key: ["header:A", "header:B"], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: apikey, key: ["header:X-API-Key"], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: parts, key: [host, method, path], algorithm: sliding_log, limit: 10, window: 10s}
`))
	v4 := func(s string) Request { return Request{Method: "GET", Path: "/", ClientIP: netip.MustParseAddr(s)} }

	t.Run("same values same key", func(t *testing.T) {
		require.Equal(t, keyOf(t, s, "ip", v4("198.51.100.1")), keyOf(t, s, "ip", v4("198.51.100.1")))
	})
	t.Run("different values different keys", func(t *testing.T) {
		require.NotEqual(t, keyOf(t, s, "ip", v4("198.51.100.1")), keyOf(t, s, "ip", v4("198.51.100.2")))
	})
	t.Run("different rules different keys", func(t *testing.T) {
		require.NotEqual(t, keyOf(t, s, "ip", v4("198.51.100.1")), keyOf(t, s, "ip2", v4("198.51.100.1")))
	})
	t.Run("ipv4-mapped equals ipv4", func(t *testing.T) {
		require.Equal(t, keyOf(t, s, "ip", v4("198.51.100.1")), keyOf(t, s, "ip", v4("::ffff:198.51.100.1")))
	})
	t.Run("composite keys are unambiguous", func(t *testing.T) {
		r1 := Request{Method: "GET", Path: "/", Header: headers("A", "a", "B", "bc")}
		r2 := Request{Method: "GET", Path: "/", Header: headers("A", "ab", "B", "c")}
		k1, k2 := keyOf(t, s, "pair", r1), keyOf(t, s, "pair", r2)
		require.NotEmpty(t, k1)
		require.NotEmpty(t, k2)
		require.NotEqual(t, k1, k2)
	})
	t.Run("composite key needs every descriptor", func(t *testing.T) {
		require.Empty(t, keyOf(t, s, "pair", Request{Method: "GET", Path: "/", Header: headers("A", "a")}))
	})
	t.Run("host method path parts", func(t *testing.T) {
		a := keyOf(t, s, "parts", Request{Host: "h", Method: "GET", Path: "/a"})
		b := keyOf(t, s, "parts", Request{Host: "h", Method: "GET", Path: "/b"})
		require.NotEmpty(t, a)
		require.NotEqual(t, a, b)
	})
	t.Run("raw values never appear", func(t *testing.T) {
		const secret = "sk_live_abcdef123456"
		req := Request{Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("198.51.100.77"), Header: headers("X-API-Key", secret)}
		for _, m := range s.Match(&req, nil) {
			require.NotContains(t, m.Key, "198.51.100.77")
			require.NotContains(t, m.Key, "198")
			require.NotContains(t, m.Key, secret)
			require.NotContains(t, m.Key, "sk_live")
		}
	})
	t.Run("ipv6 same /64 same key", func(t *testing.T) {
		a := keyOf(t, s, "ip", v4("2001:db8:1:2::1"))
		b := keyOf(t, s, "ip", v4("2001:db8:1:2:ffff:ffff:ffff:ffff"))
		require.NotEmpty(t, a)
		require.Equal(t, a, b)
	})
	t.Run("ipv6 different /64 different key", func(t *testing.T) {
		require.NotEqual(t, keyOf(t, s, "ip", v4("2001:db8:1:2::1")), keyOf(t, s, "ip", v4("2001:db8:1:3::1")))
	})
	t.Run("ipv6 prefix option", func(t *testing.T) {
		s48 := mustCompile(t, mustParse(t, "version: 1\nrules:\n  - {id: ip, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}\n"), WithIPv6Prefix(48))
		require.Equal(t, 48, s48.IPv6Prefix())
		require.Equal(t, keyOf(t, s48, "ip", v4("2001:db8:1:2::1")), keyOf(t, s48, "ip", v4("2001:db8:1:3::1")))
		require.NotEqual(t, keyOf(t, s48, "ip", v4("2001:db8:1::1")), keyOf(t, s48, "ip", v4("2001:db8:2::1")))
	})
	t.Run("salt changes keys", func(t *testing.T) {
		doc := mustParse(t, "version: 1\nrules:\n  - {id: ip, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}\n")
		plain := mustCompile(t, doc)
		salted := mustCompile(t, doc, WithKeySalt([]byte("secret")))
		salted2 := mustCompile(t, doc, WithKeySalt([]byte("secret")))
		req := v4("198.51.100.1")
		require.NotEqual(t, keyOf(t, plain, "ip", req), keyOf(t, salted, "ip", req))
		require.Equal(t, keyOf(t, salted, "ip", req), keyOf(t, salted2, "ip", req))
		require.Equal(t, plain.Version(), salted.Version(), "options do not change the rule version")
	})
}

func TestCompileOptionsValidated(t *testing.T) {
	doc := mustParse(t, matchRules)
	_, err := Compile(doc, WithIPv6Prefix(0))
	require.ErrorContains(t, err, "IPv6 prefix")
	_, err = Compile(doc, WithIPv6Prefix(129))
	require.Error(t, err)
	_, err = Compile(nil)
	require.Error(t, err)
	bad := &Document{Version: 1, Rules: []Rule{{ID: "x"}}}
	_, err = Compile(bad)
	require.ErrorContains(t, err, `rule "x": algorithm: required`)
}

func TestCompileDoesNotModifyInputAndSkipsDisabled(t *testing.T) {
	r := validRule("r")
	r.Match.Methods = []string{"get"}
	doc := &Document{Version: 1, Rules: []Rule{r, {ID: "off", Disabled: true}}}
	s := mustCompile(t, doc)
	require.Equal(t, []string{"get"}, doc.Rules[0].Match.Methods)
	rules := s.Rules()
	require.Len(t, rules, 1)
	require.Equal(t, []string{"GET"}, rules[0].Methods)

	// Rules returns copies: changing them does not change matching.
	rules[0].Methods[0] = "POST"
	require.Len(t, s.Match(&Request{Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("10.0.0.1")}, nil), 1)
	require.Equal(t, []string{"GET"}, s.Rules()[0].Methods)
}

func TestCompiledRuleJSON(t *testing.T) {
	s := mustCompile(t, mustParse(t, "version: 1\nrules:\n  - {id: tb, key: [ip], algorithm: token_bucket, limit: 10, window: 1m}\n"))
	b, err := s.Rules()[0].MarshalJSON()
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"tb","algorithm":"token_bucket","limit":10,"window":"1m0s","burst":10,"cost":1,"shadow":false,"scope":"region","key":["ip"]}`, string(b))
}

func TestMatchConcurrent(t *testing.T) {
	s := mustCompile(t, mustParse(t, matchRules))
	want := s.Match(&Request{Host: "api.example.com", Method: "POST", Path: "/admin", ClientIP: netip.MustParseAddr("10.1.2.3")}, nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var dst []Match
			for range 200 {
				dst = s.Match(&Request{Host: "api.example.com", Method: "POST", Path: "/admin", ClientIP: netip.MustParseAddr("10.1.2.3")}, dst[:0])
				if len(dst) != len(want) || dst[0].Key != want[0].Key {
					t.Error("concurrent Match disagreed")
					return
				}
			}
		})
	}
	wg.Wait()
}
