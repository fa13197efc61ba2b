package rules

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// The pools overlap on purpose: hosts that are subdomains of each other,
// prefixes that are prefixes of each other (and of other segments), so that
// rules compete for the same requests.
var (
	diffHosts = []string{"a.com", "b.a.com", "x.b.a.com", "*.a.com", "*.b.a.com", "c.org", "*.org",
		"*.com", "10.0.0.1", "site1.example.com", "*.example.com", "xa.com"}
	diffPrefixes = []string{"/", "/api", "/api/v1", "/admin", "/a", "/a/b/c", "/apix", "/api/v1/users"}
	diffMethods  = []string{"GET", "POST", "PUT", "DELETE"}
	diffKeys     = []string{"ip", "host", "path", "method", "header:X-Key", "query:q"}

	reqHosts = []string{"a.com", "a.com.", "b.a.com", "x.b.a.com", "y.x.b.a.com", "xa.com", ".a.com", "com",
		"c.org", "d.c.org", "org", "", ".", "10.0.0.1", "site1.example.com", "site2.example.com",
		"example.com", "a..a.com", "A.COM"}
	reqPaths = []string{"/", "", "/api", "/api/", "/apix", "/api/v1", "/api/v1/users", "/api/v2", "/admin",
		"/admin/x", "/a", "/a/b", "/a/b/c", "/a/b/c/d", "/ab", "/%2F", "/%2F/x", "api", "//api"}
	reqMethods = []string{"GET", "POST", "PUT", "DELETE", "PATCH", "get", ""}
)

func pick[T any](r *rand.Rand, pool []T, max int) []T {
	n := r.IntN(max + 1)
	out := make([]T, 0, n)
	for range n {
		out = append(out, pool[r.IntN(len(pool))])
	}
	return out
}

func randomDocument(r *rand.Rand) *Document {
	doc := &Document{Version: SchemaVersion}
	for i := range r.IntN(40) {
		rule := validRule(fmt.Sprintf("r%02d", i))
		rule.Match.Hosts = dedupe(pick(r, diffHosts, 3))
		rule.Match.PathPrefix = dedupe(pick(r, diffPrefixes, 3))
		rule.Match.Methods = dedupe(pick(r, diffMethods, 2))
		if k := dedupe(pick(r, diffKeys, 2)); len(k) > 0 {
			rule.Key = k
		}
		rule.Disabled = r.IntN(10) == 0
		doc.Rules = append(doc.Rules, rule)
	}
	// Rule order is document order: shuffle so it is not id order.
	r.Shuffle(len(doc.Rules), func(i, j int) { doc.Rules[i], doc.Rules[j] = doc.Rules[j], doc.Rules[i] })
	return doc
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func randomRequest(r *rand.Rand) *Request {
	req := &Request{
		Host:     reqHosts[r.IntN(len(reqHosts))],
		Path:     reqPaths[r.IntN(len(reqPaths))],
		Method:   reqMethods[r.IntN(len(reqMethods))],
		ClientIP: netip.AddrFrom4([4]byte{203, 0, 113, byte(r.IntN(4))}),
	}
	if r.IntN(2) == 0 {
		req.Header = func(name string) (string, bool) { return "k", name == "X-Key" }
	}
	if r.IntN(2) == 0 {
		req.Query = func(name string) (string, bool) { return "v", name == "q" }
	}
	return req
}

// TestIndexMatchesScan runs random rule sets and requests through the
// indexed matcher and the plain scan: same rules, same order, same keys.
func TestIndexMatchesScan(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 16))
	var matched, requests int
	for range 200 {
		s := mustCompile(t, randomDocument(r))
		require.NotNil(t, s.index)
		for range 50 {
			req := randomRequest(r)
			want := s.matchScan(req, nil)
			got := s.Match(req, nil)
			require.Equal(t, want, got, "seed %d, request %+v, rules %v", seed, *req, s.Rules())
			requests++
			matched += len(got)
		}
	}
	// The generator must produce requests that match, or the test proves nothing.
	require.Greater(t, matched, requests/2, "matches per request too low to compare anything")
}

func TestIndexCandidates(t *testing.T) {
	doc := &Document{Version: SchemaVersion}
	add := func(id string, hosts, prefixes, methods []string) {
		rule := validRule(id)
		rule.Match = MatchSpec{Hosts: hosts, PathPrefix: prefixes, Methods: methods}
		doc.Rules = append(doc.Rules, rule)
	}
	add("any", nil, nil, nil)
	add("exact", []string{"a.example.com", "b.example.com"}, []string{"/api"}, nil)
	add("wild", []string{"*.example.com", "*.a.example.com"}, nil, nil)
	add("path", nil, []string{"/api", "/api/v1"}, nil)
	add("root", nil, []string{"/"}, []string{"POST"})
	add("post", nil, nil, []string{"POST"})
	s := mustCompile(t, doc)
	ids := func(c []int32) []string {
		out := []string{}
		for _, i := range c {
			out = append(out, s.rules[i].ID)
		}
		return out
	}
	for _, tc := range []struct {
		host, path, method string
		want               []string
	}{
		{"a.example.com", "/", "GET", []string{"any", "exact", "wild"}},
		{"x.a.example.com", "/api/v1/x", "GET", []string{"any", "wild", "path"}}, // wild once, though two suffixes hit
		{"example.com", "/api", "POST", []string{"any", "path", "root", "post"}},
		{"other.org", "/apix", "PUT", []string{"any"}},
	} {
		t.Run(tc.host+tc.path+tc.method, func(t *testing.T) {
			require.Equal(t, tc.want, ids(s.index.candidates(tc.host, tc.path, tc.method, nil)))
		})
	}
}

// The CDN example: platform rules for every request, then one rule per
// customer host; its region document overrides one customer and switches
// another off.
func TestExampleCDNRules(t *testing.T) {
	read := func(name string) *Document {
		data, err := os.ReadFile("../../examples/" + name)
		require.NoError(t, err)
		return mustParse(t, string(data))
	}
	global, overlay := read("rules-cdn.yaml"), read("rules-cdn-region.yaml")
	merged, err := Merge(global, overlay)
	require.NoError(t, err)
	ids := func(s *Snapshot, host, method, path string) map[string]int64 {
		out := map[string]int64{}
		req := &Request{Host: host, Method: method, Path: path, ClientIP: netip.MustParseAddr("203.0.113.7")}
		for _, m := range s.Match(req, nil) {
			out[m.Rule.ID] = m.Rule.Limit
		}
		return out
	}
	g, r := mustCompile(t, global), mustCompile(t, merged)
	require.Equal(t, map[string]int64{"platform-per-ip": 6000, "cust-000002": 600}, ids(g, "www.shop-two.example", "GET", "/"))
	require.Equal(t, map[string]int64{"platform-per-ip": 6000, "cust-000002": 3000}, ids(r, "www.shop-two.example", "GET", "/"))
	require.Equal(t, map[string]int64{"platform-per-ip": 6000, "platform-login": 10, "cust-000004": 1200}, ids(r, "shop.four.example", "POST", "/login"))
	require.Contains(t, ids(g, "www.five.example", "GET", "/"), "cust-000005")
	require.NotContains(t, ids(r, "www.five.example", "GET", "/"), "cust-000005")
	require.Equal(t, map[string]int64{"platform-per-ip": 6000}, ids(r, "api.three.example", "GET", "/v2"), "cust-000003 covers /v1 only")
}
