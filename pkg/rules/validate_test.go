package rules

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

func TestValidateRuleErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(r *Rule)
		want   string // the full message of the one expected error
	}{
		{"id missing", func(r *Rule) { r.ID = "" }, `rules[0]: id: required`},
		{"id with colon", func(r *Rule) { r.ID = "a:b" }, `rule "a:b": id: invalid "a:b"`},
		{"id with brace", func(r *Rule) { r.ID = "a{b}" }, `rule "a{b}": id: invalid`},
		{"id with space", func(r *Rule) { r.ID = "a b" }, `rule "a b": id: invalid`},
		{"id too long", func(r *Rule) { r.ID = strings.Repeat("a", 65) }, `rule "` + strings.Repeat("a", 65) + `": id: invalid`},
		{"algorithm missing", func(r *Rule) { r.Algorithm = "" }, `rule "r": algorithm: required (one of concurrency, fixed_window, leaky_bucket, sliding_log, sliding_window, token_bucket)`},
		{"algorithm unknown", func(r *Rule) { r.Algorithm = "sliding_door" }, `rule "r": algorithm: unknown "sliding_door"`},
		{"limit zero", func(r *Rule) { r.Limit = 0 }, `rule "r": limit: must be > 0 (got 0)`},
		{"limit negative", func(r *Rule) { r.Limit = -5 }, `rule "r": limit: must be > 0 (got -5)`},
		{"limit too big", func(r *Rule) { r.Algorithm = "fixed_window"; r.Limit = limit.MaxLimit + 1 }, `rule "r": limit: must be <= 1000000000 for fixed_window (got 1000000001)`},
		{"sliding log too big for Redis", func(r *Rule) { r.Limit = limit.MaxMembers + 1 }, `rule "r": limit: must be <= 100000 for sliding_log (got 100001): the log keeps one Redis member per admitted request`},
		{"concurrency too big for Redis", func(r *Rule) { r.Algorithm = "concurrency"; r.Limit = limit.MaxMembers + 1 }, `rule "r": limit: must be <= 100000 for concurrency`},
		{"sliding window overflows 2^53", func(r *Rule) {
			r.Algorithm = "sliding_window"
			r.Limit = 200_000_000
			r.Window = Duration(24 * time.Hour)
		}, `rule "r": limit: limit × window in ms must stay below 2^53 for sliding_window (got 200000000 × 86400000)`},
		{"token bucket below 1µs per unit", func(r *Rule) { r.Algorithm = "token_bucket"; r.Limit = 2000; r.Window = Duration(time.Millisecond) }, `rule "r": limit: must be <= one per µs of window for token_bucket (got 2000 per 1ms)`},
		{"window not whole ms", func(r *Rule) { r.Window = Duration(1500 * time.Microsecond) }, `rule "r": window: must be whole milliseconds (got 1.5ms)`},
		{"window zero", func(r *Rule) { r.Window = 0 }, `rule "r": window: must be >= 1ms for sliding_log (got 0s)`},
		{"window negative", func(r *Rule) { r.Window = Duration(-time.Second) }, `rule "r": window: must be >= 1ms for sliding_log (got -1s)`},
		{"window too long", func(r *Rule) { r.Window = Duration(25 * time.Hour) }, `rule "r": window: must be <= 24h0m0s (got 25h0m0s)`},
		{"window too short", func(r *Rule) { r.Window = Duration(time.Microsecond) }, `rule "r": window: must be >= 1ms for sliding_log (got 1µs)`},
		{"concurrency ttl too short", func(r *Rule) { r.Algorithm = "concurrency"; r.Window = Duration(500 * time.Millisecond) }, `rule "r": window: must be >= 1s for concurrency`},
		{"burst negative", func(r *Rule) { r.Algorithm = "token_bucket"; r.Burst = -1 }, `rule "r": burst: must be >= 0 (got -1)`},
		{"burst too big", func(r *Rule) { r.Algorithm = "token_bucket"; r.Burst = limit.MaxLimit + 1 }, `rule "r": burst: must be <= 1000000000`},
		{"burst on sliding_log", func(r *Rule) { r.Burst = 10 }, `rule "r": burst: only valid for leaky_bucket, token_bucket (algorithm is sliding_log)`},
		{"burst on fixed_window", func(r *Rule) { r.Algorithm = "fixed_window"; r.Burst = 10 }, `rule "r": burst: only valid for leaky_bucket, token_bucket (algorithm is fixed_window)`},
		{"cost zero", func(r *Rule) { r.Cost = 0 }, `rule "r": cost: must be >= 1 (got 0)`},
		{"cost negative", func(r *Rule) { r.Cost = -2 }, `rule "r": cost: must be >= 1 (got -2)`},
		{"cost above limit", func(r *Rule) { r.Cost = 101 }, `rule "r": cost: must be <= capacity 100 (got 101)`},
		{"cost above burst", func(r *Rule) { r.Algorithm = "token_bucket"; r.Burst = 5; r.Cost = 6 }, `rule "r": cost: must be <= capacity 5 (got 6)`},
		{"min_interval negative", func(r *Rule) { r.MinInterval = Duration(-time.Second) }, `rule "r": min_interval: must be >= 0 (got -1s)`},
		{"min_interval on token_bucket", func(r *Rule) { r.Algorithm = "token_bucket"; r.MinInterval = Duration(time.Second) }, `rule "r": min_interval: only valid for sliding_log (algorithm is token_bucket)`},
		{"min_interval equals window", func(r *Rule) { r.MinInterval = r.Window }, `rule "r": min_interval: must be < window 1m0s (got 1m0s)`},
		{"key missing", func(r *Rule) { r.Key = nil }, `rule "r": key: required: at least one of ip, host, method, path, header:<Name>, query:<name>`},
		{"key unknown", func(r *Rule) { r.Key = []string{"ip", "cookie:sid"} }, `rule "r": key[1]: unknown descriptor "cookie:sid"`},
		{"key wrong case", func(r *Rule) { r.Key = []string{"IP"} }, `rule "r": key[0]: unknown descriptor "IP"`},
		{"key header empty name", func(r *Rule) { r.Key = []string{"header:"} }, `rule "r": key[0]: "header:": header name must be a non-empty HTTP token`},
		{"key header bad name", func(r *Rule) { r.Key = []string{"header:X API"} }, `rule "r": key[0]: "header:X API": header name`},
		{"key query empty", func(r *Rule) { r.Key = []string{"query:"} }, `rule "r": key[0]: "query:": query parameter name must be non-empty`},
		{"key duplicate", func(r *Rule) { r.Key = []string{"ip", "ip"} }, `rule "r": key[1]: duplicate "ip" (same as key[0])`},
		{"key duplicate header case", func(r *Rule) { r.Key = []string{"header:x-api-key", "header:X-API-KEY"} }, `rule "r": key[1]: duplicate "header:X-Api-Key"`},
		{"host empty", func(r *Rule) { r.Match.Hosts = []string{""} }, `rule "r": match.hosts[0]: "": empty host name`},
		{"host with port", func(r *Rule) { r.Match.Hosts = []string{"example.com:443"} }, `rule "r": match.hosts[0]: "example.com:443": must not contain a port`},
		{"host inner wildcard", func(r *Rule) { r.Match.Hosts = []string{"api.*.example.com"} }, `rule "r": match.hosts[0]: "api.*.example.com": a wildcard is only allowed as a leading "*."`},
		{"host bare wildcard", func(r *Rule) { r.Match.Hosts = []string{"*"} }, `rule "r": match.hosts[0]: "*": a wildcard is only allowed`},
		{"host bad char", func(r *Rule) { r.Match.Hosts = []string{"exa mple.com"} }, `rule "r": match.hosts[0]: "exa mple.com": invalid character ' '`},
		{"host empty label", func(r *Rule) { r.Match.Hosts = []string{"a..b"} }, `rule "r": match.hosts[0]: "a..b": labels must be 1-63 characters`},
		{"host wildcard ip", func(r *Rule) { r.Match.Hosts = []string{"*.10.0.0.1"} }, `rule "r": match.hosts[0]: "*.10.0.0.1": a wildcard cannot apply to an IP address`},
		{"host duplicate after lowercasing", func(r *Rule) { r.Match.Hosts = []string{"a.com", "A.COM"} }, `rule "r": match.hosts[1]: duplicate "a.com"`},
		{"prefix without slash", func(r *Rule) { r.Match.PathPrefix = []string{"api"} }, `rule "r": match.path_prefix[0]: "api" must start with /`},
		{"prefix with query", func(r *Rule) { r.Match.PathPrefix = []string{"/api?x=1"} }, `rule "r": match.path_prefix[0]: "/api?x=1" must not contain a query`},
		{"prefix ambiguous escape", func(r *Rule) { r.Match.PathPrefix = []string{"/a%252Fb"} }, `rule "r": match.path_prefix[0]: "/a%252Fb" is ambiguous`},
		{"prefix duplicate after normalization", func(r *Rule) { r.Match.PathPrefix = []string{"/admin", "//admin/"} }, `rule "r": match.path_prefix[1]: duplicate "/admin"`},
		{"method bad token", func(r *Rule) { r.Match.Methods = []string{"GE T"} }, `rule "r": match.methods[0]: "GE T" is not a valid HTTP method token`},
		{"method empty", func(r *Rule) { r.Match.Methods = []string{""} }, `rule "r": match.methods[0]: "" is not a valid HTTP method token`},
		{"method duplicate", func(r *Rule) { r.Match.Methods = []string{"get", "GET"} }, `rule "r": match.methods[1]: duplicate "GET"`},
		{"scope unknown", func(r *Rule) { r.Scope = "world" }, `rule "r": scope: unknown "world" (want region, pop or global)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := validRule("r")
			tc.mutate(&r)
			err := (&Document{Version: 1, Rules: []Rule{r}}).Validate()
			require.Error(t, err)
			errs := err.(interface{ Unwrap() []error }).Unwrap()
			require.Len(t, errs, 1, "exactly one problem expected, got:\n%v", err)
			require.True(t, strings.HasPrefix(errs[0].Error(), tc.want), "got  %q\nwant prefix %q", errs[0].Error(), tc.want)
			var fe *FieldError
			require.True(t, errors.As(err, &fe))
		})
	}
}

func TestValidateAcceptsEdgeCases(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(r *Rule)
	}{
		{"burst below limit", func(r *Rule) { r.Algorithm = "token_bucket"; r.Burst = 5 }},
		{"burst above limit", func(r *Rule) { r.Algorithm = "token_bucket"; r.Burst = 500 }},
		{"cost equals limit", func(r *Rule) { r.Cost = 100 }},
		{"cost up to burst", func(r *Rule) { r.Algorithm = "token_bucket"; r.Burst = 500; r.Cost = 500 }},
		{"min_interval below window", func(r *Rule) { r.MinInterval = Duration(time.Second) }},
		{"window 24h", func(r *Rule) { r.Window = Duration(24 * time.Hour) }},
		{"window 1ms", func(r *Rule) { r.Window = Duration(time.Millisecond) }},
		{"concurrency 1s", func(r *Rule) { r.Algorithm = "concurrency"; r.Window = Duration(time.Second) }},
		{"limit max", func(r *Rule) { r.Algorithm = "fixed_window"; r.Limit = limit.MaxLimit }},
		{"sliding log at its member cap", func(r *Rule) { r.Limit = limit.MaxMembers }},
		{"leaky bucket with burst", func(r *Rule) { r.Algorithm = "leaky_bucket"; r.Burst = 500; r.Cost = 500 }},
		{"id charset", func(r *Rule) { r.ID = "A-z_0.9" }},
		{"id 64 chars", func(r *Rule) { r.ID = strings.Repeat("x", 64) }},
		{"composite key", func(r *Rule) {
			r.Key = []string{"ip", "host", "method", "path", "header:Authorization", "query:api_key"}
		}},
		{"ip hosts", func(r *Rule) { r.Match.Hosts = []string{"10.0.0.1", "[2001:db8::1]", "::1"} }},
		{"wildcard host", func(r *Rule) { r.Match.Hosts = []string{"*.example.com", "example.com"} }},
		{"custom method", func(r *Rule) { r.Match.Methods = []string{"PURGE", "propfind"} }},
		{"literal percent prefix", func(r *Rule) { r.Match.PathPrefix = []string{"/100%"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := validRule("r")
			tc.mutate(&r)
			require.NoError(t, (&Document{Version: 1, Rules: []Rule{r}}).Validate())
		})
	}
}

func TestValidateNormalizes(t *testing.T) {
	r := validRule("r")
	r.Match = MatchSpec{
		Hosts:      []string{"WWW.Example.COM.", "*.Example.com", "[2001:DB8::1]"},
		PathPrefix: []string{"/b//c/", "/%61dmin", "/x/../a"},
		Methods:    []string{"post", "Get"},
	}
	r.Key = []string{"header:x-api-key", "ip"}
	doc := &Document{Version: 1, Rules: []Rule{r}}
	require.NoError(t, doc.Validate())

	got := doc.Rules[0]
	require.Equal(t, []string{"*.example.com", "2001:db8::1", "www.example.com"}, got.Match.Hosts)
	require.Equal(t, []string{"/a", "/admin", "/b/c"}, got.Match.PathPrefix)
	require.Equal(t, []string{"GET", "POST"}, got.Match.Methods)
	require.Equal(t, []string{"header:X-Api-Key", "ip"}, got.Key, "key order is kept")
	require.Equal(t, ScopeRegion, got.Scope)

	before := doc.clone()
	require.NoError(t, doc.Validate(), "validating twice is fine")
	require.Equal(t, before, doc, "and changes nothing")
}

func TestValidateReportsEverything(t *testing.T) {
	bad := validRule("bad")
	bad.Limit = 0
	bad.Window = 0
	bad.Key = []string{"nope"}
	bad.Match.Methods = []string{"G T"}
	noID := validRule("")
	dupA, dupB := validRule("dup"), validRule("dup")
	doc := &Document{Version: 3, Rules: []Rule{bad, noID, dupA, dupB}}

	err := doc.Validate()
	require.Error(t, err)
	for _, want := range []string{
		"version: unsupported 3 (want 1)",
		`rule "bad": limit: must be > 0`,
		`rule "bad": window: must be >= 1ms for sliding_log`,
		`rule "bad": key[0]: unknown descriptor "nope"`,
		`rule "bad": match.methods[0]:`,
		"rules[1]: id: required",
		`rule "dup": id: duplicate (also rules[2])`,
	} {
		require.ErrorContains(t, err, want)
	}
	require.Len(t, err.(interface{ Unwrap() []error }).Unwrap(), 7)
}

func TestValidateDisabledRuleNeedsOnlyID(t *testing.T) {
	doc := &Document{Version: 1, Rules: []Rule{{ID: "gone", Disabled: true}}}
	require.NoError(t, doc.Validate())

	doc = &Document{Version: 1, Rules: []Rule{{ID: "bad id", Disabled: true}}}
	require.ErrorContains(t, doc.Validate(), `rule "bad id": id: invalid`)
}

func TestValidateNil(t *testing.T) {
	var d *Document
	require.Error(t, d.Validate())
}

func TestValidateEmptyRuleList(t *testing.T) {
	require.NoError(t, (&Document{Version: 1}).Validate())
}

// A large document validated in pieces gives what one piece gives: the
// same problems in the same order (duplicate ids included), the same
// normalized rules.
func TestValidateInPiecesLikeWhole(t *testing.T) {
	defer func(was int) { parallelValidate = was }(parallelValidate)
	parallelValidate = 16
	prev := runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	defer runtime.GOMAXPROCS(prev)
	var b strings.Builder
	b.WriteString("version: 1\nrules:\n")
	for i := range 300 {
		switch i % 37 {
		case 5:
			fmt.Fprintf(&b, "  - {id: dup, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n")
		case 11:
			fmt.Fprintf(&b, "  - {id: r%d, key: [cookie], algorithm: fixed_window, limit: 0, window: 1s}\n", i)
		default:
			fmt.Fprintf(&b, "  - {id: r%d, match: {hosts: [Site%d.Example.com], methods: [get]}, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", i, i)
		}
	}
	root, err := parseTree([]byte(b.String()))
	require.NoError(t, err)
	whole, errs := decodeDocument(root, b.Len())
	require.Empty(t, errs)
	pieces := whole.clone()
	wantErr := whole.validate(false)
	gotErr := pieces.validate(true)
	require.Error(t, wantErr)
	require.Equal(t, wantErr.Error(), gotErr.Error())
	require.Contains(t, gotErr.Error(), `rule "dup": id: duplicate (also rules[5])`)
	require.Equal(t, whole, pieces)
}
