package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func keyHash(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}

func TestEscapesParseRoundTrip(t *testing.T) {
	src := `version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_window
    limit: 10
    window: 1m
    bypass:
      cidrs: [10.0.0.0/8, 192.0.2.7]
      hosts: ["*.internal.example.com"]
      path_prefix: [/healthz]
      api_key_header: x-api-key
      api_key_sha256: [` + strings.ToUpper(keyHash("partner-key")) + `]
    overrides:
      - key: [198.51.100.9]
        limit: 1000
    limit_header: x-edge-limit
    penalty: 10m
`
	doc := mustParse(t, src)
	require.NoError(t, doc.Validate())
	r := doc.Rules[0]
	require.Equal(t, []string{"10.0.0.0/8", "192.0.2.7/32"}, r.Bypass.CIDRs)
	require.Equal(t, "X-Api-Key", r.Bypass.APIKeyHeader)
	require.Equal(t, []string{keyHash("partner-key")}, r.Bypass.APIKeySHA256, "hashes are lower-cased")
	require.Equal(t, "X-Edge-Limit", r.LimitHeader)
	out, err := Marshal(doc)
	require.NoError(t, err)
	back := mustParse(t, string(out))
	require.NoError(t, back.Validate())
	require.Equal(t, doc, back)
	require.Equal(t, Version(doc), Version(back))

	plain := mustParse(t, src)
	plain.Rules[0].Penalty = 0
	require.NotEqual(t, Version(doc), Version(plain), "a penalty changes the version")
}

// TestEscapesErrors: every mistake is reported, at its line, worded for
// the operator; a plaintext key is refused.
func TestEscapesErrors(t *testing.T) {
	src := `version: 1
rules:
  - id: r
    key: [ip, header:X-User]
    algorithm: token_bucket
    limit: 10
    window: 1s
    shadow: true
    penalty: 90s
    bypass:
      cidr: [10.0.0.0/8]
      api_key_sha256: [my-secret-key]
    overrides:
      - key: [192.0.2.1]
        limit: 5
      - key: [not-an-ip, alice]
        limit: 5
      - key: [192.0.2.2, bob]
        limit: 0
      - key: ["::ffff:192.0.2.2", bob]
        limit: 7
`
	_, err := Parse([]byte(src))
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{
		`line 11: rule "r": bypass.cidr: unknown field (did you mean cidrs?)`,
		`line 12: rule "r": bypass.api_key_sha256[0]: want the key's SHA-256 as 64 hex digits, never the key itself`,
		`line 12: rule "r": bypass.api_key_sha256: needs api_key_header`,
		`line 14: rule "r": overrides[0].key: want 2 value(s)`,
		`line 16: rule "r": overrides[1].key[0]: "not-an-ip": want an IP address`,
		`line 19: rule "r": overrides[2].limit: must be > 0`,
		`line 20: rule "r": overrides[3].key: duplicate (same as overrides[2] after normalization)`,
		`line 9: rule "r": penalty: a shadow rule never denies`,
	} {
		require.Contains(t, msg, want)
	}
	require.NotContains(t, msg, "my-secret-key", "a key written by mistake is not echoed")
}

func TestBypassMatch(t *testing.T) {
	doc := mustParse(t, `version: 1
rules:
  - id: r
    key: [ip]
    algorithm: fixed_window
    limit: 1
    window: 1m
    bypass:
      cidrs: [10.1.0.0/16, "2001:db8::/32"]
      hosts: [status.example.com, "*.int.example.com"]
      path_prefix: [/healthz]
      api_key_header: X-Api-Key
      api_key_sha256: [`+keyHash("partner")+`]
`)
	s := mustCompile(t, doc)
	hdr := func(v string) func(string) (string, bool) {
		return func(name string) (string, bool) { return v, v != "" && name == "X-Api-Key" }
	}
	for _, tc := range []struct {
		name   string
		req    Request
		bypass bool
	}{
		{"cidr", Request{Host: "a.com", Path: "/", ClientIP: netip.MustParseAddr("10.1.200.3")}, true},
		{"mapped v4 in cidr", Request{Host: "a.com", Path: "/", ClientIP: netip.MustParseAddr("::ffff:10.1.0.1")}, true},
		{"v6 cidr", Request{Host: "a.com", Path: "/", ClientIP: netip.MustParseAddr("2001:db8::1")}, true},
		{"outside", Request{Host: "a.com", Path: "/", ClientIP: netip.MustParseAddr("10.2.0.1")}, false},
		{"exact host", Request{Host: "status.example.com", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1")}, true},
		{"wildcard host", Request{Host: "x.int.example.com", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1")}, true},
		{"wildcard not apex", Request{Host: "int.example.com", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1")}, false},
		{"path", Request{Host: "a.com", Path: "/healthz/db", ClientIP: netip.MustParseAddr("192.0.2.1")}, true},
		{"path boundary", Request{Host: "a.com", Path: "/healthzz", ClientIP: netip.MustParseAddr("192.0.2.1")}, false},
		{"api key", Request{Host: "a.com", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1"), Header: hdr("partner")}, true},
		{"the hash itself is no key", Request{Host: "a.com", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1"), Header: hdr(keyHash("partner"))}, false},
		{"other key", Request{Host: "a.com", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1"), Header: hdr("partner2")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := s.Match(&tc.req, nil)
			require.Len(t, ms, 1)
			require.Equal(t, tc.bypass, ms[0].Bypass)
			require.Equal(t, tc.bypass, ms[0].Key == "", "a bypassed match has no key, a counted one has")
		})
	}
}

func TestOverridesMatch(t *testing.T) {
	src := `version: 1
rules:
  - id: r
    key: [ip, header:X-User, method]
    algorithm: token_bucket
    limit: 10
    window: 1s
    overrides:
      - key: [192.0.2.1, alice, get]
        limit: 100
      - key: ["2001:db8::1", bob, POST]
        limit: 50
        burst: 80
`
	for _, salt := range []string{"", "s3cret"} {
		s := mustCompile(t, mustParse(t, src), WithKeySalt([]byte(salt)))
		user := func(u string) func(string) (string, bool) {
			return func(name string) (string, bool) { return u, name == "X-User" }
		}
		m := s.Match(&Request{Host: "a", Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1"), Header: user("alice")}, nil)
		require.Len(t, m, 1)
		require.Equal(t, int64(100), m[0].Limit)
		require.Equal(t, int64(100), m[0].Burst, "burst 0 is the override's limit")
		// IPv6 keys are per /64, as the descriptor counts them.
		m = s.Match(&Request{Host: "a", Method: "POST", Path: "/", ClientIP: netip.MustParseAddr("2001:db8::ffff"), Header: user("bob")}, nil)
		require.Equal(t, [2]int64{50, 80}, [2]int64{m[0].Limit, m[0].Burst})
		m = s.Match(&Request{Host: "a", Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1"), Header: user("bob")}, nil)
		require.Zero(t, m[0].Limit, "no override: the rule's own limit")
	}
}

// overridesDoc is a rule with n overrides of its ip key.
func overridesDoc(n int) *Document {
	r := validRule("big")
	r.Overrides = make(Overrides, n)
	for i := range n {
		r.Overrides[i] = Override{Key: []string{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()}, Limit: int64(1 + i%1000)}
	}
	return &Document{Version: SchemaVersion, Rules: []Rule{r}}
}

func TestOverrides100k(t *testing.T) {
	s := mustCompile(t, overridesDoc(100_000))
	for _, i := range []int{0, 54_321, 99_999} {
		ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		m := s.Match(&Request{Host: "a", Method: "GET", Path: "/", ClientIP: ip}, nil)
		require.Equal(t, int64(1+i%1000), m[0].Limit, "override of %s", ip)
	}
	m := s.Match(&Request{Host: "a", Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("10.200.0.1")}, nil)
	require.Zero(t, m[0].Limit)
}

// BenchmarkOverrideLookup: matching a request costs the same whether its
// rule has 10 or 100,000 overrides (one map lookup on the key it makes
// anyway).
func BenchmarkOverrideLookup(b *testing.B) {
	for _, n := range []int{0, 10, 1000, 100_000} {
		s := mustCompile(b, overridesDoc(n))
		reqs := make([]Request, 256)
		for i := range reqs {
			reqs[i] = Request{Host: "a", Method: "GET", Path: "/", ClientIP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i * 7)})}
		}
		b.Run("overrides="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]Match, 0, 1)
			i := 0
			for b.Loop() {
				dst = s.Match(&reqs[i&255], dst[:0])
				i++
			}
		})
	}
}

func ExampleOverrides_String() {
	fmt.Println(Overrides{{Key: []string{"192.0.2.1", "alice"}, Limit: 100}, {Key: []string{"192.0.2.2", "bob"}, Limit: 5, Burst: 9}})
	// Output: [["192.0.2.1" "alice"]=100; ["192.0.2.2" "bob"]=5/9]
}

// TestOverridesDiffer: "rules diff" tells two long lists apart by their
// printed value, and not two orders of one list.
func TestOverridesDiffer(t *testing.T) {
	a, b := overridesDoc(1000).Rules[0], overridesDoc(1000).Rules[0]
	require.Equal(t, FieldValue(a, "overrides"), FieldValue(b, "overrides"))
	b.Overrides[500].Limit++
	require.NotEqual(t, FieldValue(a, "overrides"), FieldValue(b, "overrides"))
	b.Overrides[500].Limit--
	b.Overrides[0], b.Overrides[999] = b.Overrides[999], b.Overrides[0]
	require.Equal(t, FieldValue(a, "overrides"), FieldValue(b, "overrides"))
	require.Contains(t, FieldNames(), "bypass.cidrs")
	require.Contains(t, FieldNames(), "count_if.status")
}

func TestResponseCost(t *testing.T) {
	doc := mustParse(t, `version: 1
rules:
  - id: stuffing
    key: [ip]
    algorithm: sliding_window
    limit: 5
    window: 1m
    count_if: {status: [401, 403, 5XX], header: x-count-me}
  - id: complexity
    key: [ip]
    algorithm: token_bucket
    limit: 100
    window: 1s
    cost_header: x-cost
    max_cost: 50
  - id: plain
    key: [ip]
    algorithm: fixed_window
    limit: 5
    window: 1m
`)
	s := mustCompile(t, doc)
	rs := map[string]*CompiledRule{}
	for _, m := range s.Match(&Request{Host: "a", Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1")}, nil) {
		rs[m.Rule.ID] = m.Rule
	}
	require.True(t, rs["stuffing"].AfterResponse())
	require.True(t, rs["complexity"].AfterResponse())
	require.False(t, rs["plain"].AfterResponse())
	hdr := func(kv ...string) func(string) (string, bool) {
		return func(name string) (string, bool) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == name {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	for _, tc := range []struct {
		rule    string
		status  int
		header  func(string) (string, bool)
		cost    int64
		problem CostProblem
	}{
		{"stuffing", 200, hdr(), 0, CostOK},
		{"stuffing", 401, hdr(), 1, CostOK},
		{"stuffing", 403, hdr(), 1, CostOK},
		{"stuffing", 404, hdr(), 0, CostOK},
		{"stuffing", 503, hdr(), 1, CostOK},
		{"stuffing", 200, hdr("X-Count-Me", ""), 1, CostOK},
		{"complexity", 200, hdr(), 1, CostOK},
		{"complexity", 200, hdr("X-Cost", "7"), 7, CostOK},
		{"complexity", 200, hdr("X-Cost", "0"), 0, CostOK},
		{"complexity", 200, hdr("X-Cost", "51"), 50, CostTooLarge},
		{"complexity", 200, hdr("X-Cost", "99999999999999999999999"), 50, CostTooLarge},
		{"complexity", 200, hdr("X-Cost", "-3"), 1, CostInvalid},
		{"complexity", 200, hdr("X-Cost", "NaN"), 1, CostInvalid},
		{"complexity", 200, hdr("X-Cost", "2.5"), 1, CostInvalid},
	} {
		cost, problem := rs[tc.rule].ResponseCost(tc.status, tc.header)
		require.Equal(t, tc.cost, cost, "%s %d", tc.rule, tc.status)
		require.Equal(t, tc.problem, problem, "%s %d", tc.rule, tc.status)
	}

	_, err := Parse([]byte(`version: 1
rules:
  - id: bad
    key: [ip]
    algorithm: concurrency
    limit: 5
    window: 1m
    count_if: {status: [200, 6xx, abc]}
    max_cost: 9
`))
	require.Error(t, err)
	for _, want := range []string{
		`line 8: rule "bad": count_if.status[1]: "6xx": want a status code`,
		`line 8: rule "bad": count_if.status[2]: "abc"`,
		`rule "bad": count_if: a concurrency rule holds a slot`,
		`line 9: rule "bad": max_cost: only with cost_header`,
	} {
		require.Contains(t, err.Error(), want)
	}
}

// BenchmarkVersionOverrides: the version of a rule with many overrides
// sorts them once, quoting each key once (every push and every edge's load
// computes it).
func BenchmarkVersionOverrides(b *testing.B) {
	for _, n := range []int{1000, 100_000} {
		d := overridesDoc(n)
		b.Run("overrides="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Version(d)
			}
		})
	}
}
